import { toStructural } from '../capture/recorder.js';
import { collectGarbage, expiryFor, type RetentionPolicy } from './retention.js';
import { DEFAULT_STRUCTURAL, type StructuralOptions } from './structural.js';
import type { StoredExchange, TraceMeta } from './schema.js';
import type { TraceStore } from './store.js';

export class TierError extends Error {}

export interface ConversionResult {
  name: string;
  exchanges: number;
  deletedReports: number;
  droppedWorkspace: boolean;
  deletedBlobs: number;
  deletedChunks: number;
}

/**
 * full → structural, one way: every exchange is rewritten as its shape, the replay reports (which quote request
 * values) and the workspace snapshot (file contents) are dropped, blobs nothing else refers to are deleted, and
 * LevelDB is compacted so the old values leave the files on disk, not just the index.
 */
export async function convertToStructural(store: TraceStore, name: string, policy: RetentionPolicy, options: StructuralOptions = DEFAULT_STRUCTURAL): Promise<ConversionResult> {
  const meta = await store.getTrace(name);
  if (!meta) throw new TierError(`no trace named '${name}' (see 'mitm-replay ls')`);
  if (meta.tier === 'structural') throw new TierError(`trace '${name}' is already structural`);
  // Values still in LevelDB's memtable would be flushed into one table together with what replaces them, and a
  // compaction may move that table down whole (a "trivial move") instead of rewriting it: flush them first, so
  // the final compaction merges the old values with their replacements and drops them.
  await store.compact();
  const exchanges: StoredExchange[] = [];
  for await (const exchange of store.exchanges(name)) exchanges.push(exchange);
  for (const exchange of exchanges) await store.putExchange(name, toStructural(exchange, options));
  const deletedReports = await store.deleteReports(name);
  const updated: TraceMeta = { ...meta, tier: 'structural', structural: options, expiresAt: meta.kept ? meta.expiresAt : expiryFor(policy, meta.createdAt, 'structural') };
  delete updated.workspace;
  await store.putTrace(updated);
  const { deletedBlobs, deletedChunks } = await collectGarbage(store, null, new Set(), { sweep: 'always' });
  await store.compact();
  return { name, exchanges: exchanges.length, deletedReports, droppedWorkspace: meta.workspace !== undefined, deletedBlobs, deletedChunks };
}
