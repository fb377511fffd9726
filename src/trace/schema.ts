import type { Firing, RuleSet } from '../capture/redact.js';
import type { FileChange } from '../launch/workspace.js';
import type { StructuralOptions } from './structural.js';

export type { Firing };

/** Bumped whenever the stored layout changes in a way older readers cannot read. */
export const FORMAT_VERSION = 2;

export const TRACE_NAME = /^[A-Za-z0-9._-]{1,64}$/;

export function isValidTraceName(name: string): boolean {
  return TRACE_NAME.test(name) && name !== 'last' && name !== '.' && name !== '..';
}

/** `20261129-143002-a1b2`: UTC time plus a short random suffix. */
export function defaultTraceName(now = new Date()): string {
  const iso = now.toISOString(); // 2026-11-29T14:30:02.123Z
  const stamp = `${iso.slice(0, 10).replaceAll('-', '')}-${iso.slice(11, 19).replaceAll(':', '')}`;
  const suffix = Math.floor(Math.random() * 0x10000).toString(16).padStart(4, '0');
  return `${stamp}-${suffix}`;
}

export interface Origin {
  scheme: 'http' | 'https';
  host: string;
  port: number;
}

export interface TraceMeta {
  name: string;
  formatVersion: number;
  createdAt: number;
  finishedAt?: number;
  mode: 'record';
  /** how the trace was started: `record` (a launched command) or `daemon` (anonymous traffic) or `env` (a session) */
  source: 'record' | 'daemon' | 'env';
  command?: string[];
  cwd?: string;
  exitCode?: number;
  signal?: string;
  intercept: string[];
  redaction: RuleSet;
  /** times (epoch ms) at which a daemon resumed recording into this trace after a restart */
  restarts: number[];
  /** the working directory snapshot taken before `record` launched its command, and the diff after */
  workspace?: WorkspaceMeta;
  /** retention tier: `full` keeps every payload; `structural` keeps only the run's shape (trace/structural.ts) */
  tier?: 'full' | 'structural';
  /** how a structural trace reduced numbers and booleans */
  structural?: StructuralOptions;
  /** when the trace expires (epoch ms); absent in traces written before retention: see trace/retention.ts */
  expiresAt?: number;
  /** pinned with `mitm-replay keep`: never expires */
  kept?: boolean;
  /** some exchanges could not be written to the store: the trace is not a complete recording */
  broken?: { writeErrors: number };
}

export interface WorkspaceMeta {
  root: string;
  /** blob hash of the snapshot (JSON: every entry with the blob hash of its content) */
  snapshot: string;
  files: number;
  bytes: number;
  /** files whose content a redaction rule changed before storing */
  redactedFiles: string[];
  include: string[];
  exclude: string[];
  /** files added, removed and modified by the recorded run */
  diff?: FileChange[];
}

export type ExchangeState = 'open' | 'complete' | 'incomplete';

/** How a request reached the daemon. */
export type Route = 'connect' | 'base-url' | 'proxy';

export interface StoredMessageInfo {
  headLength: number;
  bodyLength: number;
  /** `decoded`: stored decoded because a redaction rule fired inside an encoded body; `reframed`: chunked framing replaced by Content-Length */
  flags: string[];
}

export interface StoredRequestInfo extends StoredMessageInfo {
  method: string;
  /** origin-form target as the origin received it (redacted) */
  target: string;
  /** hop-by-hop and Proxy-* header names dropped before forwarding, in order */
  droppedHeaders: string[];
  /** what the client sent differently (absolute-form target or base-URL path, Host) when not the same as stored */
  clientTarget?: string;
  /** SHA-256 of the stored head and body (replay's match key; `requestHash` in replay/matcher.ts) */
  hash?: string;
}

export interface StoredResponseInfo extends StoredMessageInfo {
  status: number;
  /** body chunks as they arrived: [offset in ms from the request start, length in bytes] */
  chunks: [number, number][];
}

export interface ExchangeRecord {
  seq: number;
  kind: 'http' | 'tunnel' | 'error';
  state: ExchangeState;
  origin: Origin;
  route: Route;
  startedAt: number;
  timings: { requestEndMs?: number; responseHeadMs?: number; endMs?: number };
  request?: StoredRequestInfo;
  response?: StoredResponseInfo;
  tunnel?: { bytesUp: number; bytesDown: number; durationMs: number };
  error?: { code: string; message: string; phase: 'connect' | 'tls' | 'request' | 'upstream' | 'response' | 'client' };
  redactions: Firing[];
}

/** An exchange with its (already redacted) bytes. */
export interface StoredExchange {
  record: ExchangeRecord;
  requestHead: Buffer;
  requestBody: Buffer;
  responseHead: Buffer;
  responseBody: Buffer;
}

const MAGIC = Buffer.from('MRX1');

/** Binary value: magic, JSON length, JSON record, then the four byte sections whose lengths the record gives. */
export function encodeExchange(ex: StoredExchange): Buffer {
  return Buffer.concat(encodeExchangeSections(ex));
}

/** The parts of `encodeExchange`'s value: the record (with magic and length), then the four byte sections. */
export function encodeExchangeSections(ex: StoredExchange): Buffer[] {
  return [recordHeader(MAGIC, ex.record), ex.requestHead, ex.requestBody, ex.responseHead, ex.responseBody];
}

/** The start every encoding of an exchange shares: its magic, the JSON record's length (u32 BE), the JSON. */
export function recordHeader(magic: Buffer, record: ExchangeRecord): Buffer {
  const json = Buffer.from(JSON.stringify(record));
  const len = Buffer.alloc(4);
  len.writeUInt32BE(json.length);
  return Buffer.concat([magic, len, json]);
}

export function decodeExchange(value: Buffer): StoredExchange {
  if (!value.subarray(0, 4).equals(MAGIC)) throw new Error('not an exchange record (bad magic)');
  const jsonLength = value.readUInt32BE(4);
  let pos = 8 + jsonLength;
  const record = JSON.parse(value.toString('utf8', 8, pos)) as ExchangeRecord;
  const take = (n: number): Buffer => {
    const part = value.subarray(pos, pos + n);
    pos += n;
    return part;
  };
  const requestHead = take(record.request?.headLength ?? 0);
  const requestBody = take(record.request?.bodyLength ?? 0);
  const responseHead = take(record.response?.headLength ?? 0);
  const responseBody = take(record.response?.bodyLength ?? 0);
  return { record, requestHead, requestBody, responseHead, responseBody };
}
