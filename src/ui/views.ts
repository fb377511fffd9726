/**
 * What the trace viewer shows, as JSON-ready data computed from any TraceReader (the daemon's store, the store
 * opened by `mitm-replay ui`, or `export --html`). The page renders these and computes nothing of its own.
 */
import { readComparison, type CompareResult } from '../replay/compare.js';
import { formatJsonPath, type Divergence } from '../replay/divergence.js';
import type { RequestOutcome } from '../replay/player.js';
import type { ReplayReport } from '../replay/verdict.js';
import { DEFAULT_INTERCEPT, isIntercepted } from '../proxy/intercept.js';
import { frameTimings } from '../trace/har.js';
import { bodyText, decodedBody, inspectExchange, type BodyText } from '../trace/inspect.js';
import type { TraceReader } from '../trace/reader.js';
import { expiresAt, type RetentionPolicy } from '../trace/retention.js';
import type { ExchangeRecord, StoredExchange, TraceMeta } from '../trace/schema.js';

/** Exchanges per timeline page (the page asks for exactly this, so an export can hold every page). */
export const TIMELINE_PAGE = 100;
/** Bodies shown decoded up to this size; the rest is said to be truncated. */
export const MAX_BODY_VIEW = 1024 * 1024;
/** Per exchange, bodies larger than this are not decoded for the timeline's model/tool/frame columns. */
const MAX_TIMELINE_INSIGHT = 4 * 1024 * 1024;
const MAX_JSON_LINES = 20_000;
const MAX_JSON_DEPTH = 200;

export class ViewError extends Error {
  constructor(
    message: string,
    readonly status = 404,
  ) {
    super(message);
  }
}

/** One row of the traces list: the columns of `mitm-replay ls`. */
export interface TraceRow {
  name: string;
  createdAt: number;
  tier: 'full' | 'structural';
  expiresAt: number | null;
  kept: boolean;
  exchanges: number;
  bytes: number;
  command: string | null;
  source: TraceMeta['source'];
  exitCode: number | null;
  lastVerdict: string | null;
  broken: boolean;
}

export async function traceRows(reader: TraceReader, policy: RetentionPolicy, only?: string): Promise<TraceRow[]> {
  const listings = await reader.list();
  return listings
    .filter(({ meta }) => only === undefined || meta.name === only)
    .map(({ meta, summary, lastVerdict }) => ({
      name: meta.name,
      createdAt: meta.createdAt,
      tier: meta.tier ?? 'full',
      expiresAt: expiresAt(meta, policy),
      kept: meta.kept ?? false,
      exchanges: summary.exchanges,
      bytes: summary.bytesUp + summary.bytesDown,
      command: meta.command ? meta.command.join(' ') : null,
      source: meta.source,
      exitCode: meta.exitCode ?? null,
      lastVerdict,
      broken: meta.broken !== undefined,
    }));
}

export type ExchangeKind = 'model' | 'tool' | 'tunnel' | 'error';

const MODEL_PATH = /\/(chat\/completions|completions|responses|messages|embeddings)$|:(stream)?generatecontent$|\/converse(-stream)?$|\/invoke(-with-response-stream)?$/i;

/** The timeline's colour: a failure, a tunnel, a call to a model provider, or any other (tool) HTTP call. */
export function exchangeKind(record: ExchangeRecord): ExchangeKind {
  if (record.kind === 'error' || record.error || record.state === 'incomplete') return 'error';
  if (record.kind === 'tunnel') return 'tunnel';
  const path = record.request?.target.split('?')[0] ?? '';
  return isIntercepted(DEFAULT_INTERCEPT, record.origin.host) || MODEL_PATH.test(path) ? 'model' : 'tool';
}

export function exchangeUrl(record: ExchangeRecord): string {
  const { scheme, host, port } = record.origin;
  const defaultPort = (scheme === 'https' && port === 443) || (scheme === 'http' && port === 80);
  const authority = `${host.includes(':') ? `[${host}]` : host}${defaultPort ? '' : `:${port}`}`;
  return record.kind === 'http' ? `${scheme}://${authority}${record.request?.target ?? ''}` : authority;
}

export interface TraceOverview {
  meta: TraceMeta;
  expiresAt: number | null;
  exchanges: number;
  reports: { runId: string; startedAt: number; finishedAt: number; ending: string; line: string; compare: ReplayReport['compare'] | null }[];
  compares: CompareGroup[];
}

export interface CompareGroup {
  id: string;
  finishedAt: number;
  runs: { runId: string; arm: 'control' | 'patched'; line: string }[];
  result: CompareResult;
}

async function metaOf(reader: TraceReader, name: string): Promise<TraceMeta> {
  const meta = await reader.meta(name);
  if (!meta) throw new ViewError(`no trace named '${name}'`);
  return meta;
}

async function reportsOf(reader: TraceReader, trace: string): Promise<ReplayReport[]> {
  return (await reader.reports(trace)) as ReplayReport[];
}

/** `compare` runs of a trace, grouped per invocation and read the way `compare` read them. */
export function compareGroups(reports: ReplayReport[]): CompareGroup[] {
  const groups = new Map<string, ReplayReport[]>();
  for (const report of reports) {
    if (report.compare) groups.set(report.compare.id, [...(groups.get(report.compare.id) ?? []), report]);
  }
  return [...groups.entries()].map(([id, runs]) => ({
    id,
    finishedAt: Math.max(...runs.map((r) => r.finishedAt)),
    runs: runs.map((r) => ({ runId: r.runId, arm: r.compare!.arm, line: r.line })),
    result: readComparison(
      runs.filter((r) => r.compare!.arm === 'control'),
      runs.filter((r) => r.compare!.arm === 'patched'),
    ),
  }));
}

export async function traceOverview(reader: TraceReader, policy: RetentionPolicy, name: string): Promise<TraceOverview> {
  const meta = await metaOf(reader, name);
  const reports = await reportsOf(reader, meta.name);
  return {
    meta,
    expiresAt: expiresAt(meta, policy),
    exchanges: (await reader.records(meta.name)).length,
    reports: reports.map((r) => ({ runId: r.runId, startedAt: r.startedAt, finishedAt: r.finishedAt, ending: r.verdict.ending, line: r.line, compare: r.compare ?? null })),
    compares: compareGroups(reports),
  };
}

export interface TimelineEntry {
  seq: number;
  kind: ExchangeKind;
  state: ExchangeRecord['state'];
  route: ExchangeRecord['route'];
  label: string;
  url: string;
  status: number | null;
  /** ms from the trace's first exchange */
  startMs: number;
  requestEndMs: number | null;
  /** time to first byte (the response head) */
  responseHeadMs: number | null;
  endMs: number;
  /** streamed SSE frames: ms from the exchange's start at which each completed */
  frames: number[];
  /** body chunks as they arrived (ms from the exchange's start) */
  chunks: number[];
  bytesUp: number;
  bytesDown: number;
  model: string | null;
  usage: { input: number | null; output: number | null } | null;
  toolCalls: string[];
  error: string | null;
}

export interface TimelinePage {
  trace: string;
  total: number;
  offset: number;
  limit: number;
  entries: TimelineEntry[];
}

function durationOf(r: ExchangeRecord): number {
  return r.tunnel?.durationMs ?? r.timings.endMs ?? r.timings.responseHeadMs ?? r.timings.requestEndMs ?? 0;
}

function timelineEntry(r: ExchangeRecord, t0: number, ex: StoredExchange | undefined): TimelineEntry {
  const insight = ex && r.kind === 'http' && r.response && ex.requestBody.length + ex.responseBody.length <= MAX_TIMELINE_INSIGHT ? inspectExchange(ex) : null;
  const label =
    r.kind === 'http'
      ? `${r.request?.method ?? '?'} ${exchangeUrl(r).replace(/\?.*$/, '')}`
      : r.kind === 'tunnel'
        ? `TUNNEL ${exchangeUrl(r)}`
        : `ERROR ${exchangeUrl(r)}`;
  return {
    seq: r.seq,
    kind: exchangeKind(r),
    state: r.state,
    route: r.route,
    label,
    url: exchangeUrl(r),
    status: r.response?.status ?? null,
    startMs: r.startedAt - t0,
    requestEndMs: r.timings.requestEndMs ?? null,
    responseHeadMs: r.timings.responseHeadMs ?? null,
    endMs: durationOf(r),
    frames: insight && ex && insight.frames.length > 0 ? frameTimings(ex, insight.frames).map((f) => f.offsetMs) : [],
    chunks: (r.response?.chunks ?? []).map(([offset]) => offset),
    bytesUp: r.tunnel?.bytesUp ?? (r.request?.headLength ?? 0) + (r.request?.bodyLength ?? 0),
    bytesDown: r.tunnel?.bytesDown ?? (r.response?.headLength ?? 0) + (r.response?.bodyLength ?? 0),
    model: insight?.model ?? null,
    usage: insight?.usage ?? null,
    toolCalls: insight?.toolCalls ?? [],
    error: r.error ? `${r.error.code}: ${r.error.message}` : null,
  };
}

export async function timelinePage(reader: TraceReader, name: string, offset: number, limit = TIMELINE_PAGE): Promise<TimelinePage> {
  const meta = await metaOf(reader, name);
  const records = await reader.records(meta.name);
  const t0 = Math.min(...records.map((r) => r.startedAt), meta.createdAt);
  const page = records.slice(offset, offset + limit);
  const entries: TimelineEntry[] = [];
  for (const r of page) entries.push(timelineEntry(r, t0, r.kind === 'http' && r.response ? await reader.exchange(meta.name, r.seq) : undefined));
  return { trace: meta.name, total: records.length, offset, limit, entries };
}

/** One line of pretty-printed JSON and the path (JsonDifference.path notation) of the value it belongs to. */
export interface JsonLine {
  text: string;
  path: string;
  /** where a string value starts in `text` (its opening quote), so the page can mark the differing part */
  v?: number;
}

/** Pretty-prints a JSON document (2 spaces) line by line, each line tagged with its value's path. */
export function jsonLines(doc: unknown): { lines: JsonLine[]; truncated: boolean } {
  const lines: JsonLine[] = [];
  let truncated = false;
  const emit = (depth: number, text: string, keys: (string | number)[], valueAt?: number) => {
    if (lines.length >= MAX_JSON_LINES) {
      truncated = true;
      return;
    }
    const indent = '  '.repeat(depth);
    lines.push({ text: `${indent}${text}`, path: formatJsonPath(keys), ...(valueAt === undefined ? {} : { v: indent.length + valueAt }) });
  };
  const walk = (value: unknown, keys: (string | number)[], prefix: string, suffix: string) => {
    if (truncated) return;
    const depth = keys.length;
    const container = typeof value === 'object' && value !== null;
    if (!container || depth >= MAX_JSON_DEPTH) {
      emit(depth, `${prefix}${JSON.stringify(value)}${suffix}`, keys, typeof value === 'string' ? prefix.length : undefined);
      return;
    }
    const entries: [string | number, unknown][] = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
    const [open, close] = Array.isArray(value) ? ['[', ']'] : ['{', '}'];
    if (entries.length === 0) {
      emit(depth, `${prefix}${open}${close}${suffix}`, keys);
      return;
    }
    emit(depth, `${prefix}${open}`, keys);
    entries.forEach(([key, child], i) => walk(child, [...keys, key], typeof key === 'number' ? '' : `${JSON.stringify(key)}: `, i < entries.length - 1 ? ',' : ''));
    emit(depth, `${close}${suffix}`, keys);
  };
  walk(doc, [], '', '');
  return { lines, truncated };
}

/** A body for display: text (or base64), and its JSON lines when it is a whole JSON document. */
export interface BodyView extends BodyText {
  json: JsonLine[] | null;
  jsonTruncated: boolean;
}

export function bodyView(body: Buffer | BodyText): BodyView {
  const text = Buffer.isBuffer(body) ? bodyText(body, MAX_BODY_VIEW) : body;
  let doc: unknown;
  let parsed = false;
  if (text.encoding === 'utf8' && !text.truncated && /^\s*[[{]/.test(text.text)) {
    try {
      doc = JSON.parse(text.text);
      parsed = true;
    } catch {
      // not JSON: shown as text
    }
  }
  const json = parsed ? jsonLines(doc) : null;
  return { ...text, json: json?.lines ?? null, jsonTruncated: json?.truncated ?? false };
}

export interface ExchangeDetail {
  record: ExchangeRecord;
  kind: ExchangeKind;
  url: string;
  request: { head: string; body: BodyView } | null;
  response: { head: string; body: BodyView } | null;
  frames: { index: number; offsetMs: number; byteOffset: number; text: string }[];
  model: string | null;
  usage: { input: number | null; output: number | null } | null;
  toolCalls: string[];
}

async function exchangeOf(reader: TraceReader, name: string, seq: number): Promise<{ meta: TraceMeta; ex: StoredExchange }> {
  const meta = await metaOf(reader, name);
  const ex = await reader.exchange(meta.name, seq);
  if (!ex) throw new ViewError(`trace ${meta.name} has no exchange #${seq}`);
  return { meta, ex };
}

export async function exchangeDetail(reader: TraceReader, name: string, seq: number): Promise<ExchangeDetail> {
  const { ex } = await exchangeOf(reader, name, seq);
  const { record } = ex;
  const insight = record.kind === 'http' ? inspectExchange(ex) : null;
  const head = (b: Buffer) => b.toString('latin1');
  return {
    record,
    kind: exchangeKind(record),
    url: exchangeUrl(record),
    request: record.kind === 'http' && insight ? { head: head(ex.requestHead), body: bodyView(insight.requestBody) } : null,
    response: insight && ex.responseHead.length > 0 ? { head: head(ex.responseHead), body: bodyView(insight.responseBody) } : null,
    frames: insight ? frameTimings(ex, insight.frames).map((f, index) => ({ index, offsetMs: f.offsetMs, byteOffset: f.byteOffset, text: f.data })) : [],
    model: insight?.model ?? null,
    usage: insight?.usage ?? null,
    toolCalls: insight?.toolCalls ?? [],
  };
}

/** The stored bytes of an exchange (the raw-bytes toggle), as latin1 text, each part capped. */
export async function exchangeRaw(reader: TraceReader, name: string, seq: number, max = MAX_BODY_VIEW): Promise<{ parts: { name: string; bytes: number; text: string; truncated: boolean }[] }> {
  const { ex } = await exchangeOf(reader, name, seq);
  const part = (partName: string, b: Buffer) => ({ name: partName, bytes: b.length, text: b.subarray(0, max).toString('latin1'), truncated: b.length > max });
  return { parts: [part('request head', ex.requestHead), part('request body', ex.requestBody), part('response head', ex.responseHead), part('response body', ex.responseBody)] };
}

async function reportOf(reader: TraceReader, name: string, runId: string): Promise<{ meta: TraceMeta; report: ReplayReport }> {
  const meta = await metaOf(reader, name);
  const reports = await reportsOf(reader, meta.name);
  const report = runId === 'last' ? reports.at(-1) : reports.find((r) => r.runId === runId);
  if (!report) throw new ViewError(runId === 'last' ? `trace ${meta.name} has not been replayed yet` : `trace ${meta.name} has no replay run '${runId}'`);
  return { meta, report };
}

/** A report without the replayed request bodies (fetched one at a time by requestComparison). */
export async function reportView(reader: TraceReader, name: string, runId: string): Promise<ReplayReport> {
  const { report } = await reportOf(reader, name, runId);
  return { ...report, requests: report.requests.map(({ replayedRequest: _omitted, ...rest }) => rest) };
}

export interface RequestComparison {
  trace: string;
  runId: string;
  request: Omit<RequestOutcome, 'replayedRequest'>;
  divergence: Divergence | null;
  recorded: { seq: number; head: string; body: BodyView } | null;
  /** null for reports written before reports kept the replayed request */
  replayed: { head: string; body: BodyView } | null;
}

/** Recorded vs replayed request of one replayed request (the side-by-side diff). */
export async function requestComparison(reader: TraceReader, name: string, runId: string, index: number): Promise<RequestComparison> {
  const { meta, report } = await reportOf(reader, name, runId);
  const outcome = report.requests.find((r) => r.index === index);
  if (!outcome) throw new ViewError(`replay run ${report.runId} has no request #${index}`);
  const { replayedRequest, ...request } = outcome;
  let recorded: RequestComparison['recorded'] = null;
  if (outcome.recordedSeq !== null) {
    const ex = await reader.exchange(meta.name, outcome.recordedSeq);
    if (ex) recorded = { seq: outcome.recordedSeq, head: ex.requestHead.toString('latin1'), body: bodyView(decodedBody(ex.requestHead, ex.requestBody)) };
  }
  return {
    trace: meta.name,
    runId: report.runId,
    request,
    divergence: outcome.divergence,
    recorded,
    replayed: replayedRequest ? { head: replayedRequest.head, body: bodyView(replayedRequest.body) } : null,
  };
}
