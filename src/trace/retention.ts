import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { TraceMeta } from './schema.js';
import { DEFAULT_STRUCTURAL, type StructuralOptions } from './structural.js';
import type { TraceStore } from './store.js';

/**
 * How long traces are kept. A full trace is a complete transcript: it expires (default 72 hours after it was
 * recorded or imported) unless pinned with `mitm-replay keep`; a structural trace (shapes only) after 90 days.
 * Set in HOME/config.json:
 *   { "retention": { "fullHours": 72, "structuralDays": 90 } }
 */
export interface RetentionPolicy {
  fullHours: number;
  structuralDays: number;
}

export const DEFAULT_RETENTION: RetentionPolicy = { fullHours: 72, structuralDays: 90 };
const HOUR_MS = 60 * 60 * 1000;

export class RetentionConfigError extends Error {}

export function loadRetention(home: string): RetentionPolicy {
  const file = join(home, 'config.json');
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return DEFAULT_RETENTION;
  }
  let config: { retention?: { fullHours?: unknown; structuralDays?: unknown } };
  try {
    config = JSON.parse(text) as typeof config;
  } catch (err) {
    throw new RetentionConfigError(`${file} is not valid JSON (${(err as Error).message}); fix or remove it`);
  }
  const hours = config.retention?.fullHours ?? DEFAULT_RETENTION.fullHours;
  if (typeof hours !== 'number' || !(hours > 0)) throw new RetentionConfigError(`${file}: retention.fullHours must be a positive number of hours`);
  const days = config.retention?.structuralDays ?? DEFAULT_RETENTION.structuralDays;
  if (typeof days !== 'number' || !(days > 0)) throw new RetentionConfigError(`${file}: retention.structuralDays must be a positive number of days`);
  return { fullHours: hours, structuralDays: days };
}

/**
 * How a structural trace reduces numbers and booleans (HOME/config.json), e.g.
 *   { "structural": { "numbers": "zero", "booleans": "keep" } }
 */
export function loadStructuralOptions(home: string): StructuralOptions {
  const file = join(home, 'config.json');
  let config: { structural?: { numbers?: unknown; booleans?: unknown } };
  try {
    config = JSON.parse(readFileSync(file, 'utf8')) as typeof config;
  } catch (err) {
    if ((err as { code?: string }).code === 'ENOENT') return DEFAULT_STRUCTURAL;
    throw new RetentionConfigError(`${file} is not valid JSON (${(err as Error).message}); fix or remove it`);
  }
  const pick = (value: unknown, name: string): 'keep' | 'zero' => {
    if (value === undefined) return DEFAULT_STRUCTURAL[name as keyof StructuralOptions];
    if (value !== 'keep' && value !== 'zero') throw new RetentionConfigError(`${file}: structural.${name} must be "keep" or "zero"`);
    return value;
  };
  return { numbers: pick(config.structural?.numbers, 'numbers'), booleans: pick(config.structural?.booleans, 'booleans') };
}

/** When a trace of `tier` created (or imported) at `from` expires under the policy. */
export function expiryFor(policy: RetentionPolicy, from: number, tier: 'full' | 'structural' = 'full'): number {
  return from + (tier === 'structural' ? policy.structuralDays * 24 : policy.fullHours) * HOUR_MS;
}

/** Traces written before retention existed have no expiry field: they expire by their creation time. */
export function expiresAt(meta: TraceMeta, policy: RetentionPolicy): number | null {
  if (meta.kept) return null;
  return meta.expiresAt ?? expiryFor(policy, meta.createdAt, meta.tier);
}

export function isExpired(meta: TraceMeta, policy: RetentionPolicy, now = Date.now()): boolean {
  const at = expiresAt(meta, policy);
  return at !== null && at <= now;
}

export interface GcResult {
  deletedTraces: string[];
  deletedBlobs: number;
  /** body chunks no remaining exchange refers to */
  deletedChunks: number;
}

/**
 * Deletes expired traces, then every blob no remaining trace refers to (workspace snapshots and files) and every
 * body chunk no remaining exchange refers to. Looking for unreferenced chunks reads every exchange, so by default
 * it happens only when a trace was deleted since the last look (the daemon's hourly run); `sweep: 'always'` looks
 * anyway (the `gc` command, and a tier conversion, which rewrites exchanges without deleting a trace).
 */
export async function collectGarbage(
  store: TraceStore,
  policy: RetentionPolicy | null,
  live: Set<string>,
  options: { now?: number; sweep?: 'always' | 'if-needed' } = {},
): Promise<GcResult> {
  const now = options.now ?? Date.now();
  const deletedTraces: string[] = [];
  const remaining: TraceMeta[] = [];
  for (const meta of await store.listTraces()) {
    // A trace being recorded right now is never collected; a null policy collects blobs only.
    if (policy && !live.has(meta.name) && isExpired(meta, policy, now)) {
      await store.deleteTrace(meta.name);
      deletedTraces.push(meta.name);
    } else remaining.push(meta);
  }
  const referenced = new Set<string>();
  for (const meta of remaining) {
    if (!meta.workspace) continue;
    referenced.add(meta.workspace.snapshot);
    const snapshot = await store.getBlob(meta.workspace.snapshot);
    if (!snapshot) continue;
    for (const entry of (JSON.parse(snapshot.toString('utf8')) as { entries: { hash?: string }[] }).entries) {
      if (entry.hash) referenced.add(entry.hash);
    }
  }
  let deletedBlobs = 0;
  for (const hash of await store.blobHashes()) {
    if (referenced.has(hash)) continue;
    await store.deleteBlob(hash);
    deletedBlobs++;
  }
  const deletedChunks = options.sweep === 'always' || store.chunksMayBeUnreferenced ? await store.sweepChunks() : 0;
  // the expired payloads leave the files on disk, not just the index
  if (deletedTraces.length > 0) await store.compact();
  return { deletedTraces, deletedBlobs, deletedChunks };
}
