import { createHash } from 'node:crypto';
import { Level } from 'level';
import { LRUCache } from 'lru-cache';
import { FORMAT_VERSION, decodeExchange, type ExchangeRecord, type StoredExchange, type TraceMeta } from './schema.js';
import { chunkRefs, decodeStoredValue, encodeStoredValue, isFormat2, recordOf } from './stored-value.js';

export interface StoreOptions {
  /** LevelDB's Snappy compression; switched off by tests that scan the files for plaintext. */
  compression?: boolean;
}

export class StoreLockedError extends Error {}

/** The store was written in a format this version cannot read. */
export class StoreFormatError extends Error {}

/** Key holding the store's format version (decimal). Stores from before it existed are version 1. */
const FORMAT_KEY = 'v:format';

/**
 * Every store records its format version. A newer one than this code knows is refused with the reason; an older
 * one is migrated when opened (`TraceStore.migrate`). Returns the version found.
 */
async function checkFormat(db: Level<string, Buffer>, path: string): Promise<number> {
  const stored = await db.get(FORMAT_KEY);
  if (stored === undefined) {
    // No version key: a new store, or one written before the key existed (format 1), which has traces.
    for await (const _ of db.keys({ gte: 't:', lt: 't;', limit: 1 })) return 1;
    return FORMAT_VERSION;
  }
  const version = Number(stored.toString('utf8'));
  if (!Number.isInteger(version) || version < 1) throw new StoreFormatError(`the trace store ${path} has an unreadable format version '${stored.toString('utf8')}'; it is damaged or not a mitm-replay store`);
  if (version > FORMAT_VERSION) {
    throw new StoreFormatError(`the trace store ${path} was written by a newer mitm-replay (format ${version}; this version reads ${FORMAT_VERSION}): upgrade mitm-replay, or use another --home`);
  }
  return version;
}

/** What opening the store did to bring an older format up to date. */
export interface Migration {
  from: number;
  to: number;
  exchanges: number;
}

export interface TraceSummary {
  exchanges: number;
  complete: number;
  incomplete: number;
  errors: number;
  bytesUp: number;
  bytesDown: number;
  /** hosts seen only as undecrypted tunnels */
  tunnelledHosts: string[];
}

const key = {
  meta: (name: string) => `t:${name}:meta`,
  exchange: (name: string, seq: number) => `t:${name}:x:${String(seq).padStart(10, '0')}`,
  exchangeRange: (name: string) => ({ gte: `t:${name}:x:`, lt: `t:${name}:x;` }),
  traceRange: (name: string) => ({ gte: `t:${name}:`, lt: `t:${name};` }),
  report: (name: string, runId: string) => `t:${name}:r:${runId}`,
  blob: (hash: string) => `b:${hash}`,
  chunk: (hash: string) => `c:${hash}`,
  reportRange: (name: string) => ({ gte: `t:${name}:r:`, lt: `t:${name}:r;` }),
};

/**
 * The trace store: LevelDB via `level`. It knows nothing of HTTP; it stores trace metadata and
 * already-redacted exchange records. One process at a time may open it (LevelDB's LOCK).
 */
export class TraceStore {
  /** exchange writes waiting for the next batch; a later write of the same key replaces the queued one */
  private readonly queued = new Map<string, Buffer>();
  private queuedWaiters: { resolve: () => void; reject: (err: Error) => void }[] = [];
  private flushing: Promise<void> = Promise.resolve();
  private flushScheduled = false;
  /** body chunks known to be in the store (or queued): a resent prefix is not written again */
  private readonly knownChunks = new LRUCache<string, true>({ max: 50_000 });
  /** while a chunk sweep runs: chunks that exchanges written meanwhile refer to, which it must not delete */
  private sweepPins: Set<string> | null = null;
  /** set when opening migrated an older store */
  migration: Migration | null = null;
  /** a trace was deleted since the last chunk sweep (or none ran since the store was opened) */
  chunksMayBeUnreferenced = true;

  private constructor(private readonly db: Level<string, Buffer>) {}

  static async open(path: string, options: StoreOptions = {}): Promise<TraceStore> {
    // MITM_REPLAY_STORE_COMPRESSION=0 switches Snappy off (tests that scan the files for plaintext use it).
    const compression = options.compression ?? process.env.MITM_REPLAY_STORE_COMPRESSION !== '0';
    const db = new Level<string, Buffer>(path, { keyEncoding: 'utf8', valueEncoding: 'buffer', compression } as never);
    try {
      await db.open();
    } catch (err) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      if (cause?.code === 'LEVEL_LOCKED' || /lock/i.test(cause?.message ?? '')) {
        throw new StoreLockedError(`the trace store ${path} is in use by another mitm-replay process (a command still running, or a viewer reading it): try again when it has finished`);
      }
      throw err;
    }
    const store = new TraceStore(db);
    try {
      const version = await checkFormat(db, path);
      if (version < FORMAT_VERSION) store.migration = await store.migrate(version);
      else await db.put(FORMAT_KEY, Buffer.from(String(FORMAT_VERSION)));
    } catch (err) {
      await db.close();
      throw err;
    }
    return store;
  }

  /**
   * Format 1 → 2: exchange values kept their bodies inline; now large bodies are content-defined chunks stored
   * once. Each exchange is rewritten in one batch with its chunks, and both formats decode, so a migration cut
   * short (a crash) leaves a readable store and simply continues on the next open. The version is written last.
   */
  private async migrate(from: number): Promise<Migration> {
    let exchanges = 0;
    for await (const [k, v] of this.db.iterator({ gte: 't:', lt: 't;' })) {
      if (!k.includes(':x:') || isFormat2(v)) continue;
      // as any exchange is written: in one batch with its chunks, skipping the chunks already written
      await this.putExchange(k.slice(2, k.indexOf(':x:')), decodeExchange(v));
      exchanges++;
    }
    await this.db.put(FORMAT_KEY, Buffer.from(String(FORMAT_VERSION)));
    // the format-1 values leave the files
    if (exchanges > 0) await this.compact();
    return { from, to: FORMAT_VERSION, exchanges };
  }

  async close(): Promise<void> {
    await this.flushQueue();
    await this.db.close();
  }

  /**
   * Exchange writes are batched: everything queued during one turn of the event loop goes to LevelDB as one
   * batch (one native call instead of one per write), batches in order. The promise resolves once the write is
   * in LevelDB (its write-ahead log), so a completed exchange still survives a SIGKILL right after.
   */
  private enqueue(key: string, value: Buffer): Promise<void> {
    this.queued.set(key, value);
    const done = new Promise<void>((resolve, reject) => this.queuedWaiters.push({ resolve, reject }));
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => void this.flushQueue());
    }
    return done;
  }

  private flushQueue(): Promise<void> {
    this.flushScheduled = false;
    if (this.queued.size === 0) return this.flushing;
    const ops = [...this.queued].map(([k, value]) => ({ type: 'put' as const, key: k, value }));
    const waiters = this.queuedWaiters;
    const chunkKeys = ops.filter((op) => op.key.startsWith('c:')).map((op) => op.key.slice(2));
    this.queued.clear();
    this.queuedWaiters = [];
    this.flushing = this.flushing
      .then(() => {
        // A fault-injection switch for tests only (the tests run as root, so permissions cannot make the store
        // unwritable): exchange writes fail, everything else works.
        if (process.env.MITM_REPLAY_FAULT_EXCHANGE_WRITES === '1') throw new Error('injected store write failure (MITM_REPLAY_FAULT_EXCHANGE_WRITES)');
        return this.db.batch(ops);
      })
      .then(
        () => waiters.forEach((w) => w.resolve()),
        (err: Error) => {
          // those chunks are not in the store after all
          for (const hash of chunkKeys) this.knownChunks.delete(hash);
          waiters.forEach((w) => w.reject(err));
        },
      );
    return this.flushing;
  }

  async getTrace(name: string): Promise<TraceMeta | undefined> {
    const value = await this.db.get(key.meta(name));
    return value === undefined ? undefined : (JSON.parse(value.toString('utf8')) as TraceMeta);
  }

  async putTrace(meta: TraceMeta): Promise<void> {
    await this.db.put(key.meta(meta.name), Buffer.from(JSON.stringify(meta)));
  }

  async listTraces(): Promise<TraceMeta[]> {
    const traces: TraceMeta[] = [];
    for await (const [k, v] of this.db.iterator({ gte: 't:', lt: 't;' })) {
      if (k.endsWith(':meta')) traces.push(JSON.parse(v.toString('utf8')) as TraceMeta);
    }
    return traces;
  }

  /** The most recently created trace, for `last`. */
  async latestTraceName(): Promise<string | undefined> {
    const traces = await this.listTraces();
    traces.sort((a, b) => a.createdAt - b.createdAt || a.name.localeCompare(b.name));
    return traces.at(-1)?.name;
  }

  async deleteTrace(name: string): Promise<void> {
    await this.flushQueue();
    this.chunksMayBeUnreferenced = true;
    await this.db.clear(key.traceRange(name));
  }

  /** Content-addressed blobs (workspace files, snapshots): identical content is stored once across traces. */
  async putBlob(content: Buffer): Promise<string> {
    const hash = createHash('sha256').update(content).digest('hex');
    if ((await this.db.get(key.blob(hash))) === undefined) await this.db.put(key.blob(hash), content);
    return hash;
  }

  /** Deletes a trace's replay reports; returns how many there were. */
  async deleteReports(name: string): Promise<number> {
    let count = 0;
    for await (const k of this.db.keys(key.reportRange(name))) {
      await this.db.del(k);
      count++;
    }
    return count;
  }

  /**
   * Compacts the whole key space: values that were overwritten or deleted leave the files on disk (LevelDB
   * otherwise keeps them in older tables and the write-ahead log until a compaction happens to reach them).
   */
  async compact(): Promise<void> {
    await this.flushQueue();
    // `level` re-exports classic-level's ClassicLevel on Node, whose compactRange its types leave out.
    await (this.db as unknown as { compactRange(start: string, end: string): Promise<void> }).compactRange('', '\xff');
  }

  async blobHashes(): Promise<string[]> {
    const hashes: string[] = [];
    for await (const k of this.db.keys({ gte: 'b:', lt: 'b;' })) hashes.push(k.slice(2));
    return hashes;
  }

  async deleteBlob(hash: string): Promise<void> {
    await this.db.del(key.blob(hash));
  }

  async getBlob(hash: string): Promise<Buffer | undefined> {
    if (!/^[0-9a-f]{64}$/.test(hash)) return undefined;
    return this.db.get(key.blob(hash));
  }

  /** Replay reports are kept with their trace (deleting the trace deletes them). */
  async putReport(name: string, runId: string, report: { finishedAt: number }): Promise<void> {
    await this.db.put(key.report(name, runId), Buffer.from(JSON.stringify(report)));
  }

  async getReport<T>(name: string, runId: string): Promise<T | undefined> {
    const value = await this.db.get(key.report(name, runId));
    return value === undefined ? undefined : (JSON.parse(value.toString('utf8')) as T);
  }

  /** Reports of a trace, oldest first. */
  async listReports<T extends { finishedAt: number }>(name: string): Promise<T[]> {
    const reports: T[] = [];
    for await (const value of this.db.values(key.reportRange(name))) reports.push(JSON.parse(value.toString('utf8')) as T);
    return reports.sort((a, b) => a.finishedAt - b.finishedAt);
  }

  putExchange(name: string, exchange: StoredExchange): Promise<void> {
    const { value, chunks } = encodeStoredValue(exchange);
    for (const [hash, chunk] of chunks) {
      this.sweepPins?.add(hash);
      if (this.knownChunks.has(hash)) continue;
      this.knownChunks.set(hash, true);
      this.queued.set(key.chunk(hash), chunk);
    }
    // chunks and the value go in the same batch: a value never refers to a chunk that is not written
    return this.enqueue(key.exchange(name, exchange.record.seq), value);
  }

  /** Chunks by hash; `cache` keeps the ones already read (a trace's exchanges share most of theirs). */
  private async getChunks(hashes: string[], cache?: Map<string, Buffer>): Promise<(Buffer | undefined)[]> {
    const wanted = [...new Set(hashes.filter((h) => !cache?.has(h)))];
    const found = new Map<string, Buffer | undefined>();
    if (wanted.length) {
      const values = await this.db.getMany(wanted.map(key.chunk));
      wanted.forEach((hash, i) => {
        found.set(hash, values[i]);
        if (values[i]) cache?.set(hash, values[i]);
      });
    }
    return hashes.map((h) => cache?.get(h) ?? found.get(h));
  }

  private decode(value: Buffer, cache?: Map<string, Buffer>): Promise<StoredExchange> {
    return decodeStoredValue(value, (hashes) => this.getChunks(hashes, cache));
  }

  async getExchange(name: string, seq: number): Promise<StoredExchange | undefined> {
    await this.flushQueue();
    const value = await this.db.get(key.exchange(name, seq));
    return value === undefined ? undefined : this.decode(value);
  }

  async *exchanges(name: string): AsyncGenerator<StoredExchange> {
    await this.flushQueue();
    const cache = new Map<string, Buffer>();
    for await (const value of this.db.values(key.exchangeRange(name))) yield await this.decode(value, cache);
  }

  /** A trace's exchange records without their bytes: no body is read or joined from its chunks. */
  async *records(name: string): AsyncGenerator<ExchangeRecord> {
    await this.flushQueue();
    for await (const value of this.db.values(key.exchangeRange(name))) yield recordOf(value);
  }

  /**
   * Deletes body chunks no exchange refers to any more (after traces were deleted or made structural). Exchanges
   * written while it runs pin their chunks, so a chunk a new exchange reuses is never taken from under it.
   */
  async sweepChunks(): Promise<number> {
    this.sweepPins = new Set();
    // a trace deleted while this runs may leave chunks it does not see: set again by deleteTrace
    this.chunksMayBeUnreferenced = false;
    try {
      await this.flushQueue();
      const referenced = new Set<string>();
      for await (const [k, v] of this.db.iterator({ gte: 't:', lt: 't;' })) {
        if (k.includes(':x:')) for (const hash of chunkRefs(v)) referenced.add(hash);
      }
      const unreferenced: string[] = [];
      for await (const k of this.db.keys({ gte: 'c:', lt: 'c;' })) {
        const hash = k.slice(2);
        if (!referenced.has(hash) && !this.sweepPins.has(hash)) unreferenced.push(hash);
      }
      for (let i = 0; i < unreferenced.length; i += 1000) {
        const batch = unreferenced.slice(i, i + 1000).filter((hash) => !this.sweepPins!.has(hash));
        for (const hash of batch) this.knownChunks.delete(hash);
        await this.db.batch(batch.map((hash) => ({ type: 'del' as const, key: key.chunk(hash) })));
      }
      return unreferenced.length;
    } finally {
      this.sweepPins = null;
    }
  }

  /** Bytes in body chunks and how many there are (for the storage bench and tests). */
  async chunkStats(): Promise<{ chunks: number; bytes: number }> {
    let chunks = 0;
    let bytes = 0;
    for await (const v of this.db.values({ gte: 'c:', lt: 'c;' })) {
      chunks++;
      bytes += v.length;
    }
    return { chunks, bytes };
  }

  /** Highest sequence number stored for a trace, or -1. */
  async lastSeq(name: string): Promise<number> {
    await this.flushQueue();
    for await (const k of this.db.keys({ ...key.exchangeRange(name), reverse: true, limit: 1 })) {
      return Number(k.slice(k.lastIndexOf(':') + 1));
    }
    return -1;
  }

  /**
   * Exchanges still `open` when no recorder is alive were cut off (crash, SIGKILL): mark them incomplete.
   * Called when a daemon opens the store, which it holds exclusively.
   */
  async markOpenExchangesIncomplete(): Promise<number> {
    let marked = 0;
    for await (const [k, v] of this.db.iterator({ gte: 't:', lt: 't;' })) {
      if (!k.includes(':x:')) continue;
      const ex = await this.decode(v);
      if (ex.record.state !== 'open') continue;
      ex.record.state = 'incomplete';
      ex.record.error ??= { code: 'cut-off', message: 'the recording process stopped before the exchange completed', phase: 'response' };
      // its chunks (if any) are in the store already; the value keeps referring to the same ones
      await this.db.put(k, encodeStoredValue(ex).value);
      marked++;
    }
    return marked;
  }

  async summarize(name: string): Promise<TraceSummary> {
    const summary: TraceSummary = { exchanges: 0, complete: 0, incomplete: 0, errors: 0, bytesUp: 0, bytesDown: 0, tunnelledHosts: [] };
    const tunnelled = new Set<string>();
    for await (const record of this.records(name)) summarizeRecord(summary, tunnelled, record);
    summary.tunnelledHosts = [...tunnelled].sort();
    return summary;
  }
}

function summarizeRecord(summary: TraceSummary, tunnelled: Set<string>, record: ExchangeRecord): void {
  if (record.kind === 'tunnel') {
    tunnelled.add(record.origin.host);
    summary.bytesUp += record.tunnel?.bytesUp ?? 0;
    summary.bytesDown += record.tunnel?.bytesDown ?? 0;
    return;
  }
  if (record.kind === 'http') summary.exchanges++;
  if (record.state === 'complete' && !record.error) summary.complete++;
  if (record.state !== 'complete') summary.incomplete++;
  if (record.error) summary.errors++;
  summary.bytesUp += (record.request?.headLength ?? 0) + (record.request?.bodyLength ?? 0);
  summary.bytesDown += (record.response?.headLength ?? 0) + (record.response?.bodyLength ?? 0);
}
