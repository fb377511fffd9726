import { createHash } from 'node:crypto';
import { gunzipSync, gzipSync } from 'node:zlib';
import type { TraceReader } from './reader.js';
import { decodeExchange, encodeExchange, isValidTraceName, type StoredExchange, type TraceMeta } from './schema.js';
import type { TraceStore } from './store.js';

/**
 * A portable bundle holds one trace exactly: metadata, every exchange as stored (bytes, chunks, redaction
 * manifest), its replay reports and its workspace snapshot blobs. Layout (docs/trace-format.md):
 *
 *   mitm-replay-bundle 1\n
 *   sha256:<hex of the payload>\n
 *   <payload: gzip of the JSON document>
 */
const MAGIC = 'mitm-replay-bundle 1\n';
export const BUNDLE_SCHEMA = 'mitm-replay/bundle@1';

export class BundleError extends Error {}

interface BundleDocument {
  schema: typeof BUNDLE_SCHEMA;
  meta: TraceMeta;
  /** each exchange's stored value (src/trace/schema.ts encodeExchange), base64 */
  exchanges: string[];
  reports: unknown[];
  /** workspace blobs by hash, base64 */
  blobs: Record<string, string>;
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
  const meta = await reader.meta(name);
  if (!meta) throw new BundleError(`no trace named '${name}' (see 'mitm-replay ls')`);
  const exchanges: string[] = [];
  for (const record of await reader.records(meta.name)) {
    const exchange = await reader.exchange(meta.name, record.seq);
    if (exchange) exchanges.push(encodeExchange(exchange).toString('base64'));
  }
  const blobs: Record<string, string> = {};
  const snapshot = meta.workspace ? await reader.blob(meta.workspace.snapshot) : undefined;
  for (const hash of workspaceBlobHashes(meta, snapshot)) {
    const content = hash === meta.workspace?.snapshot ? snapshot : await reader.blob(hash);
    if (!content) throw new BundleError(`trace '${meta.name}' refers to workspace content ${hash.slice(0, 12)}… that is missing from the store`);
    blobs[hash] = content.toString('base64');
  }
  const document: BundleDocument = { schema: BUNDLE_SCHEMA, meta, exchanges, reports: await reader.reports(meta.name), blobs };
  return { bytes: serializeDocument(document), meta, exchanges: exchanges.length };
}

function serializeDocument(document: BundleDocument): Buffer {
  const payload = gzipSync(JSON.stringify(document));
  const digest = createHash('sha256').update(payload).digest('hex');
  return Buffer.concat([Buffer.from(`${MAGIC}sha256:${digest}\n`), payload]);
}

/** A bundle built in memory (e.g. from a HAR) as bundle bytes, for a daemon's import route. */
export function serializeBundle(bundle: Bundle): Buffer {
  const blobs: Record<string, string> = {};
  for (const [hash, content] of bundle.blobs) blobs[hash] = content.toString('base64');
  return serializeDocument({
    schema: BUNDLE_SCHEMA,
    meta: bundle.meta,
    exchanges: bundle.exchanges.map((e) => encodeExchange(e).toString('base64')),
    reports: bundle.reports,
    blobs,
  });
}

/** Checks a bundle's integrity and decodes it; a truncated or modified file is refused. */
export function parseBundle(bytes: Buffer, file: string): Bundle {
  if (!bytes.subarray(0, MAGIC.length).equals(Buffer.from(MAGIC))) {
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
  let document: BundleDocument;
  try {
    document = JSON.parse(gunzipSync(payload).toString('utf8')) as BundleDocument;
  } catch {
    throw new BundleError(`${file} passed its integrity check but does not decode; it was written by an incompatible version`);
  }
  if (document.schema !== BUNDLE_SCHEMA) throw new BundleError(`${file} is a '${document.schema}' bundle; this version reads ${BUNDLE_SCHEMA}`);
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
