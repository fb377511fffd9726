import { VERSION } from '../version.js';
import { decodedBody, sseFrames } from './inspect.js';
import type { ExchangeRecord, StoredExchange, TraceMeta } from './schema.js';

/**
 * HAR 1.2 (http://www.softwareishard.com/blog/har-12-spec/) of a trace's decrypted exchanges. Bodies are
 * decoded (content coding and chunked framing undone), as HAR's `content.text` asks; binary bodies are base64.
 * What HAR has no field for is kept under `_mitmReplay` (documented in docs/har.md): chunk offsets, SSE
 * frames with their arrival offsets, the exchange's state, route and redaction manifest.
 */

interface HarHeader {
  name: string;
  value: string;
}

function parseHead(head: Buffer): { startLine: string; headers: HarHeader[] } {
  const lines = head.toString('latin1').split('\r\n').filter((l) => l !== '');
  const headers = lines.slice(1).map((line) => {
    const colon = line.indexOf(':');
    return { name: line.slice(0, colon), value: line.slice(colon + 1).trim() };
  });
  return { startLine: lines[0] ?? '', headers };
}

const header = (headers: HarHeader[], name: string) => headers.find((h) => h.name.toLowerCase() === name)?.value;

function isText(body: Buffer, mimeType: string): boolean {
  if (/^(text\/|application\/(json|[^;]*\+json|javascript|xml|x-www-form-urlencoded|x-ndjson))/i.test(mimeType)) return true;
  return !body.subarray(0, 8192).includes(0) && Buffer.from(body.toString('utf8'), 'utf8').equals(body);
}

function url(record: ExchangeRecord): string {
  const { scheme, host, port } = record.origin;
  const defaultPort = (scheme === 'https' && port === 443) || (scheme === 'http' && port === 80);
  const hostPart = host.includes(':') ? `[${host}]` : host;
  return `${scheme}://${hostPart}${defaultPort ? '' : `:${port}`}${record.request?.target ?? '/'}`;
}

function queryString(target: string): HarHeader[] {
  const q = target.indexOf('?');
  if (q < 0) return [];
  return [...new URLSearchParams(target.slice(q + 1))].map(([name, value]) => ({ name, value }));
}

function cookies(headers: HarHeader[], name: 'cookie' | 'set-cookie'): { name: string; value: string }[] {
  return headers
    .filter((h) => h.name.toLowerCase() === name)
    .flatMap((h) => (name === 'cookie' ? h.value.split(';') : [h.value.split(';')[0]!]))
    .map((pair) => {
      const eq = pair.indexOf('=');
      return { name: pair.slice(0, eq < 0 ? undefined : eq).trim(), value: eq < 0 ? '' : pair.slice(eq + 1).trim() };
    })
    .filter((c) => c.name !== '');
}

function entry(ex: StoredExchange): unknown {
  const { record } = ex;
  const request = parseHead(ex.requestHead);
  const requestBody = decodedBody(ex.requestHead, ex.requestBody);
  const requestMime = header(request.headers, 'content-type') ?? '';
  const response = parseHead(ex.responseHead);
  const [httpVersion = 'HTTP/1.1', status = '0', ...reason] = response.startLine.split(' ');
  const responseBody = decodedBody(ex.responseHead, ex.responseBody);
  const responseMime = header(response.headers, 'content-type') ?? '';
  const text = isText(responseBody, responseMime);
  const timings = record.timings;
  const send = Math.max(0, timings.requestEndMs ?? 0);
  const wait = Math.max(0, (timings.responseHeadMs ?? send) - send);
  const receive = Math.max(0, (timings.endMs ?? timings.responseHeadMs ?? send) - send - wait);
  const frames = /text\/event-stream/i.test(responseMime) ? sseFrames(responseBody.toString('utf8')) : [];
  return {
    startedDateTime: new Date(record.startedAt).toISOString(),
    time: send + wait + receive,
    request: {
      method: record.request?.method ?? 'GET',
      url: url(record),
      httpVersion: request.startLine.split(' ')[2] ?? 'HTTP/1.1',
      cookies: cookies(request.headers, 'cookie'),
      headers: request.headers,
      queryString: queryString(record.request?.target ?? ''),
      ...(requestBody.length > 0
        ? { postData: isText(requestBody, requestMime) ? { mimeType: requestMime, text: requestBody.toString('utf8') } : { mimeType: requestMime, text: requestBody.toString('base64'), _encoding: 'base64' } }
        : {}),
      headersSize: ex.requestHead.length,
      bodySize: ex.requestBody.length,
    },
    response: {
      status: Number(status),
      statusText: reason.join(' '),
      httpVersion,
      cookies: cookies(response.headers, 'set-cookie'),
      headers: response.headers,
      content: {
        size: responseBody.length,
        compression: Math.max(0, responseBody.length - ex.responseBody.length),
        mimeType: responseMime,
        text: text ? responseBody.toString('utf8') : responseBody.toString('base64'),
        ...(text ? {} : { encoding: 'base64' }),
      },
      redirectURL: header(response.headers, 'location') ?? '',
      headersSize: ex.responseHead.length > 0 ? ex.responseHead.length : -1,
      bodySize: ex.responseHead.length > 0 ? ex.responseBody.length : -1,
    },
    cache: {},
    timings: { blocked: -1, dns: -1, connect: -1, ssl: -1, send, wait, receive },
    _mitmReplay: {
      seq: record.seq,
      state: record.state,
      route: record.route,
      error: record.error ?? null,
      chunks: record.response?.chunks ?? [],
      frames: frames.length > 0 ? frameOffsets(ex, frames) : undefined,
      redactions: record.redactions,
      flags: { request: record.request?.flags ?? [], response: record.response?.flags ?? [] },
    },
  };
}

/** Each SSE frame with the offset (ms from the request start) of the chunk in which it completed. */
export function frameOffsets(ex: StoredExchange, frames: string[]): { offsetMs: number; data: string }[] {
  return frameTimings(ex, frames).map(({ offsetMs, data }) => ({ offsetMs, data }));
}

/** As frameOffsets, plus where each frame starts in the stored (wire) body; -1 when it was not found there. */
export function frameTimings(ex: StoredExchange, frames: string[]): { offsetMs: number; byteOffset: number; data: string }[] {
  const chunks = ex.record.response?.chunks ?? [];
  const wire = ex.responseBody.toString('latin1');
  let searchFrom = 0;
  return frames.map((frame) => {
    const marker = frame.split(/\r?\n/)[0]!;
    const at = wire.indexOf(marker, searchFrom);
    if (at >= 0) searchFrom = at + marker.length;
    let end = 0;
    let offsetMs = chunks.at(-1)?.[0] ?? 0;
    for (const [offset, length] of chunks) {
      end += length;
      if (at >= 0 && at < end) {
        offsetMs = offset;
        break;
      }
    }
    return { offsetMs, byteOffset: at, data: frame };
  });
}

export function traceToHar(meta: TraceMeta, exchanges: StoredExchange[]): unknown {
  return {
    log: {
      version: '1.2',
      creator: { name: 'mitm-replay', version: VERSION },
      comment: `trace ${meta.name}${meta.command ? `: ${meta.command.join(' ')}` : ''}`,
      entries: exchanges.filter((ex) => ex.record.kind === 'http').map(entry),
      _mitmReplay: { trace: meta.name, formatVersion: meta.formatVersion, intercept: meta.intercept, exitCode: meta.exitCode ?? null },
    },
  };
}
