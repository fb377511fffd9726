/**
 * The `structural` reduction: an exchange reduced to the shape of the run, with no customer data.
 *
 * What survives (see `structuralRequest` / `structuralExchange`):
 * - start lines: the method and path of a request (they name the endpoint), the names of its query parameters
 *   (values become same-length filler), and a response's whole status line;
 * - header names, order and count; values only of the shape headers in KEPT_VALUES (content-type with any
 *   multipart boundary filled, host, accept, connection, anthropic-version/-beta, openai-beta). Every other value
 *   becomes `x` repeated to its length, `[REDACTED:…]` placeholders excepted (they hold no data);
 * - bodies, decoded first (chunked framing and content codings undone; Transfer-Encoding and Content-Encoding
 *   dropped, Content-Length set to the reduced length): JSON keeps its keys and structure, each string becomes
 *   `x` repeated to its length in UTF-16 code units, numbers and booleans are kept or zeroed (`0`, `false`) per
 *   options, null stays; the result is re-serialised compactly by this module, so whitespace is normalised
 *   (as is number spelling, `1.0` becomes `1`, and key order where JS puts integer-like keys first; duplicate keys
 *   collapse to the last). text/event-stream keeps every line and line ending: `event:` lines as they are,
 *   `data:` lines reduced as JSON when they parse, `[DONE]` kept, any other data, `id:`/`retry:` values and
 *   comments filled, unknown lines filled whole. NDJSON (by content type, or a body whose every non-blank line
 *   parses as JSON) is reduced line by line. application/x-www-form-urlencoded bodies keep their names like a
 *   query string. Anything else becomes same-length `x` bytes; its content type is kept.
 * - response timing: chunks are re-split so that each SSE frame / NDJSON line leaves at the offset of the original
 *   chunk in which it completed; a length-preserving reduction (filler, form) keeps every boundary exactly; a
 *   re-serialised JSON document keeps proportional boundaries.
 *
 * Deterministic (no randomness, no clock): the same input always reduces to the same bytes, which is what lets
 * replay match a replayed request by reducing it the same way.
 */
import { brotliDecompressSync, constants, gunzipSync, inflateRawSync, inflateSync } from 'node:zlib';
import { decodeEntityBody } from '../capture/content-coding.js';
import type { StoredExchange } from './schema.js';

export interface StructuralOptions {
  numbers: 'keep' | 'zero';
  booleans: 'keep' | 'zero';
}

export const DEFAULT_STRUCTURAL: StructuralOptions = { numbers: 'keep', booleans: 'keep' };

/** The flag added to request and response records of a reduced exchange. */
export const STRUCTURAL_FLAG = 'structural';

/** Decoded bodies larger than this stay undecoded (and so become filler): the zip-bomb guard redaction uses too. */
const MAX_DECODED = 256 * 1024 * 1024;
/** Bytes of compressed prefixes decoded to map a content-coded stream's chunk boundaries; past it, proportional. */
const PREFIX_DECODE_BUDGET = 64 * 1024 * 1024;

/** Header values that describe the message's shape, not its data. */
const KEPT_VALUES = new Set(['content-type', 'host', 'accept', 'connection', 'anthropic-version', 'anthropic-beta', 'openai-beta']);
const FRAMING = new Set(['content-length', 'transfer-encoding', 'content-encoding']);
/** A redaction placeholder (`[REDACTED:<rule>]`, see capture/redact.ts): printable ASCII rule name, no `]`. */
const PLACEHOLDER = /\[REDACTED:[!-\\^-~]{1,128}\]/g;

// ---------------------------------------------------------------------------------------------------------------
// fillers

const fill = (n: number): string => 'x'.repeat(n);

/** Same number of characters, all `x`, except redaction placeholders, which are kept as they are. */
function fillText(text: string): string {
  let out = '';
  let pos = 0;
  for (const m of text.matchAll(PLACEHOLDER)) {
    out += fill(m.index - pos) + m[0];
    pos = m.index + m[0].length;
  }
  return out + fill(text.length - pos);
}

/** `a=1&b=two` → `a=x&b=xxx`: names (and bare names) kept, values filled (placeholders kept). */
function reduceQuery(query: string): string {
  return query
    .split('&')
    .map((pair) => {
      const eq = pair.indexOf('=');
      return eq < 0 ? pair : pair.slice(0, eq + 1) + fillText(pair.slice(eq + 1));
    })
    .join('&');
}

/** A request target with its query values (and any fragment) filled; the path is kept. */
export function structuralTarget(target: string): string {
  const q = target.indexOf('?');
  const hash = target.indexOf('#');
  if (q < 0 && hash < 0) return target;
  if (q < 0 || (hash >= 0 && hash < q)) return target.slice(0, hash + 1) + fill(target.length - hash - 1);
  const end = hash < 0 ? target.length : hash;
  const fragment = hash < 0 ? '' : '#' + fill(target.length - hash - 1);
  return target.slice(0, q + 1) + reduceQuery(target.slice(q + 1, end)) + fragment;
}

// ---------------------------------------------------------------------------------------------------------------
// JSON

/** The reduced JSON text of a parsed value (compact; strings as same-length filler). */
function reduceJson(value: unknown, options: StructuralOptions): string {
  const parts: string[] = [];
  const walk = (v: unknown): void => {
    if (typeof v === 'string') parts.push(`"${fill(v.length)}"`);
    else if (typeof v === 'number') parts.push(options.numbers === 'zero' ? '0' : JSON.stringify(v));
    else if (typeof v === 'boolean') parts.push(options.booleans === 'zero' ? 'false' : String(v));
    else if (v === null || v === undefined) parts.push('null');
    else if (Array.isArray(v)) {
      parts.push('[');
      v.forEach((item, i) => {
        if (i > 0) parts.push(',');
        walk(item);
      });
      parts.push(']');
    } else {
      parts.push('{');
      const object = v as Record<string, unknown>;
      Object.keys(object).forEach((key, i) => {
        parts.push(i > 0 ? ',' : '', JSON.stringify(key), ':');
        walk(object[key]);
      });
      parts.push('}');
    }
  };
  walk(value);
  return parts.join('');
}

const NOT_JSON = Symbol('not json');

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text.charCodeAt(0) === 0xfeff ? text.slice(1) : text);
  } catch {
    return NOT_JSON;
  }
}

/** The reduced JSON text, or null when `text` is not JSON (or nests too deep to walk). */
function reduceJsonText(text: string, options: StructuralOptions): string | null {
  const value = parseJson(text);
  if (value === NOT_JSON) return null;
  try {
    return reduceJson(value, options);
  } catch {
    return null; // RangeError: nesting deeper than the stack
  }
}

// ---------------------------------------------------------------------------------------------------------------
// heads

interface Field {
  name: string;
  value: string;
}

interface ParsedHead {
  startLine: string;
  fields: Field[];
}

/** A stored head (start line, header lines, blank line), read tolerantly: lines without a colon are dropped. */
function parseHead(head: Buffer): ParsedHead {
  const text = head.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  const lines = (end < 0 ? text : text.slice(0, end)).split(/\r?\n/);
  const fields: Field[] = [];
  for (const line of lines.slice(1)) {
    if (line === '') break;
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    fields.push({ name: line.slice(0, colon).trim(), value: line.slice(colon + 1).trim() });
  }
  return { startLine: lines[0] ?? '', fields };
}

function valueOf(head: ParsedHead, name: string): string | undefined {
  return head.fields.find((f) => f.name.toLowerCase() === name)?.value;
}

function allValues(head: ParsedHead, name: string): string | undefined {
  const values = head.fields.filter((f) => f.name.toLowerCase() === name).map((f) => f.value);
  return values.length === 0 ? undefined : values.join(', ');
}

function reduceRequestLine(line: string): string {
  const parts = line.split(' ');
  if (parts.length !== 3) return parts[0] + (parts.length > 1 ? ' ' + fillText(parts.slice(1).join(' ')) : '');
  return `${parts[0]} ${structuralTarget(parts[1]!)} ${parts[2]}`;
}

/** Content-Type is kept, but a multipart boundary (often random or derived from data) is filled. */
function reduceContentType(value: string): string {
  return value.replace(/(;\s*boundary\s*=\s*)("?)([^";]*)/gi, (_, lead: string, quote: string, b: string) => lead + quote + fill(b.length));
}

/**
 * The reduced head: start line, header lines `Name: value` (names, order and count kept), framing rewritten.
 * `contentLength` is what Content-Length says: a number (set on the first Content-Length line, appended if
 * there is none, later duplicates dropped), or `keep` for bodiless responses (kept if numeric, never added).
 */
function reduceHead(head: ParsedHead, startLine: string, contentLength: number | 'keep' | 'none'): Buffer {
  const lines = [startLine];
  let lengthWritten = false;
  for (const { name, value } of head.fields) {
    const lower = name.toLowerCase();
    let out: string | null;
    if (lower === 'transfer-encoding' || lower === 'content-encoding') out = null;
    else if (lower === 'content-length') {
      if (lengthWritten || contentLength === 'none') out = null;
      else out = contentLength === 'keep' ? (/^\d+$/.test(value) ? value : fillText(value)) : String(contentLength);
      lengthWritten = true;
    } else if (lower === 'content-type') out = reduceContentType(value);
    else if (KEPT_VALUES.has(lower)) out = value;
    else out = fillText(value);
    if (out !== null) lines.push(out === '' ? `${name}:` : `${name}: ${out}`);
  }
  if (!lengthWritten && typeof contentLength === 'number') lines.push(`Content-Length: ${contentLength}`);
  return Buffer.from(lines.join('\r\n') + '\r\n\r\n', 'latin1');
}

// ---------------------------------------------------------------------------------------------------------------
// bodies

interface Unit {
  /** end of the unit in the reduced body */
  reducedEnd: number;
  /** end of the unit in the original decoded body */
  originalEnd: number;
}

interface ReducedBody {
  body: Buffer;
  /** how reduced positions map to original ones: units (SSE frames, lines), same length, or proportional */
  mapping: Unit[] | 'identity' | 'proportional';
}

/** Splits bytes into lines, each with its terminator (CRLF, LF or CR); the last may have none. */
function splitLines(buf: Buffer, crIsBreak: boolean): { start: number; end: number; next: number }[] {
  const lines: { start: number; end: number; next: number }[] = [];
  let start = 0;
  for (let i = 0; i < buf.length; i++) {
    const byte = buf[i]!;
    if (byte === 0x0a) {
      const end = i > start && buf[i - 1] === 0x0d ? i - 1 : i;
      lines.push({ start, end, next: i + 1 });
      start = i + 1;
    } else if (byte === 0x0d && crIsBreak && buf[i + 1] !== 0x0a) {
      lines.push({ start, end: i, next: i + 1 });
      start = i + 1;
    }
  }
  if (start < buf.length) lines.push({ start, end: buf.length, next: buf.length });
  return lines;
}

const SSE_FIELDS = new Set(['event', 'data', 'id', 'retry']);

function reduceSseLine(line: string, options: StructuralOptions): string {
  if (line === '') return line;
  const colon = line.indexOf(':');
  const name = colon < 0 ? line : line.slice(0, colon);
  if (colon < 0) return SSE_FIELDS.has(name) ? line : fill(line.length);
  let value = line.slice(colon + 1);
  const space = value.startsWith(' ') ? ' ' : '';
  value = value.slice(space.length);
  const prefix = line.slice(0, colon + 1) + space;
  if (name === '') return prefix + fill(value.length); // a comment
  if (name === 'event') return line;
  if (name === 'data') {
    if (value === '[DONE]') return line;
    return prefix + (reduceJsonText(value, options) ?? fill(value.length));
  }
  if (name === 'id' || name === 'retry') return prefix + fill(value.length);
  return fill(line.length);
}

/** SSE: every line reduced on its own; a unit is a frame up to and including the blank line that ends it. */
function reduceSse(body: Buffer, options: StructuralOptions): ReducedBody {
  const parts: Buffer[] = [];
  const units: Unit[] = [];
  let reducedLength = 0;
  for (const line of splitLines(body, true)) {
    const text = body.toString('utf8', line.start, line.end);
    const reduced = Buffer.concat([Buffer.from(reduceSseLine(text, options), 'utf8'), body.subarray(line.end, line.next)]);
    parts.push(reduced);
    reducedLength += reduced.length;
    const last = units.at(-1);
    const blank = line.start === line.end;
    // consecutive lines of one frame share a unit; the unit closes with its blank line (or the body's end)
    if (last && last.reducedEnd < 0) {
      last.originalEnd = line.next;
      if (blank) last.reducedEnd = reducedLength;
    } else units.push({ reducedEnd: blank ? reducedLength : -1, originalEnd: line.next });
  }
  const last = units.at(-1);
  if (last && last.reducedEnd < 0) last.reducedEnd = reducedLength;
  return { body: Buffer.concat(parts), mapping: units };
}

/** NDJSON: each line reduced as JSON (filled when it is not), line endings kept; a unit is a line. */
function reduceLines(body: Buffer, options: StructuralOptions): ReducedBody {
  const parts: Buffer[] = [];
  const units: Unit[] = [];
  let reducedLength = 0;
  for (const line of splitLines(body, false)) {
    const text = body.toString('utf8', line.start, line.end);
    const reduced = text.trim() === '' ? text : (reduceJsonText(text, options) ?? fill(text.length));
    const bytes = Buffer.concat([Buffer.from(reduced, 'utf8'), body.subarray(line.end, line.next)]);
    parts.push(bytes);
    reducedLength += bytes.length;
    units.push({ reducedEnd: reducedLength, originalEnd: line.next });
  }
  return { body: Buffer.concat(parts), mapping: units };
}

function everyLineIsJson(text: string): boolean {
  const lines = text.split(/\r?\n/).filter((l) => l.trim() !== '');
  return lines.length > 1 && lines.every((l) => parseJson(l) !== NOT_JSON);
}

/** A decoded body reduced to its shape, by content type (or by content, for JSON without a JSON type). */
function reduceBody(body: Buffer, contentType: string | undefined, options: StructuralOptions): ReducedBody {
  if (body.length === 0) return { body, mapping: 'identity' };
  const type = (contentType ?? '').toLowerCase();
  if (type.includes('text/event-stream')) return reduceSse(body, options);
  if (/ndjson|jsonl|json-lines|json-seq/.test(type)) return reduceLines(body, options);
  if (type.includes('application/x-www-form-urlencoded')) {
    const reduced = Buffer.from(reduceQuery(body.toString('latin1')), 'latin1');
    return { body: reduced, mapping: 'identity' };
  }
  const text = body.toString('utf8');
  const json = reduceJsonText(text, options);
  if (json !== null) return { body: Buffer.from(json, 'utf8'), mapping: 'proportional' };
  if (everyLineIsJson(text)) return reduceLines(body, options);
  return { body: Buffer.alloc(body.length, 'x'), mapping: 'identity' };
}

// ---------------------------------------------------------------------------------------------------------------
// decoding, with a map from stored-body positions to decoded positions (for chunk timing)

interface Segment {
  wireStart: number;
  wireEnd: number;
  entityStart: number;
}

/** Chunked framing walked: data segments, whether the last chunk was seen; null when the framing is malformed.
 * Unlike `dechunk`, a body cut off inside a chunk keeps the part of the chunk that arrived. */
function walkChunked(body: Buffer): { segments: Segment[]; complete: boolean } | null {
  const segments: Segment[] = [];
  let pos = 0;
  let entity = 0;
  while (pos < body.length) {
    const lineEnd = body.indexOf('\r\n', pos, 'latin1');
    if (lineEnd < 0) return { segments, complete: false };
    const sizeText = body.toString('latin1', pos, lineEnd).split(';')[0]!.trim();
    if (!/^[0-9a-fA-F]{1,12}$/.test(sizeText)) return null;
    const size = parseInt(sizeText, 16);
    if (size === 0) return { segments, complete: true };
    const start = lineEnd + 2;
    const end = Math.min(body.length, start + size);
    segments.push({ wireStart: start, wireEnd: end, entityStart: entity });
    entity += end - start;
    if (end < start + size) return { segments, complete: false };
    pos = end;
    if (pos < body.length) {
      if (body[pos] !== 0x0d || body[pos + 1] !== 0x0a) return null;
      pos += 2;
    }
  }
  return { segments, complete: false };
}

interface Decoded {
  /** the entity, de-chunked and content-decoded */
  body: Buffer;
  /** decoded bytes available once the stored body's first `w` bytes arrived, for each (non-decreasing) `w` */
  availableAt: (wirePositions: number[]) => number[];
  /** the stored body is shorter than its framing announced: the recording was cut off; by how much (>= 1) */
  missing: number;
}

function decodedPrefixLength(prefix: Buffer, coding: string): number {
  try {
    switch (coding) {
      case 'gzip':
      case 'x-gzip':
        return gunzipSync(prefix, { finishFlush: constants.Z_SYNC_FLUSH, maxOutputLength: MAX_DECODED }).length;
      case 'deflate':
        try {
          return inflateSync(prefix, { finishFlush: constants.Z_SYNC_FLUSH, maxOutputLength: MAX_DECODED }).length;
        } catch {
          return inflateRawSync(prefix, { finishFlush: constants.Z_SYNC_FLUSH, maxOutputLength: MAX_DECODED }).length;
        }
      case 'br':
        return brotliDecompressSync(prefix, { finishFlush: constants.BROTLI_OPERATION_FLUSH, maxOutputLength: MAX_DECODED }).length;
      default:
        return -1;
    }
  } catch {
    return -1;
  }
}

function decode(head: ParsedHead, stored: Buffer): Decoded {
  const transferEncoding = allValues(head, 'transfer-encoding');
  const contentEncoding = allValues(head, 'content-encoding');
  const chunked = /(?:^|,)\s*chunked\s*$/i.test(transferEncoding ?? '');
  const walk = chunked ? walkChunked(stored) : null;
  const entity = walk ? Buffer.concat(walk.segments.map((s) => stored.subarray(s.wireStart, s.wireEnd))) : stored;
  const body = decodeEntityBody(entity, undefined, contentEncoding, MAX_DECODED);

  let missing = 0;
  if (walk && !walk.complete) missing = 1;
  const declared = valueOf(head, 'content-length');
  if (!chunked && transferEncoding === undefined && declared !== undefined && /^\d+$/.test(declared) && Number(declared) > stored.length) {
    missing = Number(declared) - stored.length;
  }

  /** entity bytes carried by the stored body's first `w` bytes, for non-decreasing `w` (one pass over segments) */
  const entityAtAll = (wirePositions: number[]): number[] => {
    if (!walk) return wirePositions.map((w) => Math.min(w, entity.length));
    let i = 0;
    let available = 0;
    return wirePositions.map((w) => {
      while (i < walk.segments.length && walk.segments[i]!.wireStart < w) {
        const s = walk.segments[i]!;
        available = s.entityStart + Math.min(w, s.wireEnd) - s.wireStart;
        if (w < s.wireEnd) break;
        i++;
      }
      return available;
    });
  };
  const codings = (contentEncoding ?? '')
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
  const coded = body !== entity && !body.equals(entity);

  const availableAt = (wirePositions: number[]): number[] => {
    const entityPositions = entityAtAll(wirePositions);
    if (!coded) return entityPositions;
    const proportional = () => entityPositions.map((e) => (entity.length === 0 ? body.length : Math.floor((body.length * e) / entity.length)));
    const budget = entityPositions.reduce((sum, e) => sum + (e < entity.length ? e : 0), 0);
    if (codings.length !== 1 || budget > PREFIX_DECODE_BUDGET) return proportional();
    let previous = 0;
    return entityPositions.map((e) => {
      if (e >= entity.length) return (previous = body.length);
      const n = decodedPrefixLength(entity.subarray(0, e), codings[0]!);
      previous = Math.max(previous, Math.min(n, body.length));
      return previous;
    });
  };
  return { body, availableAt, missing };
}

/**
 * The reduced body's pieces: each original chunk's offset with the reduced bytes that belong to it (units go to
 * the chunk in which they completed). Consecutive pieces with the same offset are merged, empty ones dropped.
 */
function resplit(chunks: [number, number][], stored: Buffer, decoded: Decoded, reduced: ReducedBody): [number, number][] {
  if (chunks.length === 0 || reduced.body.length === 0) return [];
  const wireEnds: number[] = [];
  let sum = 0;
  for (const [, length] of chunks) {
    sum += length;
    wireEnds.push(Math.min(sum, stored.length));
  }
  wireEnds[wireEnds.length - 1] = stored.length; // replay sends any remainder with the last piece
  const available = decoded.availableAt(wireEnds);
  available[available.length - 1] = decoded.body.length;

  const total = reduced.body.length;
  const { mapping } = reduced;
  let anchors: number[];
  if (mapping === 'identity' && total === decoded.body.length) anchors = available;
  else if (Array.isArray(mapping)) {
    let u = 0;
    let end = 0;
    anchors = available.map((a) => {
      while (u < mapping.length && mapping[u]!.originalEnd <= a) end = mapping[u++]!.reducedEnd;
      return end;
    });
  } else {
    const length = decoded.body.length;
    anchors = available.map((a) => (length === 0 ? total : Math.round((total * a) / length)));
  }
  anchors[anchors.length - 1] = total;

  const out: [number, number][] = [];
  let previous = 0;
  chunks.forEach(([offset], i) => {
    const end = Math.max(previous, Math.min(total, anchors[i]!));
    const length = end - previous;
    previous = end;
    if (length === 0) return;
    const last = out.at(-1);
    if (last && last[0] === offset) last[1] += length;
    else out.push([offset, length]);
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// messages

interface ReducedMessage {
  head: Buffer;
  body: Buffer;
  chunks: [number, number][];
  startLine: string;
}

function reduceMessage(
  rawHead: Buffer,
  stored: Buffer,
  options: StructuralOptions,
  side: { kind: 'request' } | { kind: 'response'; bodiless: boolean; chunks: [number, number][] },
): ReducedMessage {
  const head = parseHead(rawHead);
  const decoded = decode(head, stored);
  const reduced = reduceBody(decoded.body, valueOf(head, 'content-type'), options);
  const framed = head.fields.some((f) => FRAMING.has(f.name.toLowerCase()));
  let contentLength: number | 'keep' | 'none';
  if (side.kind === 'response' && side.bodiless) contentLength = 'keep';
  else if (side.kind === 'request' && reduced.body.length === 0 && !framed) contentLength = 'none';
  // a recording cut off mid-body still announces more than it carries, so the replayed one is cut off too
  else contentLength = reduced.body.length + decoded.missing;
  const startLine = side.kind === 'request' ? reduceRequestLine(head.startLine) : head.startLine;
  const chunks = side.kind === 'response' ? resplit(side.chunks, stored, decoded, reduced) : [];
  return { head: reduceHead(head, startLine, contentLength), body: reduced.body, chunks, startLine };
}

/**
 * The request's shape: what a structural trace stores for a request, and what a replayed request is reduced to
 * before matching. Deterministic: the same request always gives the same bytes. `head` and `body` are a stored
 * request (body as stored: chunked framing and content codings are undone here).
 */
export function structuralRequest(head: Buffer, body: Buffer, options: StructuralOptions): { head: Buffer; body: Buffer } {
  const reduced = reduceMessage(head, body, options, { kind: 'request' });
  return { head: reduced.head, body: reduced.body };
}

const withFlag = (flags: string[]): string[] => (flags.includes(STRUCTURAL_FLAG) ? [...flags] : [...flags, STRUCTURAL_FLAG]);

/**
 * A whole stored exchange reduced to its shape: request via `structuralRequest`, response likewise, response
 * chunks re-split so SSE frames keep their arrival offsets; record lengths, targets and flags (`structural`)
 * updated. The request `hash` is dropped: the caller recomputes it over the reduced bytes. Error records and
 * tunnels are returned unchanged.
 */
export function structuralExchange(ex: StoredExchange, options: StructuralOptions): StoredExchange {
  const { record } = ex;
  if (record.kind !== 'http') return ex;
  const next = { ...record, timings: { ...record.timings } };
  let requestHead = ex.requestHead;
  let requestBody = ex.requestBody;
  if (record.request) {
    const reduced = structuralRequest(ex.requestHead, ex.requestBody, options);
    requestHead = reduced.head;
    requestBody = reduced.body;
    const { hash: _hash, ...rest } = record.request;
    next.request = {
      ...rest,
      target: structuralTarget(record.request.target),
      ...(record.request.clientTarget === undefined ? {} : { clientTarget: structuralTarget(record.request.clientTarget) }),
      droppedHeaders: [...record.request.droppedHeaders],
      headLength: requestHead.length,
      bodyLength: requestBody.length,
      flags: withFlag(record.request.flags),
    };
  }
  let responseHead = ex.responseHead;
  let responseBody = ex.responseBody;
  if (record.response && ex.responseHead.length > 0) {
    const status = record.response.status;
    const method = record.request?.method.toUpperCase();
    const bodiless = method === 'HEAD' || status === 204 || status === 304 || (status >= 100 && status < 200);
    const reduced = reduceMessage(ex.responseHead, ex.responseBody, options, { kind: 'response', bodiless, chunks: record.response.chunks });
    responseHead = reduced.head;
    responseBody = reduced.body;
    next.response = {
      ...record.response,
      headLength: responseHead.length,
      bodyLength: responseBody.length,
      flags: withFlag(record.response.flags),
      chunks: reduced.chunks,
    };
  }
  return { record: next, requestHead, requestBody, responseHead, responseBody };
}
