import type net from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { redactMessage } from '../capture/recorder.js';
import { structuralRequest } from '../trace/structural.js';
import { localResponseBytes, type RequestHandler } from '../proxy/connection.js';
import { forwardRequestHead } from '../proxy/head.js';
import { headerValue, type RequestHead } from '../proxy/http1.js';
import type { Origin, Route, StoredExchange } from '../trace/schema.js';
import type { ReplayPlayer } from './player.js';

export interface ReplayRequest {
  origin: Origin;
  route: Route;
  head: RequestHead;
  target: string;
  requestLine?: string;
  replace?: Map<string, string>;
}

function isStreamingRequest(head: RequestHead, body: Buffer): boolean {
  if (/text\/event-stream/i.test(headerValue(head, 'accept') ?? '')) return true;
  return /"stream"\s*:\s*true/.test(body.subarray(0, 64 * 1024).toString('latin1'));
}

/** A refusal in the provider's own error shape, so SDKs surface the reason; `x-should-retry: false` stops their retries. */
export function refusalBytes(origin: Origin, head: RequestHead, body: Buffer, reason: string, code: string): Buffer {
  const anthropic = /(^|\.)anthropic\.com$/.test(origin.host);
  const error = anthropic
    ? { type: 'error', error: { type: 'mitm_replay_refused', message: reason } }
    : { error: { message: reason, type: 'mitm_replay_refused', param: null, code } };
  const headers = { 'x-should-retry': 'false', 'x-mitm-replay-error': code };
  if (isStreamingRequest(head, body)) {
    return localResponseBytes({ status: 502, headers: { ...headers, 'content-type': 'text/event-stream' }, body: `event: error\ndata: ${JSON.stringify(error)}\n\n` });
  }
  return localResponseBytes({ status: 502, headers: { ...headers, 'content-type': 'application/json' }, body: `${JSON.stringify(error)}\n` });
}

/** The recorded head with one header added before the blank line (used to label diagnostic answers). */
function withHeader(head: Buffer, name: string, value: string): Buffer {
  return Buffer.concat([head.subarray(0, head.length - 2), Buffer.from(`${name}: ${value}\r\n\r\n`, 'latin1')]);
}

interface WriteGroup {
  /** recorded offset (ms from the request start) */
  offset: number | undefined;
  bytes: Buffer;
}

/**
 * A recorded response as writes: pieces recorded in the same upstream read (same offset) leave together, as
 * they arrived. Null when the recording has no response (it failed before one).
 */
function writeGroups(exchange: StoredExchange, divergenceId: string | null): WriteGroup[] | null {
  const { record } = exchange;
  if (!record.response || exchange.responseHead.length === 0) return null;
  const head = divergenceId ? withHeader(exchange.responseHead, 'x-mitm-replay-divergence', divergenceId) : exchange.responseHead;
  const groups: { offset: number | undefined; parts: Buffer[] }[] = [{ offset: record.timings.responseHeadMs, parts: [head] }];
  let pos = 0;
  for (const [offset, length] of record.response.chunks) {
    const part = exchange.responseBody.subarray(pos, pos + length);
    pos += length;
    if (groups.at(-1)!.offset === offset) groups.at(-1)!.parts.push(part);
    else groups.push({ offset, parts: [part] });
  }
  if (pos < exchange.responseBody.length) groups.at(-1)!.parts.push(exchange.responseBody.subarray(pos));
  return groups.map((g) => ({ offset: g.offset, bytes: g.parts.length === 1 ? g.parts[0]! : Buffer.concat(g.parts) }));
}

function closesAfter(head: Buffer): boolean {
  const text = head.toString('latin1').toLowerCase();
  if (/\r\nconnection:[^\r]*close/.test(text)) return true;
  const status = Number(text.slice(9, 12));
  const bodiless = status === 204 || status === 304 || (status >= 100 && status < 200);
  return !bodiless && !/\r\ncontent-length:/.test(text) && !/\r\ntransfer-encoding:[^\r]*chunked/.test(text);
}

/**
 * Answers one request from the trace: never dials upstream. Collects the request, puts it in its stored form
 * (hop-by-hop headers dropped, redacted with the trace's rules), lets the player decide, then serves the
 * recorded bytes chunk by chunk (paced when asked) or a refusal.
 */
export class ReplayHandler implements RequestHandler {
  private readonly wire: Buffer[] = [];
  private readonly payload: Buffer[] = [];
  private clientGoneFlag = false;

  constructor(
    private readonly client: net.Socket,
    private readonly player: ReplayPlayer,
    private readonly request: ReplayRequest,
  ) {}

  begin(): void {}

  body(wire: Buffer, payload: Buffer[]): void {
    this.wire.push(wire);
    this.payload.push(...payload);
  }

  clientGone(): void {
    this.clientGoneFlag = true;
  }

  end(): Promise<boolean> | boolean {
    const requestEnd = performance.now();
    const { head, target, origin, route } = this.request;
    const forwarded = forwardRequestHead(head, { requestLine: this.request.requestLine, replace: this.request.replace });
    const redacted = redactMessage(this.player.redactor, 'request', forwarded.raw, this.wire, this.payload, { parsed: head });
    // A structural trace holds shapes only: the replayed request is compared by its shape.
    const structural = this.player.structural;
    const stored = structural ? structuralRequest(redacted.head, redacted.body, structural) : redacted;
    const decision = this.player.decide({ origin, route, method: head.method, target, head: stored.head, body: stored.body });
    if (decision.kind === 'refuse') {
      const code = decision.outcome.outcome === 'missing' ? 'replay_missing' : 'replay_diverged';
      this.client.write(refusalBytes(origin, head, Buffer.concat(this.payload), decision.reason, code));
      return true;
    }
    const groups = writeGroups(decision.exchange, decision.divergenceId);
    const { record } = decision.exchange;
    // The common case: one complete recorded response, unpaced, that the socket takes without backpressure.
    if (groups && groups.length === 1 && this.player.options.pace === 'fast' && record.state === 'complete' && !this.clientGoneFlag && !this.client.destroyed) {
      if (this.client.write(groups[0]!.bytes)) return !closesAfter(decision.exchange.responseHead);
      return Promise.race([once(this.client, 'drain'), once(this.client, 'close')]).then(() => !closesAfter(decision.exchange.responseHead));
    }
    return this.serve(decision.exchange, groups, requestEnd);
  }

  private async write(bytes: Buffer): Promise<void> {
    if (this.clientGoneFlag || this.client.destroyed) return;
    if (!this.client.write(bytes)) await Promise.race([once(this.client, 'drain'), once(this.client, 'close')]);
  }

  /** Serves a recording as recorded: head, then each body chunk with its boundary (and gap, with --pace recorded). */
  private async serve(exchange: StoredExchange, groups: WriteGroup[] | null, requestEnd: number): Promise<boolean> {
    const { record } = exchange;
    const paced = this.player.options.pace === 'recorded';
    const recordedRequestEnd = record.timings.requestEndMs ?? 0;
    const waitUntil = async (offsetMs: number) => {
      if (!paced) return;
      const due = requestEnd + Math.max(0, offsetMs - recordedRequestEnd);
      const delay = due - performance.now();
      if (delay > 0) await sleep(delay);
    };
    if (!groups) {
      // The recording failed before any response (refused, TLS failure): fail the same way.
      const error = record.error ?? { code: 'no-response', message: 'the recording has no response' };
      await this.write(localResponseBytes({ status: error.code === 'ETIMEDOUT' ? 504 : 502, headers: { 'x-mitm-replay-error': error.code }, body: `mitm-replay: ${error.message}\n`, close: true }));
      return false;
    }
    for (const group of groups) {
      await waitUntil(group.offset ?? recordedRequestEnd);
      await this.write(group.bytes);
    }
    if (record.state !== 'complete' && record.error && record.error.phase === 'response') {
      // Recorded cut off mid-stream (an upstream reset): reset the replayed stream at the same byte, once the
      // bytes before it have left (destroy would discard what is still queued).
      await new Promise<void>((resolve) => this.client.write(Buffer.alloc(0), () => resolve()));
      this.client.destroy();
      return false;
    }
    return !closesAfter(exchange.responseHead);
  }
}
