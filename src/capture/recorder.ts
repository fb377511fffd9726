import { performance } from 'node:perf_hooks';
import type { Redactor } from './redact.js';
import { RequestParser, ResponseParser, headerValue, type MessageHead } from '../proxy/http1.js';
import { rewriteHeaders } from '../proxy/head.js';
import { requestHash } from '../replay/matcher.js';
import { DEFAULT_STRUCTURAL, structuralExchange, structuralRequest, type StructuralOptions } from '../trace/structural.js';
import type { TraceStore } from '../trace/store.js';
import type { ExchangeRecord, Firing, Origin, Route, StoredExchange, TraceMeta } from '../trace/schema.js';

/**
 * One trace being written: hands out sequence numbers in arrival order and keeps track of writes in flight,
 * so closing a trace waits for every exchange that already completed.
 */
export class TraceWriter {
  private seq: number;
  private readonly inFlight = new Set<Promise<unknown>>();
  private readonly open = new Set<ExchangeRecorder>();
  /** set when a store write failed: the trace is then not a complete recording */
  writeErrors = 0;

  constructor(
    readonly store: TraceStore,
    public meta: TraceMeta,
    nextSeq: number,
    readonly redactor: Redactor,
  ) {
    this.seq = nextSeq;
  }

  get name(): string {
    return this.meta.name;
  }

  nextSeq(): number {
    return this.seq++;
  }

  track(write: Promise<unknown>): void {
    const tracked = write.catch(() => {
      this.writeErrors++;
    });
    this.inFlight.add(tracked);
    void tracked.finally(() => this.inFlight.delete(tracked));
  }

  register(recorder: ExchangeRecorder): void {
    this.open.add(recorder);
  }

  unregister(recorder: ExchangeRecorder): void {
    this.open.delete(recorder);
  }

  /** Marks exchanges still in progress as incomplete (daemon shutdown) and waits for all writes. */
  async flush(abortOpen: boolean): Promise<void> {
    if (abortOpen) for (const recorder of [...this.open]) recorder.fail('shutdown', 'the daemon shut down before the exchange completed', 'response');
    while (this.inFlight.size > 0) await Promise.all([...this.inFlight]);
  }

  async finish(patch: Partial<TraceMeta>): Promise<void> {
    await this.flush(true);
    // A trace some of whose exchanges could not be written never claims to be a complete recording.
    const broken = this.writeErrors > 0 ? { broken: { writeErrors: this.writeErrors } } : {};
    this.meta = { ...this.meta, ...patch, ...broken, finishedAt: Date.now() };
    await this.store.putTrace(this.meta);
  }
}

export interface ExchangeStart {
  origin: Origin;
  route: Route;
  method: string;
  /** origin-form target as forwarded */
  target: string;
  /** the head as forwarded to the origin (hop-by-hop removed), not yet redacted */
  forwardedHead: Buffer;
  droppedHeaders: string[];
  clientTarget?: string;
  /** the client's head as parsed (same framing and content headers as the forwarded one) */
  parsedHead?: MessageHead;
}

function parseStoredHead(raw: Buffer, kind: 'request' | 'response'): MessageHead {
  const parser = kind === 'request' ? new RequestParser() : new ResponseParser();
  if (kind === 'response') (parser as ResponseParser).expectResponseTo('GET');
  const event = parser.push(raw).find((e) => e.type === 'head');
  if (!event || event.type !== 'head') throw new Error('stored head does not parse');
  return event.head;
}

interface RedactedMessage {
  head: Buffer;
  body: Buffer;
  /** chunk lengths of the stored body, when the original boundaries could be kept */
  pieces: number[] | null;
  flags: string[];
  fired: Firing[];
}

/**
 * Applies the redaction rules to a complete message. Verbatim (wire bytes, framing included) wherever no rule
 * fires; otherwise the decoded, redacted payload is stored with a head whose framing headers describe it.
 */
export function redactMessage(
  redactor: Redactor,
  side: 'request' | 'response',
  rawHead: Buffer,
  wire: Buffer[],
  payload: Buffer[],
  /** the head as parsed already (framing and content headers are read from it), and its redaction if done */
  known: { parsed?: MessageHead; redacted?: { head: Buffer; fired: Firing[] } } = {},
): RedactedMessage {
  const headResult = known.redacted ?? redactor.redactHead(rawHead, side);
  const fired = [...headResult.fired];
  // Header rules never touch the framing and content headers, so the head as parsed answers for them.
  const framing = known.parsed ?? parseStoredHead(rawHead, side);
  const contentEncoding = headerValue(framing, 'content-encoding');
  const contentType = headerValue(framing, 'content-type');
  const whole = payload.length === 1 ? payload[0]! : Buffer.concat(payload);
  if (whole.length === 0) return { head: headResult.head, body: Buffer.concat(wire), pieces: wire.map((w) => w.length), flags: [], fired };
  const bodyResult = redactor.redactBody(whole, side, contentEncoding, contentType);
  if (bodyResult.fired.length === 0) {
    return { head: headResult.head, body: Buffer.concat(wire), pieces: wire.map((w) => w.length), flags: [], fired };
  }
  fired.push(...bodyResult.fired);
  const head = parseStoredHead(headResult.head, side);
  const flags: string[] = [];
  const remove: string[] = [];
  const chunked = /chunked/i.test(headerValue(head, 'transfer-encoding') ?? '');
  if (chunked) {
    remove.push('transfer-encoding');
    flags.push('reframed');
  }
  if (bodyResult.decoded) {
    remove.push('content-encoding');
    flags.push('decoded');
  }
  // Keep the original piece boundaries (stream timing) when each piece can be redacted on its own and
  // the result is the same as redacting the whole.
  let pieces: number[] | null = null;
  let body = bodyResult.body;
  if (!bodyResult.decoded && payload.length > 1) {
    const parts = payload.map((p) => redactor.redactBody(p, side, contentEncoding, contentType).body);
    const joined = Buffer.concat(parts);
    if (joined.equals(bodyResult.body)) {
      pieces = parts.map((p) => p.length);
      body = joined;
    }
  }
  const newHead = rewriteHeaders(head, { remove, set: [['content-length', String(body.length)]] });
  if (!flags.includes('reframed') && headerValue(head, 'content-length') !== String(body.length)) flags.push('length-rewritten');
  return { head: newHead, body, pieces: pieces ?? [body.length], flags, fired };
}

/** A structural trace stores only shapes: the exchange reduced, its match key recomputed on the reduced request. */
export function toStructural(exchange: StoredExchange, options: StructuralOptions): StoredExchange {
  const reduced = structuralExchange(exchange, options);
  if (reduced.record.request) {
    const { clientTarget: _dropped, ...request } = reduced.record.request;
    // No stored hash: replay recomputes it from the reduced bytes (it is 32 incompressible bytes per exchange
    // in a trace that is otherwise mostly filler).
    reduced.record.request = { ...request, target: targetOf(reduced.requestHead) };
  }
  return reduced;
}

/** The request target in a head's request line. */
function targetOf(head: Buffer): string {
  return head.toString('latin1', 0, head.indexOf('\r\n')).split(' ')[1] ?? '/';
}

/**
 * Tees one HTTP exchange into the trace. Raw bytes live here only until the exchange ends; they are
 * redacted before the store sees them. An `open` record (redacted head only) is written at the start, so an
 * exchange cut off by a crash is found and marked incomplete on the next start.
 */
export class ExchangeRecorder {
  readonly seq: number;
  private readonly t0 = performance.now();
  private readonly record: ExchangeRecord;
  private readonly requestWire: Buffer[] = [];
  private readonly requestPayload: Buffer[] = [];
  private responseHead: Buffer | null = null;
  private responseHeadParsed: MessageHead | undefined;
  /** the request head redacted once, when the exchange starts */
  private readonly redactedRequestHead: { head: Buffer; fired: Firing[] };
  private readonly responseWire: Buffer[] = [];
  private readonly responsePayload: Buffer[] = [];
  private readonly chunkOffsets: number[] = [];
  private done = false;

  constructor(
    private readonly writer: TraceWriter,
    private readonly start: ExchangeStart,
  ) {
    this.seq = writer.nextSeq();
    this.record = {
      seq: this.seq,
      kind: 'http',
      state: 'open',
      origin: start.origin,
      route: start.route,
      startedAt: Date.now(),
      timings: {},
      redactions: [],
    };
    writer.register(this);
    this.redactedRequestHead = writer.redactor.redactHead(start.forwardedHead, 'request');
    const { head, fired } = this.redactedRequestHead;
    this.record.request = {
      method: start.method,
      target: this.redactTarget(head),
      droppedHeaders: start.droppedHeaders,
      clientTarget: start.clientTarget === undefined ? undefined : writer.redactor.redactText(start.clientTarget),
      headLength: head.length,
      bodyLength: 0,
      flags: [],
    };
    this.record.redactions = fired;
    // The store orders and batches writes: an exchange that completes within this turn writes once.
    // A structural trace never holds a payload on disk, not even in the open marker.
    const markerHead = writer.meta.tier === 'structural' ? structuralRequest(head, Buffer.alloc(0), writer.meta.structural ?? DEFAULT_STRUCTURAL).head : head;
    const markerRequest = writer.meta.tier === 'structural' ? { ...this.record.request!, target: targetOf(markerHead), clientTarget: undefined } : this.record.request!;
    writer.track(writer.store.putExchange(writer.name, { record: { ...this.record, request: { ...markerRequest, headLength: markerHead.length } }, requestHead: markerHead, requestBody: Buffer.alloc(0), responseHead: Buffer.alloc(0), responseBody: Buffer.alloc(0) }));
  }

  private redactTarget(redactedHead: Buffer): string {
    const line = redactedHead.toString('latin1', 0, redactedHead.indexOf('\r\n'));
    return line.split(' ')[1] ?? this.start.target;
  }

  private readStamp: number | null = null;

  /**
   * Marks the start of one upstream read: the head and body chunks it carries get one timestamp, so a replay
   * can send what arrived together in one write.
   */
  beginRead(): void {
    this.readStamp = this.elapsed();
  }

  private elapsed(): number {
    return Math.round((performance.now() - this.t0) * 1000) / 1000;
  }

  requestBody(wire: Buffer, payload: Buffer[]): void {
    this.requestWire.push(wire);
    this.requestPayload.push(...payload);
  }

  requestEnd(): void {
    this.record.timings.requestEndMs = this.elapsed();
  }

  onResponseHead(raw: Buffer, status: number, parsed?: MessageHead): void {
    this.record.timings.responseHeadMs = this.readStamp ?? this.elapsed();
    this.responseHead = raw;
    this.responseHeadParsed = parsed;
    this.record.response = { status, headLength: 0, bodyLength: 0, flags: [], chunks: [] };
  }

  responseBody(wire: Buffer, payload: Buffer[]): void {
    if (wire.length === 0) return;
    this.responseWire.push(wire);
    this.responsePayload.push(Buffer.concat(payload));
    this.chunkOffsets.push(this.readStamp ?? this.elapsed());
  }

  complete(): void {
    this.finalize('complete');
  }

  fail(code: string, message: string, phase: NonNullable<ExchangeRecord['error']>['phase']): void {
    if (this.done) return;
    this.record.error = { code, message: this.writer.redactor.redactText(message), phase };
    this.finalize('incomplete');
  }

  private finalize(state: 'complete' | 'incomplete'): void {
    if (this.done) return;
    this.done = true;
    this.writer.unregister(this);
    this.record.state = state;
    this.record.timings.endMs = this.elapsed();
    const redactor = this.writer.redactor;
    const request = redactMessage(redactor, 'request', this.start.forwardedHead, this.requestWire, this.requestPayload, {
      parsed: this.start.parsedHead,
      redacted: this.redactedRequestHead,
    });
    this.record.request = {
      ...this.record.request!,
      headLength: request.head.length,
      bodyLength: request.body.length,
      flags: request.flags,
      hash: requestHash(request.head, request.body),
    };
    this.record.redactions = [...request.fired];
    let responseHead: Buffer = Buffer.alloc(0);
    let responseBody: Buffer = Buffer.alloc(0);
    if (this.responseHead && this.record.response) {
      const response = redactMessage(redactor, 'response', this.responseHead, this.responseWire, this.responsePayload, { parsed: this.responseHeadParsed });
      responseHead = response.head;
      responseBody = response.body;
      const chunks: [number, number][] =
        response.pieces && response.pieces.length === this.chunkOffsets.length
          ? response.pieces.map((len, i) => [this.chunkOffsets[i]!, len])
          : [[this.chunkOffsets.at(-1) ?? this.record.timings.responseHeadMs ?? 0, response.body.length]];
      this.record.response = { ...this.record.response, headLength: responseHead.length, bodyLength: responseBody.length, flags: response.flags, chunks };
      this.record.redactions.push(...response.fired);
    }
    let exchange: StoredExchange = { record: this.record, requestHead: request.head, requestBody: request.body, responseHead, responseBody };
    const { tier, structural } = this.writer.meta;
    if (tier === 'structural') exchange = toStructural(exchange, structural ?? DEFAULT_STRUCTURAL);
    this.writer.track(this.writer.store.putExchange(this.writer.name, exchange));
  }
}

/** Records a failure that never became an HTTP exchange (garbage instead of TLS, unreachable tunnel target). */
export function recordConnectionError(
  writer: TraceWriter,
  origin: Origin,
  route: Route,
  error: NonNullable<ExchangeRecord['error']>,
): void {
  const record: ExchangeRecord = {
    seq: writer.nextSeq(),
    kind: 'error',
    state: 'complete',
    origin,
    route,
    startedAt: Date.now(),
    timings: {},
    error: { ...error, message: writer.redactor.redactText(error.message) },
    redactions: [],
  };
  const empty = Buffer.alloc(0);
  writer.track(writer.store.putExchange(writer.name, { record, requestHead: empty, requestBody: empty, responseHead: empty, responseBody: empty }));
}

/** Records an undecrypted tunnel: host, port, bytes each way and timing only. */
export function recordTunnel(
  writer: TraceWriter,
  origin: Origin,
  startedAt: number,
  stats: { bytesUp: number; bytesDown: number; durationMs: number },
  error?: NonNullable<ExchangeRecord['error']>,
): void {
  const record: ExchangeRecord = {
    seq: writer.nextSeq(),
    kind: 'tunnel',
    state: 'complete',
    origin,
    route: 'connect',
    startedAt,
    timings: { endMs: stats.durationMs },
    tunnel: stats,
    error: error && { ...error, message: writer.redactor.redactText(error.message) },
    redactions: [],
  };
  const empty = Buffer.alloc(0);
  writer.track(writer.store.putExchange(writer.name, { record, requestHead: empty, requestBody: empty, responseHead: empty, responseBody: empty }));
}
