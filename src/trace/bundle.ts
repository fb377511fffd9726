import { createHash } from 'node:crypto';
import { gunzipSync, gzipSync } from 'node:zlib';
import { readWholeTrace, type TraceReader } from './reader.js';
import { decodeExchange, encodeExchange, encodeExchangeSections, isValidTraceName, type StoredExchange, type TraceMeta } from './schema.js';
import type { TraceStore } from './store.js';
import { dedupe } from './chunking.js';

/**
 * A portable bundle holds one trace exactly: metadata, every exchange as stored (bytes, chunks, redaction
 * manifest), its replay reports and its workspace snapshot blobs. Layout (docs/trace-format.md):
 *
 *   mitm-replay-bundle 2\n
 *   sha256:<hex of the payload>\n
 *   <payload: gzip of [u32 BE header length | JSON header | distinct chunks | blob contents]>
 *
 * Exchange values are cut into content-defined chunks (trace/chunking.ts) and each distinct chunk is stored
 * once: agents resend the whole conversation on every turn, so most of a run's bytes are repeats, too far apart
 * for gzip's 32 KiB window to find. Version 1 (one JSON document, bytes as base64) still imports.
 */
const MAGIC_V1 = 'mitm-replay-bundle 1\n';
const MAGIC = 'mitm-replay-bundle 2\n';
export const BUNDLE_SCHEMA = 'mitm-replay/bundle@2';
const BUNDLE_SCHEMA_V1 = 'mitm-replay/bundle@1';

export class BundleError extends Error {}

/** Version 1: everything in one JSON document, bytes as base64. */
interface BundleDocument {
  schema: typeof BUNDLE_SCHEMA_V1;
  meta: TraceMeta;
  /** each exchange's stored value (src/trace/schema.ts encodeExchange), base64 */
  exchanges: string[];
  reports: unknown[];
  /** workspace blobs by hash, base64 */
  blobs: Record<string, string>;
}

/** Version 2 header: the byte sections follow it in this order, with these lengths. */
interface BundleHeader {
  schema: typeof BUNDLE_SCHEMA;
  meta: TraceMeta;
  reports: unknown[];
  /** per exchange, the indices of its chunks in order */
  exchanges: number[][];
  chunkLengths: number[];
  blobs: { hash: string; length: number }[];
}

export interface Bundle {
  meta: TraceMeta;
  exchanges: StoredExchange[];
  reports: { runId: string; finishedAt: number }[];
  blobs: Map<string, Buffer>;
}

/** Blob hashes a trace refers to: its workspace snapshot and every file content in it. */
function workspaceBlobHashes(meta: TraceMeta, snapshot: Buffer | undefined): string[] {
  if (!meta.workspace) return [];
  const hashes = [meta.workspace.snapshot];
  if (snapshot) {
    const parsed = JSON.parse(snapshot.toString('utf8')) as { entries: { hash?: string }[] };
    for (const entry of parsed.entries) if (entry.hash) hashes.push(entry.hash);
  }
  return [...new Set(hashes)];
}

export async function exportBundle(reader: TraceReader, name: string): Promise<{ bytes: Buffer; meta: TraceMeta; exchanges: number }> {
  const whole = await readWholeTrace(reader, name);
  if (!whole) throw new BundleError(`no trace named '${name}' (see 'mitm-replay ls')`);
  const { meta, exchanges } = whole;
  const blobs = new Map<string, Buffer>();
  const snapshot = meta.workspace ? await reader.blob(meta.workspace.snapshot) : undefined;
  for (const hash of workspaceBlobHashes(meta, snapshot)) {
    const content = hash === meta.workspace?.snapshot ? snapshot : await reader.blob(hash);
    if (!content) throw new BundleError(`trace '${meta.name}' refers to workspace content ${hash.slice(0, 12)}… that is missing from the store`);
    blobs.set(hash, content);
  }
  const reports = (await reader.reports(meta.name)) as Bundle['reports'];
  return { bytes: serializeBundle({ meta, exchanges, reports, blobs }), meta, exchanges: exchanges.length };
}

/** A bundle (exported, or built in memory from a HAR) as bundle bytes. */
export function serializeBundle(bundle: Bundle): Buffer {
  // Each section is chunked on its own: a body's chunks then start at its first byte whatever the record before it
  // holds, so a resent prefix cuts the same even where content-defined boundaries are rare (a structural body's
  // long filler runs have none).
  const sections = bundle.exchanges.map(encodeExchangeSections);
  const { chunks, refs: sectionRefs } = dedupe(sections.flat());
  let next = 0;
  const refs = sections.map((parts) => sectionRefs.slice(next, (next += parts.length)).flat());
  const blobs = [...bundle.blobs];
  const header: BundleHeader = {
    schema: BUNDLE_SCHEMA,
    meta: bundle.meta,
    reports: bundle.reports,
    exchanges: refs,
    chunkLengths: chunks.map((c) => c.length),
    blobs: blobs.map(([hash, content]) => ({ hash, length: content.length })),
  };
  const json = Buffer.from(JSON.stringify(header));
  const length = Buffer.alloc(4);
  length.writeUInt32BE(json.length);
  const payload = gzipSync(Buffer.concat([length, json, ...chunks, ...blobs.map(([, content]) => content)]), { level: 9 });
  const digest = createHash('sha256').update(payload).digest('hex');
  return Buffer.concat([Buffer.from(`${MAGIC}sha256:${digest}\n`), payload]);
}

/** Checks a bundle's integrity and decodes it; a truncated or modified file is refused. */
export function parseBundle(bytes: Buffer, file: string): Bundle {
  const version = bytes.subarray(0, MAGIC.length).equals(Buffer.from(MAGIC)) ? 2 : bytes.subarray(0, MAGIC_V1.length).equals(Buffer.from(MAGIC_V1)) ? 1 : 0;
  if (version === 0) {
    if (/^mitm-replay-bundle \d+\n/.test(bytes.toString('latin1', 0, 40))) throw new BundleError(`${file} is a bundle from a newer mitm-replay (${bytes.toString('latin1', 0, bytes.indexOf('\n')).trim()}); upgrade to import it`);
    throw new BundleError(`${file} is not a mitm-replay bundle (made by 'mitm-replay export NAME --bundle FILE')`);
  }
  const lineEnd = bytes.indexOf('\n', MAGIC.length);
  const declared = /^sha256:([0-9a-f]{64})$/.exec(bytes.toString('latin1', MAGIC.length, lineEnd < 0 ? MAGIC.length + 80 : lineEnd))?.[1];
  if (!declared || lineEnd < 0) throw new BundleError(`${file} is damaged: its integrity line is missing; ask for a new copy`);
  const payload = bytes.subarray(lineEnd + 1);
  const actual = createHash('sha256').update(payload).digest('hex');
  if (actual !== declared) {
    throw new BundleError(`${file} failed its integrity check (content hash ${actual.slice(0, 12)}… instead of ${declared.slice(0, 12)}…): it was truncated or modified; ask for a new copy`);
  }
  let content: Buffer;
  try {
    content = gunzipSync(payload);
  } catch {
    throw new BundleError(`${file} passed its integrity check but does not decode; it was written by an incompatible version`);
  }
  if (version === 2) return decodeV2(content, file);
  const document = JSON.parse(content.toString('utf8')) as BundleDocument;
  if (document.schema !== BUNDLE_SCHEMA_V1) throw new BundleError(`${file} is a '${document.schema}' bundle; this version reads ${BUNDLE_SCHEMA} and ${BUNDLE_SCHEMA_V1}`);
  const blobs = new Map<string, Buffer>();
  for (const [hash, content] of Object.entries(document.blobs)) {
    const buffer = Buffer.from(content, 'base64');
    if (createHash('sha256').update(buffer).digest('hex') !== hash) throw new BundleError(`${file}: workspace content ${hash.slice(0, 12)}… does not match its hash`);
    blobs.set(hash, buffer);
  }
  return {
    meta: document.meta,
    exchanges: document.exchanges.map((e) => decodeExchange(Buffer.from(e, 'base64'))),
    reports: document.reports as Bundle['reports'],
    blobs,
  };
}

function decodeV2(content: Buffer, file: string): Bundle {
  const jsonLength = content.readUInt32BE(0);
  const header = JSON.parse(content.toString('utf8', 4, 4 + jsonLength)) as BundleHeader;
  if (header.schema !== BUNDLE_SCHEMA) throw new BundleError(`${file} is a '${header.schema}' bundle; this version reads ${BUNDLE_SCHEMA}`);
  let pos = 4 + jsonLength;
  const take = (n: number): Buffer => {
    if (pos + n > content.length) throw new BundleError(`${file} is damaged: its sections are shorter than its header says`);
    const part = content.subarray(pos, pos + n);
    pos += n;
    return part;
  };
  const chunks = header.chunkLengths.map((n) => take(n));
  const exchanges = header.exchanges.map((ids) => {
    if (ids.some((id) => chunks[id] === undefined)) throw new BundleError(`${file} is damaged: an exchange refers to a chunk it does not hold`);
    return decodeExchange(Buffer.concat(ids.map((id) => chunks[id]!)));
  });
  const blobs = new Map<string, Buffer>();
  for (const { hash, length } of header.blobs) {
    const buffer = Buffer.from(take(length));
    if (createHash('sha256').update(buffer).digest('hex') !== hash) throw new BundleError(`${file}: workspace content ${hash.slice(0, 12)}… does not match its hash`);
    blobs.set(hash, buffer);
  }
  return { meta: header.meta, exchanges, reports: header.reports as Bundle['reports'], blobs };
}

/** Writes a bundle's trace into a store, as `name`. Refuses to overwrite a different trace unless `force`. */
export async function importBundle(
  store: TraceStore,
  bundle: Bundle,
  /** `expiresAt`: a full trace's retention runs from its import */
  options: { name?: string; force?: boolean; expiresAt?: number },
): Promise<{ name: string; exchanges: number; unchanged: boolean }> {
  const name = options.name ?? bundle.meta.name;
  if (!isValidTraceName(name)) throw new BundleError(`invalid trace name '${name}': use 1-64 characters of A-Z a-z 0-9 . _ -`);
  const existing = await store.getTrace(name);
  if (existing) {
    const same = existing.createdAt === bundle.meta.createdAt && (await sameExchanges(store, name, bundle.exchanges));
    if (same) return { name, exchanges: bundle.exchanges.length, unchanged: true };
    if (!options.force) throw new BundleError(`a different trace named '${name}' exists: import under another name with --trace NAME, or replace it with --force`);
    await store.deleteTrace(name);
  }
  for (const content of bundle.blobs.values()) await store.putBlob(content);
  for (const exchange of bundle.exchanges) await store.putExchange(name, exchange);
  for (const report of bundle.reports) await store.putReport(name, report.runId, report);
  await store.putTrace({ ...bundle.meta, name, kept: false, ...(options.expiresAt === undefined ? {} : { expiresAt: options.expiresAt }) });
  return { name, exchanges: bundle.exchanges.length, unchanged: false };
}

async function sameExchanges(store: TraceStore, name: string, exchanges: StoredExchange[]): Promise<boolean> {
  let i = 0;
  for await (const stored of store.exchanges(name)) {
    const other = exchanges[i++];
    if (!other || !encodeExchange(stored).equals(encodeExchange(other))) return false;
  }
  return i === exchanges.length;
}
