/**
 * Explains why a replayed request did not hash-match its recorded counterpart.
 *
 * Pure and synchronous: two stored requests (head bytes + wire body bytes) in, a structured report out.
 * The report locates the difference (byte offsets, request line, headers, JSON paths) and attaches cause
 * labels (absolute path, timestamp, uuid, ...). Labels only EXPLAIN a divergence; nothing here decides that
 * two requests are "close enough" to match.
 */
import { decodeEntityBody } from '../capture/content-coding.js';

export type CauseLabel =
  | 'absolute-path'
  | 'timestamp'
  | 'uuid'
  | 'random-id'
  | 'tool-call-id'
  | 'sdk-version-header'
  | 'retry-count-header'
  | 'content-length-only';

export interface HeaderDifference {
  /** lower-case */
  name: string;
  /** all values of the header joined with ', '; null when absent */
  recorded: string | null;
  replayed: string | null;
  labels: CauseLabel[];
}

export interface JsonDifference {
  /** e.g. `messages[0].content`; `$` for the root; `["weird key"]` for keys that are not identifiers */
  path: string;
  /** shortened JSON text of the value (strings shown around the first difference); '(absent)' if missing */
  recorded: string;
  replayed: string;
  /** first differing character (UTF-16 code unit) offset, when both values are strings */
  offset?: number;
  labels: CauseLabel[];
}

export interface ByteDifference {
  /** null when identical */
  firstDifferentByte: number | null;
  /** differing byte positions over the longer length (positions beyond the shorter one count as different) */
  differentBytes: number;
}

export interface Divergence {
  head: ByteDifference;
  /** on the decoded entity (de-chunked, then content-decoded when the head says so and it decodes) */
  body: ByteDifference;
  requestLine: { recorded: string; replayed: string } | null;
  headers: HeaderDifference[];
  /** when both bodies parse as JSON; at most MAX_JSON_DIFFERENCES entries */
  json: JsonDifference[];
  jsonTruncated: boolean;
  /** union of all labels, sorted, deduplicated */
  labels: CauseLabel[];
  /** one human-readable line */
  summary: string;
}

export interface DivergenceContext {
  recordedCwd?: string;
  replayedCwd?: string;
}

export interface StoredRequest {
  head: Buffer;
  body: Buffer;
}

export const MAX_JSON_DIFFERENCES = 50;
/** A decompression bomb must not take the replay process down; larger bodies are compared undecoded. */
const MAX_DECODED_BYTES = 128 * 1024 * 1024;
/** Context scanned on each side of a differing region, so a token that starts before it is still seen whole. */
const SCAN_MARGIN = 512;
/** Longest differing region scanned for labels; beyond it only the start of the region is labelled. */
const MAX_SCAN_REGION = 64 * 1024;
const ELLIPSIS = '\u2026';

// ---------------------------------------------------------------------------------------------------------
// Public entry points

export function explainDivergence(recorded: StoredRequest, replayed: StoredRequest, context: DivergenceContext = {}): Divergence {
  const recHead = parseHead(recorded.head);
  const repHead = parseHead(replayed.head);
  const labels = new Set<CauseLabel>();
  const candidates: SummaryCandidate[] = [];

  // Request line.
  let requestLine: Divergence['requestLine'] = null;
  if (recHead.requestLine !== repHead.requestLine) {
    requestLine = { recorded: recHead.requestLine, replayed: repHead.requestLine };
    const cmp = compareStrings(recHead.requestLine, repHead.requestLine, context);
    cmp.labels.forEach((l) => labels.add(l));
    candidates.push({
      rank: 0,
      name: 'request line',
      text: `request line: '${oneLine(shorten(recHead.requestLine, 100))}' vs '${oneLine(shorten(repHead.requestLine, 100))}'`,
      labels: cmp.labels,
    });
  }

  // Headers.
  const headers = diffHeaders(recHead, repHead, context);
  for (const h of headers) {
    h.labels.forEach((l) => labels.add(l));
    candidates.push({
      // Content-Length follows the body; name it only when nothing better explains the divergence.
      rank: h.name === 'content-length' ? 4 : 2,
      name: `header ${h.name}`,
      text: `header ${h.name}: ${quoteOrAbsent(h.recorded)} vs ${quoteOrAbsent(h.replayed)}`,
      labels: h.labels,
    });
  }

  // Body: compared on the decoded entity, so framing and compression choices do not hide the real change.
  const recBody = decodeEntity(recHead, recorded.body);
  const repBody = decodeEntity(repHead, replayed.body);
  const body = compareBytes(recBody, repBody);
  let json: JsonDifference[] = [];
  let jsonTruncated = false;
  if (body.firstDifferentByte !== null) {
    const parsed = parseBoth(recHead, recBody, repHead, repBody);
    if (parsed) {
      const walk = diffJsonValues(parsed.recorded, parsed.replayed, context);
      json = walk.out;
      jsonTruncated = walk.truncated;
      json.forEach((d, i) => {
        d.labels.forEach((l) => labels.add(l));
        candidates.push({ rank: 1, name: d.path, text: walk.summaries[i]!, labels: d.labels });
      });
      if (json.length === 0) {
        candidates.push({
          rank: 3,
          name: 'body',
          text: `body differs at byte ${body.firstDifferentByte} but parses to equal JSON (formatting or key order)`,
          labels: [],
        });
      }
    } else {
      const described = describeRawBody(recBody, repBody, body, context);
      described.labels.forEach((l) => labels.add(l));
      candidates.push({ rank: 1, name: 'body', text: described.text, labels: described.labels });
    }
  }

  if (body.firstDifferentByte === null && !recorded.body.equals(replayed.body)) {
    // Same entity, different wire bytes: the hash still differs, so say why.
    const wire = compareBytes(recorded.body, replayed.body);
    candidates.push({
      rank: 3,
      name: 'body framing',
      text: `body wire bytes differ at byte ${wire.firstDifferentByte} but decode to the same entity (chunk framing or compression)`,
      labels: [],
    });
  }

  const head = compareBytes(recorded.head, replayed.head);
  if (head.firstDifferentByte !== null && requestLine === null && headers.length === 0) {
    // Same request line and header values, different bytes: order, name case or whitespace.
    candidates.push({
      rank: 3,
      name: 'head bytes',
      text: `head differs at byte ${head.firstDifferentByte} (header order, name case or spacing only)`,
      labels: [],
    });
  }

  return {
    head,
    body,
    requestLine,
    headers,
    json,
    jsonTruncated,
    labels: [...labels].sort(),
    summary: summarize(candidates, jsonTruncated),
  };
}

/** Shortens `text` to at most `max` characters, keeping its start and ending in '…' when cut. */
export function shorten(text: string, max = 80): string {
  const limit = Math.max(1, Math.floor(max));
  if (text.length <= limit) return text;
  let cut = limit - 1;
  // Never split a surrogate pair: half a character would render as garbage.
  if (cut > 0 && isHighSurrogate(text.charCodeAt(cut - 1))) cut--;
  return text.slice(0, cut) + ELLIPSIS;
}

// ---------------------------------------------------------------------------------------------------------
// Summary

interface SummaryCandidate {
  /** lower is more telling: request line, then body/JSON, then headers, then formatting-only, then Content-Length */
  rank: number;
  name: string;
  text: string;
  labels: CauseLabel[];
}

function summarize(candidates: SummaryCandidate[], jsonTruncated: boolean): string {
  if (candidates.length === 0) return 'no difference';
  // Stable sort keeps discovery order (recorded header order, JSON document order) within a rank.
  const ordered = [...candidates].sort((a, b) => a.rank - b.rank);
  const first = ordered[0]!;
  let line = first.text + (first.labels.length ? ` (${first.labels.join(', ')})` : '');
  const rest = ordered.slice(1);
  if (rest.length > 0 || jsonTruncated) {
    // Name a few of the others so one line still says where else to look.
    const names = rest.slice(0, 3).map((c) => c.name);
    const elided = rest.length > names.length || jsonTruncated ? `${names.length ? ', ' : ''}${ELLIPSIS}` : '';
    line += `; +${rest.length}${jsonTruncated ? '+' : ''} more: ${names.join(', ')}${elided}`;
  }
  return oneLine(line);
}

function quoteOrAbsent(value: string | null): string {
  return value === null ? '(absent)' : `'${oneLine(shorten(value, 60))}'`;
}

/** The summary is one line: control characters are shown escaped. */
function oneLine(text: string): string {
  return text.replace(/[\x00-\x1f\x7f]/g, (c) => {
    if (c === '\n') return '\\n';
    if (c === '\r') return '\\r';
    if (c === '\t') return '\\t';
    return `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`;
  });
}

// ---------------------------------------------------------------------------------------------------------
// Bytes

/**
 * First differing byte and the number of differing positions. Equal 4 KiB blocks are skipped with a native
 * compare, so multi-megabyte bodies that differ in a few places cost little more than a memcmp.
 */
function compareBytes(a: Buffer, b: Buffer): ByteDifference {
  const common = Math.min(a.length, b.length);
  const BLOCK = 4096;
  let first = -1;
  let count = 0;
  for (let start = 0; start < common; start += BLOCK) {
    const end = Math.min(common, start + BLOCK);
    if (a.compare(b, start, end, start, end) === 0) continue;
    for (let i = start; i < end; i++) {
      if (a[i] !== b[i]) {
        if (first < 0) first = i;
        count++;
      }
    }
  }
  const extra = Math.abs(a.length - b.length);
  if (extra > 0 && first < 0) first = common;
  return { firstDifferentByte: first < 0 ? null : first, differentBytes: count + extra };
}

// ---------------------------------------------------------------------------------------------------------
// Head

interface ParsedHead {
  requestLine: string;
  /** lower-case name -> values in wire order */
  fields: Map<string, string[]>;
}

function parseHead(raw: Buffer): ParsedHead {
  const text = raw.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  const lines = (end < 0 ? text : text.slice(0, end)).split(/\r?\n/);
  const fields = new Map<string, string[]>();
  let last: string[] | null = null;
  for (const line of lines.slice(1)) {
    if (line === '') continue;
    if ((line[0] === ' ' || line[0] === '\t') && last) {
      // obs-fold: a continuation of the previous value.
      last[last.length - 1] += ` ${line.trim()}`;
      continue;
    }
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    const values = fields.get(name) ?? [];
    values.push(line.slice(colon + 1).trim());
    fields.set(name, values);
    last = values;
  }
  return { requestLine: lines[0] ?? '', fields };
}

function headerValue(head: ParsedHead, name: string): string | null {
  const values = head.fields.get(name);
  return values ? values.join(', ') : null;
}

const RETRY_HEADER = /retry|attempt/;
const SDK_VERSION_HEADER = /^(?:user-agent|x-goog-api-client)$|version/;
const REDACTED = '[REDACTED:';

function diffHeaders(rec: ParsedHead, rep: ParsedHead, context: DivergenceContext): HeaderDifference[] {
  const names = [...rec.fields.keys()];
  for (const name of rep.fields.keys()) if (!rec.fields.has(name)) names.push(name);
  const out: HeaderDifference[] = [];
  for (const name of names) {
    let recorded = headerValue(rec, name);
    let replayed = headerValue(rep, name);
    if (recorded === replayed) continue;
    const labels = new Set<CauseLabel>();
    if (RETRY_HEADER.test(name)) labels.add('retry-count-header');
    else if (SDK_VERSION_HEADER.test(name)) labels.add('sdk-version-header');
    if (recorded !== null && replayed !== null) compareStrings(recorded, replayed, context).labels.forEach((l) => labels.add(l));
    // The recording holds a placeholder where a secret was; if the replayed side carries a value there, it
    // is probably that secret, and this report is printed and stored. Show its length only.
    if (recorded?.includes(REDACTED) && replayed !== null && !replayed.includes(REDACTED)) replayed = `[unredacted value, ${replayed.length} chars]`;
    if (replayed?.includes(REDACTED) && recorded !== null && !recorded.includes(REDACTED)) recorded = `[unredacted value, ${recorded.length} chars]`;
    out.push({ name, recorded, replayed, labels: [...labels].sort() });
  }
  if (out.length === 1 && out[0]!.name === 'content-length' && rec.requestLine === rep.requestLine) {
    out[0]!.labels = [...new Set<CauseLabel>([...out[0]!.labels, 'content-length-only'])].sort();
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Body decoding

/** The entity as the application sent it. Anything that does not decode is compared as it is. */
function decodeEntity(head: ParsedHead, body: Buffer): Buffer {
  return decodeEntityBody(body, headerValue(head, 'transfer-encoding') ?? undefined, headerValue(head, 'content-encoding') ?? undefined, MAX_DECODED_BYTES);
}

/** De-chunks a complete (or cleanly cut) chunked body; null when the framing is malformed. Trailers are ignored. */


// ---------------------------------------------------------------------------------------------------------
// Raw (non-JSON) bodies

function describeRawBody(rec: Buffer, rep: Buffer, diff: ByteDifference, context: DivergenceContext): { text: string; labels: CauseLabel[] } {
  const at = diff.firstDifferentByte!;
  const lengths = rec.length === rep.length ? `${rec.length} bytes` : `${rec.length} vs ${rep.length} bytes`;
  if (isBinary(rec) || isBinary(rep)) {
    return { text: `body differs at byte ${at} (${diff.differentBytes} bytes differ; ${lengths}; binary)`, labels: [] };
  }
  // latin1 keeps string offsets equal to byte offsets; excerpts are re-decoded as UTF-8 for display.
  const cmp = compareStrings(rec.toString('latin1'), rep.toString('latin1'), context);
  const show = (buf: Buffer, span: Span): string => `'${oneLine(shorten(buf.toString('utf8', span.start, span.end), 48))}${span.more ? ELLIPSIS : ''}'`;
  return {
    text: `body differs at byte ${at}: ${show(rec, cmp.displayA)} vs ${show(rep, cmp.displayB)}`,
    labels: cmp.labels,
  };
}

function isBinary(buf: Buffer): boolean {
  return buf.subarray(0, 64 * 1024).includes(0);
}

// ---------------------------------------------------------------------------------------------------------
// JSON

function looksLikeJson(head: ParsedHead, body: Buffer): boolean {
  if (/json/i.test(headerValue(head, 'content-type') ?? '')) return true;
  for (let i = 0; i < body.length; i++) {
    const c = body[i]!;
    if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) continue;
    return c === 0x7b /* { */ || c === 0x5b /* [ */;
  }
  return false;
}

function parseBoth(recHead: ParsedHead, rec: Buffer, repHead: ParsedHead, rep: Buffer): { recorded: unknown; replayed: unknown } | null {
  if (rec.length === 0 || rep.length === 0) return null;
  if (!looksLikeJson(recHead, rec) || !looksLikeJson(repHead, rep)) return null;
  try {
    return { recorded: parseJson(rec), replayed: parseJson(rep) };
  } catch {
    return null;
  }
}

function parseJson(body: Buffer): unknown {
  const text = body.toString('utf8');
  return JSON.parse(text.charCodeAt(0) === 0xfeff ? text.slice(1) : text);
}

const ABSENT: unique symbol = Symbol('absent');
type Slot = unknown | typeof ABSENT;

interface JsonWalk {
  out: JsonDifference[];
  /** the summary line for each entry of `out` */
  summaries: string[];
  truncated: boolean;
  context: DivergenceContext;
}

/** Keys whose value is a tool-call id whatever it looks like. */
const TOOL_CALL_ID_KEYS = new Set(['tool_call_id', 'tool_use_id', 'call_id']);
/** `type` values of objects whose `id` is a tool-call id. */
const TOOL_CALL_TYPES = new Set(['tool_use', 'server_tool_use', 'function_call', 'tool_call', 'function']);
const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

function diffJsonValues(recorded: unknown, replayed: unknown, context: DivergenceContext): JsonWalk {
  const walk: JsonWalk = { out: [], summaries: [], truncated: false, context };
  diffJson(recorded, replayed, walk);
  return walk;
}

function kindOf(v: Slot): 'absent' | 'null' | 'array' | 'object' | 'string' | 'number' | 'boolean' {
  if (v === ABSENT) return 'absent';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v as 'object' | 'string' | 'number' | 'boolean';
}

/**
 * Where a node sits: a linked list up to the root, turned into text only for the few nodes that differ.
 * (Building every node's path string would cost O(depth) per node, quadratic for deeply nested documents.)
 */
interface PathNode {
  parent: PathNode | null;
  key: string | number;
}

interface Pending {
  a: Slot;
  b: Slot;
  at: PathNode | null;
  /** the value is a tool-call id by its position (key name or enclosing object) */
  toolCallId: boolean;
}

/**
 * One pass over both trees in document order, with an explicit stack so nesting depth cannot overflow the
 * call stack. Every node is visited once: linear in the document size.
 */
function diffJson(recorded: unknown, replayed: unknown, walk: JsonWalk): void {
  const stack: Pending[] = [{ a: recorded, b: replayed, at: null, toolCallId: false }];
  while (stack.length > 0 && !walk.truncated) {
    const { a, b, at, toolCallId } = stack.pop()!;
    const ka = kindOf(a);
    const kb = kindOf(b);
    if (ka === 'object' && kb === 'object') {
      const oa = a as Record<string, unknown>;
      const ob = b as Record<string, unknown>;
      const toolObject = (o: Record<string, unknown>): boolean => typeof o.type === 'string' && TOOL_CALL_TYPES.has(o.type);
      const inToolCalls = typeof at?.key === 'number' && at.parent?.key === 'tool_calls';
      const idIsToolCall = inToolCalls || toolObject(oa) || toolObject(ob);
      // Recorded key order, then keys only the replayed side has.
      const keys = Object.keys(oa);
      for (const key of Object.keys(ob)) if (!Object.hasOwn(oa, key)) keys.push(key);
      // Pushed in reverse so they pop in document order.
      for (let i = keys.length - 1; i >= 0; i--) {
        const key = keys[i]!;
        stack.push({
          a: Object.hasOwn(oa, key) ? oa[key] : ABSENT,
          b: Object.hasOwn(ob, key) ? ob[key] : ABSENT,
          at: { parent: at, key },
          toolCallId: TOOL_CALL_ID_KEYS.has(key) || (key === 'id' && idIsToolCall),
        });
      }
      continue;
    }
    if (ka === 'array' && kb === 'array') {
      const aa = a as unknown[];
      const ab = b as unknown[];
      for (let i = Math.max(aa.length, ab.length) - 1; i >= 0; i--) {
        stack.push({ a: i < aa.length ? aa[i] : ABSENT, b: i < ab.length ? ab[i] : ABSENT, at: { parent: at, key: i }, toolCallId: false });
      }
      continue;
    }
    if (ka === kb && ka !== 'object' && ka !== 'array' && a === b) continue;
    addLeafDifference(a, b, formatPath(at), walk, toolCallId);
  }
}

/** `messages[0].content`; `["weird key"]` for keys that are not identifiers; `$` for the root. */
function formatPath(at: PathNode | null): string {
  const keys: (string | number)[] = [];
  for (let n: PathNode | null = at; n; n = n.parent) keys.push(n.key);
  return formatJsonPath(keys.reverse());
}

/** The path notation of `JsonDifference.path` for keys from the root (the trace viewer highlights by it). */
export function formatJsonPath(keys: readonly (string | number)[]): string {
  if (keys.length === 0) return '$';
  let path = '';
  for (const key of keys) {
    if (typeof key === 'number') path += `[${key}]`;
    else if (IDENTIFIER.test(key)) path += path ? `.${key}` : key;
    else path += `[${JSON.stringify(key)}]`;
  }
  // Only pathological nesting gets here; the innermost part is the informative one.
  return path.length > 400 ? `${path.slice(0, 100)}${ELLIPSIS}${path.slice(-299)}` : path;
}

function addLeafDifference(a: Slot, b: Slot, path: string, walk: JsonWalk, toolCallId: boolean): void {
  if (walk.out.length >= MAX_JSON_DIFFERENCES) {
    walk.truncated = true; // a 51st difference exists
    return;
  }
  const labels = new Set<CauseLabel>();
  let entry: JsonDifference;
  let summary: string;
  if (typeof a === 'string' && typeof b === 'string') {
    const cmp = compareStrings(a, b, walk.context);
    cmp.labels.forEach((l) => labels.add(l));
    entry = { path, recorded: stringExcerpt(a, cmp.prefix), replayed: stringExcerpt(b, cmp.prefix), offset: cmp.prefix, labels: [] };
    const show = (s: string, span: Span): string => `'${oneLine(shorten(s.slice(span.start, span.end), 48))}${span.more ? ELLIPSIS : ''}'`;
    summary = `${path} differs at offset ${cmp.prefix}: ${show(a, cmp.displayA)} vs ${show(b, cmp.displayB)}`;
  } else {
    if (typeof a === 'number' && typeof b === 'number') compareStrings(String(a), String(b), walk.context).labels.forEach((l) => labels.add(l));
    entry = { path, recorded: previewJson(a), replayed: previewJson(b), labels: [] };
    summary = `${path}: ${oneLine(shorten(entry.recorded, 48))} vs ${oneLine(shorten(entry.replayed, 48))}`;
  }
  if (toolCallId && a !== ABSENT && b !== ABSENT) labels.add('tool-call-id');
  entry.labels = [...labels].sort();
  walk.out.push(entry);
  walk.summaries.push(summary);
}

/** JSON text of a string value, windowed around `offset` so the difference is visible within `max` chars. */
function stringExcerpt(s: string, offset: number, max = 80): string {
  if (s.length <= max) {
    const whole = JSON.stringify(s);
    if (whole.length <= max) return whole;
  }
  let start = Math.max(0, offset - 24);
  if (start > 0 && isLowSurrogate(s.charCodeAt(start))) start--;
  const lead = start > 0 ? ELLIPSIS : '';
  const budget = max - 2 - lead.length - 1; // quotes, leading marker, room for a trailing marker
  let inner = '';
  let i = start;
  while (i < s.length) {
    const cp = s.codePointAt(i)!;
    const ch = String.fromCodePoint(cp);
    const escaped = JSON.stringify(ch).slice(1, -1);
    if (inner.length + escaped.length > budget) break;
    inner += escaped;
    i += ch.length;
  }
  return `"${lead}${inner}${i < s.length ? ELLIPSIS : ''}"`;
}

/** JSON text of any value, built with a budget so a huge subtree costs no more than `max` characters. */
function previewJson(value: Slot, max = 80): string {
  if (value === ABSENT) return '(absent)';
  let out = '';
  const full = (): boolean => out.length > max;
  const write = (v: unknown): void => {
    if (full()) return;
    if (typeof v === 'string') {
      out += JSON.stringify(v.length > max ? v.slice(0, max) : v);
    } else if (Array.isArray(v)) {
      out += '[';
      for (let i = 0; i < v.length && !full(); i++) {
        if (i > 0) out += ',';
        write(v[i]);
      }
      out += ']';
    } else if (v !== null && typeof v === 'object') {
      out += '{';
      let first = true;
      for (const key of Object.keys(v)) {
        if (full()) break;
        if (!first) out += ',';
        first = false;
        out += `${JSON.stringify(key.length > max ? key.slice(0, max) : key)}:`;
        write((v as Record<string, unknown>)[key]);
      }
      out += '}';
    } else {
      out += JSON.stringify(v) ?? String(v);
    }
  };
  write(value);
  return shorten(out, max);
}

// ---------------------------------------------------------------------------------------------------------
// String comparison and cause labels

interface Span {
  start: number;
  end: number;
  /** text follows `end` */
  more: boolean;
}

interface StringComparison {
  /** common prefix length = offset of the first difference */
  prefix: number;
  labels: CauseLabel[];
  /** the token holding the first difference (widened to token boundaries), for display */
  displayA: Span;
  displayB: Span;
}

interface Token {
  start: number;
  end: number;
  text: string;
  /** random-id only: which family of id the token belongs to */
  shape?: string;
}

interface Region {
  start: number;
  end: number;
}

/**
 * Finds where two strings differ (common prefix, common suffix, the middle parts) and labels the cause from
 * the tokens that overlap the middle parts. A label needs a token of its kind on both sides and a pair of
 * them that differs: a path inserted on one side only is not "a different path".
 */
function compareStrings(a: string, b: string, context: DivergenceContext): StringComparison {
  const shorter = Math.min(a.length, b.length);
  let prefix = 0;
  while (prefix < shorter && a.charCodeAt(prefix) === b.charCodeAt(prefix)) prefix++;
  let suffix = 0;
  while (suffix < shorter - prefix && a.charCodeAt(a.length - 1 - suffix) === b.charCodeAt(b.length - 1 - suffix)) suffix++;
  const regionA = { start: prefix, end: Math.min(a.length - suffix, prefix + MAX_SCAN_REGION) };
  const regionB = { start: prefix, end: Math.min(b.length - suffix, prefix + MAX_SCAN_REGION) };
  return {
    prefix,
    labels: labelDifference(a, regionA, b, regionB, context),
    displayA: displaySpan(a, regionA),
    displayB: displaySpan(b, regionB),
  };
}

/** Leftwards a token may include path separators (so a path shows from its root); rightwards it stops there. */
const DISPLAY_LEFT = /[A-Za-z0-9_\-.:/\\+~@]/;
const DISPLAY_RIGHT = /[A-Za-z0-9_\-.:+]/;

function displaySpan(s: string, region: Region): Span {
  let start = region.start;
  while (start > 0 && region.start - start < 40 && DISPLAY_LEFT.test(s[start - 1]!)) start--;
  // Show the token holding the FIRST difference only: the middle part may span several differences.
  let end = Math.min(region.end, region.start + 1);
  while (end < s.length && end - region.start < 40 && DISPLAY_RIGHT.test(s[end]!)) end++;
  return { start, end, more: end < s.length };
}

function labelDifference(a: string, ra: Region, b: string, rb: Region, context: DivergenceContext): CauseLabel[] {
  const ta = tokensNear(a, ra, context);
  const tb = tokensNear(b, rb, context);
  const labels: CauseLabel[] = [];
  if (pairsDiffer(ta.path, tb.path, false)) labels.push('absolute-path');
  if (pairsDiffer(ta.timestamp, tb.timestamp, false)) labels.push('timestamp');
  if (pairsDiffer(ta.uuid, tb.uuid, false)) labels.push('uuid');
  if (pairsDiffer(ta.toolCall, tb.toolCall, false)) labels.push('tool-call-id');
  if (pairsDiffer(ta.randomId, tb.randomId, true)) labels.push('random-id');
  return labels.sort();
}

/** Tokens are paired in order of appearance; volatile values are substituted one for one. */
function pairsDiffer(a: Token[], b: Token[], sameShape: boolean): boolean {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a[i]!;
    const y = b[i]!;
    if (x.text === y.text) continue;
    if (!sameShape) return true;
    if (x.shape === y.shape && Math.abs(x.text.length - y.text.length) <= 2) return true;
  }
  return false;
}

const PATH_CHAR = String.raw`[^\s"'\x60<>|;,(){}\[\]]`;
const PATH_CHAR_RUN = new RegExp(`${PATH_CHAR}*`, 'y');
const ABSOLUTE_PATH = new RegExp(
  [
    // Well-known roots only: a bare "/v1/messages" is a URL path far more often than a file.
    String.raw`(?<![\w.~-])/(?:tmp|home|Users|var|private|opt|root|mnt|srv|usr|etc|Volumes|workspaces?|work|app|data|run|media|nix)(?![\w.-])${PATH_CHAR}*`,
    String.raw`(?<![A-Za-z0-9])[A-Za-z]:[\\/]${PATH_CHAR}*`,
  ].join('|'),
  'g',
);
const DAY = '(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)';
const MONTH = '(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)';
const TIMESTAMP = new RegExp(
  [
    String.raw`${DAY}, \d{1,2} ${MONTH} \d{4} \d{2}:\d{2}:\d{2} (?:GMT|UTC|[+-]\d{4})`, // RFC 1123
    String.raw`(?<!\d)\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?(?!\d)`, // ISO 8601 extended
    String.raw`(?<!\d)\d{8}T\d{6}(?:[.,]\d+)?Z?(?!\d)`, // ISO 8601 basic
    String.raw`(?<![\d:])\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?![\d:])`, // time of day
    String.raw`(?<![\w.])(\d{13}|\d{10})(?:\.\d+)?(?!\w)`, // epoch seconds or milliseconds, range-checked below
  ].join('|'),
  'g',
);
const EPOCH_MIN_S = 946_684_800; // 2000-01-01
const EPOCH_MAX_S = 4_102_444_800; // 2100-01-01
const UUID = /(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}(?![0-9A-Fa-f])/g;
// OpenAI chat `call_…`, Responses `fc_…`, Anthropic `toolu_…` (and Bedrock/Vertex `toolu_bdrk_…`/`toolu_vrtx_…`).
const TOOL_CALL = /(?<![A-Za-z0-9_])(?:call|fc|toolu)_[A-Za-z0-9][A-Za-z0-9_-]*/g;
const ID_CANDIDATE = /[A-Za-z0-9_-]{6,}/g;
const PREFIXED_ID = /^([A-Za-z]{2,16}[_-])([A-Za-z0-9]{6,})$/;

interface NearTokens {
  path: Token[];
  timestamp: Token[];
  uuid: Token[];
  toolCall: Token[];
  randomId: Token[];
}

/** Tokens of each kind that overlap the differing region (or touch it, when it is empty on this side). */
function tokensNear(s: string, region: Region, context: DivergenceContext): NearTokens {
  const lo = Math.max(0, region.start - SCAN_MARGIN);
  const hi = Math.min(s.length, region.end + SCAN_MARGIN);
  const window = s.slice(lo, hi);
  const overlaps = (t: Token): boolean =>
    region.end > region.start ? t.start < region.end && t.end > region.start : t.start <= region.start && t.end >= region.start;
  const scan = (re: RegExp, accept?: (m: RegExpExecArray) => boolean): Token[] => {
    const out: Token[] = [];
    re.lastIndex = 0;
    for (let m = re.exec(window); m; m = re.exec(window)) {
      const t = { start: lo + m.index, end: lo + m.index + m[0].length, text: m[0] };
      if (overlaps(t) && (!accept || accept(m))) out.push(t);
    }
    return out;
  };

  const path = mergeTokens(s, [...scan(ABSOLUTE_PATH), ...cwdTokens(s, window, lo, context).filter(overlaps)]);
  const timestamp = scan(TIMESTAMP, (m) => {
    if (m[1] === undefined) return true;
    const seconds = Number(m[1]) / (m[1].length === 13 ? 1000 : 1);
    return seconds >= EPOCH_MIN_S && seconds < EPOCH_MAX_S;
  });
  const uuid = scan(UUID);
  const toolCall = scan(TOOL_CALL);
  // A random-looking token inside a uuid, tool-call id, timestamp or path is explained by that, more precisely.
  // Both lists are in text order, so one forward sweep finds the overlaps (a log full of timestamps stays linear).
  const claimed = [...path, ...timestamp, ...uuid, ...toolCall].sort((x, y) => x.start - y.start);
  const randomId: Token[] = [];
  let c = 0;
  let reach = -1; // furthest end among claimed tokens starting before the current candidate
  for (const t of scan(ID_CANDIDATE)) {
    while (c < claimed.length && claimed[c]!.start < t.end) reach = Math.max(reach, claimed[c++]!.end);
    if (reach > t.start) continue;
    const shape = idShape(t.text);
    if (shape) randomId.push({ ...t, shape });
  }
  return { path, timestamp, uuid, toolCall, randomId };
}

/** The family of an id-like token, or null when it does not look like a generated id. */
function idShape(text: string): string | null {
  const prefixed = PREFIXED_ID.exec(text);
  if (prefixed && /[0-9]/.test(prefixed[2]!) && /[A-Za-z]/.test(prefixed[2]!)) return `prefix:${prefixed[1]}`;
  if (/^[0-9a-fA-F]{16,}$/.test(text)) return 'hex';
  if (/^[A-Za-z0-9]{20,}$/.test(text) && /[0-9]/.test(text) && /[a-z]/.test(text) && /[A-Z]/.test(text)) return 'base62';
  return null;
}

/** Occurrences of the recorded/replayed working directory, extended to the end of the path they start. */
function cwdTokens(s: string, window: string, lo: number, context: DivergenceContext): Token[] {
  const out: Token[] = [];
  for (const cwd of new Set([context.recordedCwd, context.replayedCwd])) {
    // "/" would make every slash a path.
    if (!cwd || cwd.replace(/[\\/]+$/, '').length < 2) continue;
    for (let i = window.indexOf(cwd); i >= 0; i = window.indexOf(cwd, i + 1)) {
      PATH_CHAR_RUN.lastIndex = i + cwd.length;
      const run = PATH_CHAR_RUN.exec(window);
      const end = i + cwd.length + (run ? run[0].length : 0);
      out.push({ start: lo + i, end: lo + end, text: s.slice(lo + i, lo + end) });
    }
  }
  return out;
}

/** Overlapping path tokens (a cwd inside a /home/… match) become one token. */
function mergeTokens(s: string, tokens: Token[]): Token[] {
  const sorted = tokens.sort((x, y) => x.start - y.start);
  const out: Token[] = [];
  for (const t of sorted) {
    const last = out[out.length - 1];
    if (last && t.start < last.end) {
      last.end = Math.max(last.end, t.end);
      last.text = s.slice(last.start, last.end);
    } else {
      out.push({ ...t });
    }
  }
  return out;
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}

function isLowSurrogate(code: number): boolean {
  return code >= 0xdc00 && code <= 0xdfff;
}
