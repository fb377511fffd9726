import { STATUS_CODES } from 'node:http';
import { decodeCodings } from '../capture/content-coding.js';
import { redactMessage } from '../capture/recorder.js';
import { Redactor, buildRuleSet, type RuleSet } from '../capture/redact.js';
import { requestHash } from '../replay/matcher.js';
import type { Bundle } from './bundle.js';
import { FORMAT_VERSION, isValidTraceName, type ExchangeRecord, type Firing, type Origin, type Route, type StoredExchange, type TraceMeta } from './schema.js';

/**
 * HAR 1.2 import (`mitm-replay import --har FILE`): a HAR recorded elsewhere (browser devtools, mitmproxy,
 * Polly.JS, or our own `export --har`) becomes a trace, as a Bundle for `importBundle`.
 *
 * Each entry becomes the stored form the recorder would have produced for it: an HTTP/1.1 request head (the
 * HAR's headers in the HAR's order, `name: value` per line, hop-by-hop and HTTP/2 pseudo-headers dropped, Host
 * taken from the URL when missing) with the decoded body and a Content-Length that fits it; a response head
 * without Content-Encoding/Transfer-Encoding (HAR bodies are decoded) with the decoded body. Everything then
 * goes through the recorder's redaction (`redactMessage`), so a HAR holding raw API keys puts none on disk.
 *
 * What HAR does not keep (the raw header bytes, the chunk framing and its timing) cannot be recovered; the
 * import summary (`limits`) says so. Our own export's `_mitmReplay` extension gives back what it can: chunk
 * boundaries and offsets (from `chunks`, or from the SSE `frames`), state, route, error and the original
 * redaction manifest. A trace exported as HAR and imported again matches its original request hashes as long
 * as the stored request had single-space `name: value` header lines and was not chunked or content-coded.
 */

export class HarImportError extends Error {
  constructor(message: string) {
    super(oneLine(message, 400));
    this.name = 'HarImportError';
  }
}

export interface HarImport {
  bundle: Bundle;
  /** what the imported trace does not have, as one-line sentences for the import summary */
  limits: string[];
  /** entries (index into log.entries) that could not be converted */
  skipped: { index: number; reason: string }[];
}

export interface HarImportOptions {
  /** createdAt of the trace (epoch ms); defaults to now */
  now?: number;
  /** redaction rules applied to the imported traffic and stored as the trace's rules; defaults to the built-in rules */
  rules?: RuleSet;
}

/** An entry that is well-formed HAR but cannot become a replayable exchange: it is skipped and listed. */
class SkipEntry extends Error {}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

interface Header {
  name: string;
  value: string;
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** Connection-specific headers (RFC 9110 7.6.1) plus the framing header: never part of a stored HAR message. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'upgrade', 'transfer-encoding']);
const isHopByHop = (lower: string, listed: Set<string>): boolean => HOP_BY_HOP.has(lower) || lower.startsWith('proxy-') || listed.has(lower);
const ROUTES: readonly Route[] = ['connect', 'base-url', 'proxy'];
const ERROR_PHASES = ['connect', 'tls', 'request', 'upstream', 'response', 'client'] as const;
const MAX_DECODED = 256 * 1024 * 1024;

function oneLine(text: string, max = 120): string {
  const flat = text.replace(/[\x00-\x1f\x7f]+/g, ' ').replace(/\s+/g, ' ').trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

const quote = (text: string): string => JSON.stringify(oneLine(text, 60));

/** Parses the text of a HAR file; a HarImportError (one line) when it is not JSON. */
export function parseHarText(text: string, file: string): unknown {
  try {
    return JSON.parse(text.replace(/^\uFEFF/, ''));
  } catch (err) {
    throw new HarImportError(`${file} is not valid JSON (${(err as Error).message}): give a HAR file (devtools "Save all as HAR", mitmproxy, Polly.JS)`);
  }
}

/** Builds a trace (as a Bundle, ready for importBundle) from a parsed HAR 1.2 document. */
export function harToBundle(har: unknown, name: string, options: HarImportOptions = {}): HarImport {
  if (!isValidTraceName(name)) throw new HarImportError(`invalid trace name '${oneLine(name, 80)}': use 1-64 characters of A-Z a-z 0-9 . _ -`);
  const { entries, log } = harEntries(har);
  const rules = options.rules ?? buildRuleSet();
  const redactor = new Redactor(rules);
  const stats = newStats();
  const exchanges: StoredExchange[] = [];
  const skipped: { index: number; reason: string }[] = [];
  entries.forEach((entry, index) => {
    try {
      exchanges.push(convertEntry(entry, index, exchanges.length, redactor, stats));
    } catch (err) {
      if (!(err instanceof SkipEntry)) throw err;
      skipped.push({ index, reason: err.message });
    }
  });
  if (exchanges.length === 0) {
    throw new HarImportError(`none of the HAR's ${entries.length} entries can be replayed (${skippedList(skipped)}): record HTTP or HTTPS requests`);
  }

  const hosts = new Set<string>();
  for (const ex of exchanges) hosts.add(ex.record.origin.host);
  // Our own export also carries the interception policy the trace was recorded with.
  const own = isObject(log._mitmReplay) && Array.isArray(log._mitmReplay.intercept) ? log._mitmReplay.intercept : [];
  for (const pattern of own) if (typeof pattern === 'string' && /^[\x21-\x7e]{1,253}$/.test(pattern)) hosts.add(pattern.toLowerCase());
  const createdAt = options.now ?? Date.now();
  const meta: TraceMeta = {
    name,
    formatVersion: FORMAT_VERSION,
    createdAt,
    finishedAt: createdAt,
    mode: 'record',
    source: 'daemon',
    intercept: [...hosts].sort(),
    redaction: rules,
    restarts: [],
  };
  return { bundle: { meta, exchanges, reports: [], blobs: new Map() }, limits: limitsOf(stats, skipped, rules), skipped };
}

function harEntries(har: unknown): { log: Json; entries: unknown[] } {
  const hint = 'export one from browser devtools ("Save all as HAR"), mitmproxy or mitm-replay export --har';
  if (!isObject(har)) throw new HarImportError(`not a HAR document: expected a JSON object with a "log"; ${hint}`);
  const log = har.log;
  if (!isObject(log)) throw new HarImportError(`not a HAR document: there is no top-level "log" object; ${hint}`);
  if (!Array.isArray(log.entries)) throw new HarImportError('the HAR "log" has no "entries" array: is this a HAR 1.2 file? re-export it');
  if (log.entries.length === 0) throw new HarImportError('the HAR has no entries: nothing to import; record some traffic first');
  return { log, entries: log.entries };
}

// ---------------------------------------------------------------------------------------------------------
// One entry
// ---------------------------------------------------------------------------------------------------------

interface Stats {
  /** responses with a body */
  withBody: number;
  /** ... whose chunk boundaries and offsets came from our `_mitmReplay` extension */
  timed: number;
  pseudoHeaders: boolean;
  noContent: number;
  noResponse: number;
  redacted: number;
  encodedKept: number;
}

const newStats = (): Stats => ({ withBody: 0, timed: 0, pseudoHeaders: false, noContent: 0, noResponse: 0, redacted: 0, encodedKept: 0 });

function convertEntry(raw: unknown, index: number, seq: number, redactor: Redactor, stats: Stats): StoredExchange {
  const at = `log.entries[${index}]`;
  const fix = 'fix or remove that entry';
  if (!isObject(raw)) throw new HarImportError(`HAR ${at} is not an object: ${fix}`);
  const request = raw.request;
  if (!isObject(request)) throw new HarImportError(`HAR ${at} has no request: ${fix}`);
  if (typeof request.url !== 'string' || request.url === '') throw new HarImportError(`HAR ${at} has no request.url: ${fix}`);
  if (typeof request.method !== 'string' || request.method === '') throw new HarImportError(`HAR ${at} has no request.method: ${fix}`);
  const startedAt = typeof raw.startedDateTime === 'string' ? Date.parse(raw.startedDateTime) : NaN;
  if (!Number.isFinite(startedAt)) throw new HarImportError(`HAR ${at} has no valid startedDateTime (ISO 8601 expected): ${fix}`);
  const requestHeaders = headerList(request.headers, `${at}.request.headers`);
  const response = raw.response === undefined || raw.response === null ? undefined : raw.response;
  if (response !== undefined && !isObject(response)) throw new HarImportError(`HAR ${at}.response is not an object: ${fix}`);
  const responseHeaders = response ? headerList(response.headers, `${at}.response.headers`) : [];
  const own = isObject(raw._mitmReplay) ? raw._mitmReplay : undefined;

  // --- what is requested, from where
  const method = request.method;
  if (!TOKEN.test(method)) throw new SkipEntry(`method ${quote(method)} is not an HTTP method`);
  if (method.toUpperCase() === 'CONNECT') throw new SkipEntry('CONNECT opens a tunnel; there is no request in it to replay');
  const { origin, target, host } = parseUrl(request.url);
  const route: Route = typeof own?.route === 'string' && (ROUTES as readonly string[]).includes(own.route) ? (own.route as Route) : origin.scheme === 'https' ? 'connect' : 'proxy';

  // --- request
  const requestBody = requestBodyOf(request.postData);
  const requestPrepared = prepareRequestHeaders(requestHeaders, host, requestBody);
  if (requestPrepared.pseudo) stats.pseudoHeaders = true;
  const requestLine = `${method} ${target} ${httpVersion(request.httpVersion)}`;
  const requestHead = buildHead(requestLine, requestPrepared.headers);
  const storedRequest = redact(redactor, 'request', requestHead, requestBody.length > 0 ? [requestBody] : [], 'request');
  const requestFlags = [...new Set([...requestPrepared.flags, ...storedRequest.flags])];

  // --- response
  const status = response && typeof response.status === 'number' && Number.isInteger(response.status) ? response.status : 0;
  if (status !== 0 && (status < 100 || status > 999)) throw new SkipEntry(`response status ${status} is not an HTTP status`);
  if (status === 101) throw new SkipEntry('101 Switching Protocols (a WebSocket or other upgrade) cannot be replayed');
  if (status >= 100 && status < 200) throw new SkipEntry(`status ${status} is informational, not a final response`);

  const send = ms(isObject(raw.timings) ? raw.timings.send : undefined);
  const wait = ms(isObject(raw.timings) ? raw.timings.wait : undefined);
  const receive = ms(isObject(raw.timings) ? raw.timings.receive : undefined);
  const haveTimings = isObject(raw.timings);
  const total = ms(raw.time);
  const responseHeadMs = round(send + wait);
  const timings: ExchangeRecord['timings'] = { requestEndMs: send };
  if (status !== 0) timings.responseHeadMs = responseHeadMs;
  timings.endMs = haveTimings ? round(send + wait + receive) : total;

  const fired: Firing[] = [...ownRedactions(own, redactor), ...storedRequest.fired];
  let changed = storedRequest.changed;
  let responseHead: Buffer = Buffer.alloc(0);
  let responseBody: Buffer = Buffer.alloc(0);
  let responseInfo: ExchangeRecord['response'];
  if (status !== 0) {
    const bodiless = method.toUpperCase() === 'HEAD' || status === 204 || status === 304;
    const content = isObject(response!.content) ? response!.content : undefined;
    let body = bodiless ? Buffer.alloc(0) : contentBody(content);
    if (!bodiless && body === undefined) stats.noContent++;
    body ??= Buffer.alloc(0);
    const prepared = prepareResponseHeaders(responseHeaders, body, bodiless);
    if (prepared.pseudo) stats.pseudoHeaders = true;
    if (prepared.encodedKept) stats.encodedKept++;
    const statusText = typeof response!.statusText === 'string' && response!.statusText.trim() !== '' ? response!.statusText.trim() : (STATUS_CODES[status] ?? '');
    if (/[\r\n\0]/.test(statusText)) throw new SkipEntry('its response.statusText has a line break in it');
    const head = buildHead(`${httpVersion(response!.httpVersion)} ${status} ${statusText}`, prepared.headers);
    const plan = chunkPlan(own, body, responseHeadMs);
    const pieces: Buffer[] = [];
    let pos = 0;
    for (const length of plan.lengths) {
      pieces.push(body.subarray(pos, pos + length));
      pos += length;
    }
    const stored = redact(redactor, 'response', head, pieces, 'response');
    responseHead = stored.head;
    responseBody = stored.body;
    const chunks: [number, number][] =
      stored.pieces && stored.pieces.length === plan.offsets.length
        ? stored.pieces.map((length, i) => [plan.offsets[i]!, length])
        : stored.body.length > 0
          ? [[plan.offsets.at(-1) ?? responseHeadMs, stored.body.length]]
          : [];
    if (body.length > 0) {
      stats.withBody++;
      if (plan.timed) stats.timed++;
    }
    responseInfo = { status, headLength: responseHead.length, bodyLength: responseBody.length, flags: stored.flags, chunks };
    fired.push(...stored.fired);
    changed ||= stored.changed;
  } else {
    stats.noResponse++;
  }
  if (changed) stats.redacted++;

  // --- state
  let state: ExchangeRecord['state'] = status === 0 ? 'incomplete' : 'complete';
  let error = ownError(own, redactor);
  if (own?.state === 'incomplete' || own?.state === 'open') state = 'incomplete';
  if (state === 'incomplete' && !error) {
    const reason = response && typeof response._error === 'string' && response._error !== '' ? response._error : undefined;
    error =
      status === 0
        ? { code: 'no-response', message: redactor.redactText(oneLine(reason ?? 'the HAR entry has no response (status 0)', 400)), phase: 'upstream' }
        : { code: 'cut-off', message: 'the exchange was cut off before it completed', phase: 'response' };
  }
  if (state === 'complete') error = undefined;

  const record: ExchangeRecord = {
    seq,
    kind: 'http',
    state,
    origin,
    route,
    startedAt,
    timings,
    request: {
      method,
      target: targetOf(storedRequest.head) ?? target,
      droppedHeaders: requestPrepared.dropped,
      headLength: storedRequest.head.length,
      bodyLength: storedRequest.body.length,
      flags: requestFlags,
      hash: requestHash(storedRequest.head, storedRequest.body),
    },
    ...(responseInfo ? { response: responseInfo } : {}),
    ...(error ? { error } : {}),
    redactions: dedupe(fired),
  };
  return { record, requestHead: storedRequest.head, requestBody: storedRequest.body, responseHead, responseBody };
}

function headerList(value: unknown, at: string): Header[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw new HarImportError(`HAR ${at} is not an array: fix or remove that entry`);
  return value.map((h, i) => {
    const ok = isObject(h) && typeof h.name === 'string' && h.name !== '' && ['string', 'number', 'boolean'].includes(typeof h.value);
    if (!ok) throw new HarImportError(`HAR ${at}[${i}] is not a {name, value} pair of strings: fix or remove that entry`);
    return { name: (h as Json).name as string, value: String((h as Json).value) };
  });
}

const DEFAULT_PORT = { http: 80, https: 443 } as const;

function parseUrl(url: string): { origin: Origin; target: string; host: string } {
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(url)?.[1]?.toLowerCase();
  if (scheme === undefined) throw new SkipEntry(`URL ${quote(url)} is not absolute`);
  if (scheme !== 'http' && scheme !== 'https') throw new SkipEntry(`${scheme}: URL, not http or https`);
  const shape = /^[A-Za-z]+:\/\/([^/?#]*)([^#]*)/.exec(url);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new SkipEntry(`URL ${quote(url)} does not parse`);
  }
  if (!shape || parsed.hostname === '') throw new SkipEntry(`URL ${quote(url)} has no host`);
  // The target exactly as the HAR spells it (WHATWG parsing would re-encode and resolve dot segments).
  let target = shape[2]!;
  if (target === '' || target.startsWith('?')) target = `/${target}`;
  try {
    target = target.replace(/[^\x21-\x7e]/gu, (c) => encodeURIComponent(c));
  } catch {
    throw new SkipEntry(`URL ${quote(url)} has characters that cannot be encoded`);
  }
  const port = parsed.port === '' ? DEFAULT_PORT[scheme] : Number(parsed.port);
  const host = parsed.hostname.replace(/^\[(.*)\]$/, '$1');
  return { origin: { scheme, host, port }, target, host: parsed.host };
}

function httpVersion(value: unknown): string {
  // HTTP/1.0 is kept (it is part of the stored request line); h2, h3 and unknown become the HTTP/1.1 replay serves.
  return typeof value === 'string' && /^http\/1\.0$/i.test(value.trim()) ? 'HTTP/1.0' : 'HTTP/1.1';
}

/** Names listed in Connection: connection-specific as well (never the framing or Host of the message). */
function connectionListed(headers: Header[]): Set<string> {
  const listed = new Set<string>();
  for (const h of headers) {
    if (h.name.toLowerCase() !== 'connection') continue;
    for (const token of h.value.split(',')) {
      const name = token.trim().toLowerCase();
      if (name && name !== 'content-length' && name !== 'host') listed.add(name);
    }
  }
  return listed;
}

function checkHeader(h: Header): Header {
  if (!TOKEN.test(h.name)) throw new SkipEntry(`header name ${quote(h.name)} is not valid in HTTP/1.1`);
  const value = h.value.trim();
  if (/[\r\n\0]/.test(value)) throw new SkipEntry(`header ${quote(h.name)} has a line break in its value`);
  return { name: h.name, value };
}

/** Whether the message's own header names are all lower case (HTTP/2 captures): synthesized names follow suit. */
const lowerCaseStyle = (headers: Header[]): boolean => headers.length > 0 && headers.every((h) => h.name === h.name.toLowerCase());

/** Sets every Content-Length to `length` (the first in place, later duplicates dropped), or appends one. */
function setContentLength(headers: Header[], length: number, lower: boolean): Header[] {
  let done = false;
  const out: Header[] = [];
  for (const h of headers) {
    if (h.name.toLowerCase() !== 'content-length') out.push(h);
    else if (!done) {
      out.push({ name: h.name, value: String(length) });
      done = true;
    }
  }
  if (!done) out.push({ name: lower ? 'content-length' : 'Content-Length', value: String(length) });
  return out;
}

/** Whether `body` decodes under the Content-Encoding codings (last applied first): i.e. it is still encoded. */
function stillEncoded(body: Buffer, contentEncoding: string): boolean {
  const hasCoding = contentEncoding.split(',').some((c) => c.trim() !== '' && c.trim().toLowerCase() !== 'identity');
  return hasCoding && decodeCodings(body, contentEncoding, MAX_DECODED) !== undefined;
}

function prepareRequestHeaders(all: Header[], host: string, body: Buffer): { headers: Header[]; dropped: string[]; pseudo: boolean; flags: string[] } {
  const listed = connectionListed(all);
  const dropped: string[] = [];
  let headers: Header[] = [];
  let pseudo = false;
  let hostAt = 0;
  for (const h of all) {
    if (h.name.startsWith(':')) {
      pseudo = true;
      if (h.name === ':authority') hostAt = headers.length;
      continue;
    }
    const lower = h.name.toLowerCase();
    if (isHopByHop(lower, listed)) {
      dropped.push(h.name);
      continue;
    }
    headers.push(checkHeader(h));
  }
  const lower = pseudo || lowerCaseStyle(headers);
  if (!headers.some((h) => h.name.toLowerCase() === 'host')) headers.splice(hostAt, 0, { name: lower ? 'host' : 'Host', value: host });
  const flags: string[] = [];
  const encoding = headers.filter((h) => h.name.toLowerCase() === 'content-encoding').map((h) => h.value).join(',');
  if (encoding !== '' && body.length > 0 && !stillEncoded(body, encoding)) {
    // The HAR holds the decoded entity (our export decodes request bodies too): store it as such.
    headers = headers.filter((h) => h.name.toLowerCase() !== 'content-encoding');
    flags.push('decoded');
  }
  const hasLength = headers.some((h) => h.name.toLowerCase() === 'content-length');
  if (body.length > 0 || hasLength) headers = setContentLength(headers, body.length, lower);
  return { headers, dropped, pseudo, flags };
}

function prepareResponseHeaders(all: Header[], body: Buffer, bodiless: boolean): { headers: Header[]; pseudo: boolean; encodedKept: boolean } {
  const listed = connectionListed(all);
  let headers: Header[] = [];
  let pseudo = false;
  for (const h of all) {
    if (h.name.startsWith(':')) {
      pseudo = true;
      continue;
    }
    const lower = h.name.toLowerCase();
    if (isHopByHop(lower, listed)) continue;
    headers.push(checkHeader(h));
  }
  const encoding = headers.filter((h) => h.name.toLowerCase() === 'content-encoding').map((h) => h.value).join(',');
  // HAR bodies are decoded; a tool that stored the encoded bytes (base64) keeps its Content-Encoding.
  const encodedKept = encoding !== '' && body.length > 0 && stillEncoded(body, encoding);
  if (!encodedKept) headers = headers.filter((h) => h.name.toLowerCase() !== 'content-encoding');
  if (!bodiless) headers = setContentLength(headers, body.length, pseudo || lowerCaseStyle(headers));
  return { headers, pseudo, encodedKept };
}

function buildHead(startLine: string, headers: Header[]): Buffer {
  // Header text that fits in latin1 is stored byte for byte (our export reads heads as latin1); anything
  // beyond (a devtools HAR with real Unicode in a value) goes in as UTF-8.
  const lines = [startLine, ...headers.map((h) => `${h.name}: ${h.value}`)].map((line) => Buffer.from(`${line}\r\n`, /[^\x00-\xff]/.test(line) ? 'utf8' : 'latin1'));
  return Buffer.concat([...lines, Buffer.from('\r\n')]);
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function decodeText(text: string, base64: boolean, what: string): Buffer {
  if (!base64) return Buffer.from(text, 'utf8');
  const compact = text.replace(/\s+/g, '');
  if (compact.length % 4 === 1 || !BASE64.test(compact)) throw new SkipEntry(`its ${what} is marked base64 but is not base64`);
  return Buffer.from(compact, 'base64');
}

function requestBodyOf(postData: unknown): Buffer {
  if (!isObject(postData)) return Buffer.alloc(0);
  const base64 = postData._encoding === 'base64' || postData.encoding === 'base64';
  if (typeof postData.text === 'string') return decodeText(postData.text, base64, 'request body');
  const params = Array.isArray(postData.params) ? postData.params : [];
  if (params.length === 0) return Buffer.alloc(0);
  const mime = typeof postData.mimeType === 'string' ? postData.mimeType : '';
  if (!/^application\/x-www-form-urlencoded/i.test(mime)) throw new SkipEntry(`its request body is given only as form params (${oneLine(mime, 40) || 'no type'}), which cannot be rebuilt byte for byte`);
  const pairs = params.map((p: unknown) => {
    const name = isObject(p) && typeof p.name === 'string' ? p.name : '';
    const value = isObject(p) && typeof p.value === 'string' ? p.value : '';
    return `${encodeURIComponent(name)}=${encodeURIComponent(value)}`;
  });
  return Buffer.from(pairs.join('&'), 'utf8');
}

/** The response body, or undefined when the HAR did not capture one. */
function contentBody(content: Json | undefined): Buffer | undefined {
  if (!content || typeof content.text !== 'string') return undefined;
  return decodeText(content.text, content.encoding === 'base64', 'response content');
}

const ms = (value: unknown): number => (typeof value === 'number' && Number.isFinite(value) && value > 0 ? round(value) : 0);
const round = (value: number): number => Math.round(value * 1000) / 1000;

/**
 * Where the response body is split into chunks and when each was recorded. Our own export gives it back:
 * `chunks` when they describe this body (the stored body was not chunked or compressed), else the SSE
 * `frames` with their offsets (a new chunk where the offset changes). Otherwise one chunk at the first byte.
 */
function chunkPlan(own: Json | undefined, body: Buffer, responseHeadMs: number): { lengths: number[]; offsets: number[]; timed: boolean } {
  if (body.length === 0) return { lengths: [], offsets: [], timed: false };
  const chunks = ownChunks(own);
  if (chunks && chunks.length > 0) {
    const total = chunks.reduce((sum, [, length]) => sum + length, 0);
    if (total === body.length) return { lengths: chunks.map(([, l]) => l), offsets: chunks.map(([o]) => o), timed: true };
  }
  const frames = ownFrames(own);
  if (frames && frames.length > 0) {
    const plan = framePlan(body, frames);
    if (plan) return { ...plan, timed: true };
  }
  // Chunks of a chunked or compressed original: the whole body had arrived by the last one. When they all
  // arrived in one read (one offset), one chunk at that offset is what was recorded.
  const last = chunks?.at(-1)?.[0];
  const timed = last !== undefined && chunks!.every(([offset]) => offset === last);
  return { lengths: [body.length], offsets: [last ?? responseHeadMs], timed };
}

function ownChunks(own: Json | undefined): [number, number][] | undefined {
  if (!own || !Array.isArray(own.chunks)) return undefined;
  const ok = own.chunks.every((c) => Array.isArray(c) && c.length === 2 && typeof c[0] === 'number' && Number.isFinite(c[0]) && c[0] >= 0 && Number.isInteger(c[1]) && (c[1] as number) >= 0);
  return ok ? (own.chunks as [number, number][]).filter(([, length]) => length > 0) : undefined;
}

function ownFrames(own: Json | undefined): { offsetMs: number; data: string }[] | undefined {
  if (!own || !Array.isArray(own.frames)) return undefined;
  const ok = own.frames.every((f) => isObject(f) && typeof f.offsetMs === 'number' && Number.isFinite(f.offsetMs) && typeof f.data === 'string' && f.data !== '');
  return ok ? (own.frames as { offsetMs: number; data: string }[]) : undefined;
}

/** Chunks that start where a frame's offset differs from the one before; null when a frame is not in the body. */
function framePlan(body: Buffer, frames: { offsetMs: number; data: string }[]): { lengths: number[]; offsets: number[] } | null {
  const bounds: number[] = [0];
  const offsets: number[] = [];
  let from = 0;
  for (const frame of frames) {
    const needle = Buffer.from(frame.data, 'utf8');
    const at = body.indexOf(needle, from);
    if (at < 0) return null;
    from = at + needle.length;
    const offset = Math.max(frame.offsetMs, offsets.at(-1) ?? 0);
    if (offsets.length === 0) offsets.push(offset);
    else if (offset !== offsets.at(-1)) {
      bounds.push(at);
      offsets.push(offset);
    }
  }
  return { lengths: bounds.map((b, i) => (bounds[i + 1] ?? body.length) - b), offsets };
}

interface Redacted {
  head: Buffer;
  body: Buffer;
  pieces: number[] | null;
  flags: string[];
  fired: Firing[];
  /** whether redaction changed any byte */
  changed: boolean;
}

function redact(redactor: Redactor, side: 'request' | 'response', head: Buffer, pieces: Buffer[], what: string): Redacted {
  let result: ReturnType<typeof redactMessage>;
  try {
    result = redactMessage(redactor, side, head, pieces, pieces);
  } catch (err) {
    throw new SkipEntry(`its ${what} does not make a valid HTTP/1.1 message (${oneLine((err as Error).message, 60)})`);
  }
  const body = Buffer.concat(pieces);
  return { ...result, changed: !result.head.equals(head) || !result.body.equals(body) };
}

function targetOf(head: Buffer): string | undefined {
  const line = head.toString('latin1', 0, head.indexOf('\r\n'));
  return line.split(' ')[1];
}

/** The redaction manifest our own export carried (what was redacted when the trace was recorded). */
function ownRedactions(own: Json | undefined, redactor: Redactor): Firing[] {
  if (!own || !Array.isArray(own.redactions)) return [];
  return own.redactions
    .filter((f): f is Firing => isObject(f) && typeof f.rule === 'string' && typeof f.where === 'string')
    .map((f) => ({ rule: oneLine(f.rule, 200), where: redactor.redactText(oneLine(f.where, 400)) }));
}

function ownError(own: Json | undefined, redactor: Redactor): ExchangeRecord['error'] {
  const e = own?.error;
  if (!isObject(e) || typeof e.code !== 'string' || typeof e.message !== 'string') return undefined;
  const phase = (ERROR_PHASES as readonly string[]).includes(e.phase as string) ? (e.phase as (typeof ERROR_PHASES)[number]) : 'upstream';
  return { code: oneLine(e.code, 80), message: redactor.redactText(oneLine(e.message, 400)), phase };
}

function dedupe(fired: Firing[]): Firing[] {
  const seen = new Set<string>();
  return fired.filter((f) => {
    const key = `${f.rule}\0${f.where}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

// ---------------------------------------------------------------------------------------------------------
// Summary
// ---------------------------------------------------------------------------------------------------------

function skippedList(skipped: { index: number; reason: string }[]): string {
  const shown = skipped.slice(0, 3).map((s) => `log.entries[${s.index}]: ${s.reason}`);
  return `${shown.join('; ')}${skipped.length > 3 ? `; and ${skipped.length - 3} more` : ''}`;
}

const plural = (n: number, one: string, many = `${one}s`): string => `${n} ${n === 1 ? one : many}`;

function limitsOf(stats: Stats, skipped: { index: number; reason: string }[], rules: RuleSet): string[] {
  const limits: string[] = [];
  if (stats.withBody > stats.timed) {
    limits.push(
      stats.timed === 0
        ? 'HAR has no chunk timing: each response is served as one chunk'
        : `HAR has no chunk timing for ${stats.withBody - stats.timed} of ${stats.withBody} responses: each of those is served as one chunk`,
    );
  }
  limits.push("HAR does not keep raw header order, case or spacing: headers are as the HAR lists them, one 'name: value' per line");
  limits.push('bodies are stored decoded (HAR stores decoded content): Content-Encoding and Transfer-Encoding are dropped and Content-Length fits the decoded body');
  if (stats.encodedKept > 0) limits.push(`${plural(stats.encodedKept, 'response')} held still-encoded content in the HAR: kept encoded, with its Content-Encoding`);
  if (stats.pseudoHeaders) limits.push('HTTP/2 pseudo-headers (:authority, :method, :path, :scheme, :status) are dropped: Host comes from the URL and replay serves HTTP/1.1');
  if (stats.noContent > 0) limits.push(`${plural(stats.noContent, 'response')} had no content in the HAR (not captured): served with an empty body`);
  if (stats.noResponse > 0) limits.push(`${plural(stats.noResponse, 'entry', 'entries')} had no response (status 0): replay answers ${stats.noResponse === 1 ? 'it' : 'them'} with an error, as recorded`);
  if (stats.redacted > 0) {
    const builtin = JSON.stringify(rules) === JSON.stringify(buildRuleSet());
    limits.push(`secrets in ${plural(stats.redacted, 'entry', 'entries')} were redacted (${builtin ? 'built-in rules' : 'the given rules'}) before storing`);
  }
  if (skipped.length > 0) limits.push(`${plural(skipped.length, 'entry', 'entries')} skipped: ${skippedList(skipped)}`);
  return limits;
}
