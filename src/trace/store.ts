import { createHash } from 'node:crypto';
import { Level } from 'level';
import { FORMAT_VERSION, decodeExchange, encodeExchange, type ExchangeRecord, type StoredExchange, type TraceMeta } from './schema.js';

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
 * Every store records its format version. A newer one than this code knows is refused with the reason; an
 * older one would be migrated here (there is no older format yet: version 1 is the first).
 */
async function checkFormat(db: Level<string, Buffer>, path: string): Promise<void> {
  const stored = await db.get(FORMAT_KEY);
  const version = stored === undefined ? FORMAT_VERSION : Number(stored.toString('utf8'));
  if (!Number.isInteger(version) || version < 1) throw new StoreFormatError(`the trace store ${path} has an unreadable format version '${stored?.toString('utf8')}'; it is damaged or not a mitm-replay store`);
  if (version > FORMAT_VERSION) {
    throw new StoreFormatError(`the trace store ${path} was written by a newer mitm-replay (format ${version}; this version reads ${FORMAT_VERSION}): upgrade mitm-replay, or use another --home`);
  }
  if (stored === undefined) await db.put(FORMAT_KEY, Buffer.from(String(FORMAT_VERSION)));
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
        throw new StoreLockedError(`the trace store ${path} is in use by another mitm-replay process`);
      }
      throw err;
    }
    try {
      await checkFormat(db, path);
    } catch (err) {
      await db.close();
      throw err;
    }
    return new TraceStore(db);
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
        (err: Error) => waiters.forEach((w) => w.reject(err)),
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
    return this.enqueue(key.exchange(name, exchange.record.seq), encodeExchange(exchange));
  }

  async getExchange(name: string, seq: number): Promise<StoredExchange | undefined> {
    await this.flushQueue();
    const value = await this.db.get(key.exchange(name, seq));
    return value === undefined ? undefined : decodeExchange(value);
  }

  async *exchanges(name: string): AsyncGenerator<StoredExchange> {
    await this.flushQueue();
    for await (const value of this.db.values(key.exchangeRange(name))) yield decodeExchange(value);
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
      const ex = decodeExchange(v);
      if (ex.record.state !== 'open') continue;
      ex.record.state = 'incomplete';
      ex.record.error ??= { code: 'cut-off', message: 'the recording process stopped before the exchange completed', phase: 'response' };
      await this.db.put(k, encodeExchange(ex));
      marked++;
    }
    return marked;
  }

  async summarize(name: string): Promise<TraceSummary> {
    const summary: TraceSummary = { exchanges: 0, complete: 0, incomplete: 0, errors: 0, bytesUp: 0, bytesDown: 0, tunnelledHosts: [] };
    const tunnelled = new Set<string>();
    for await (const { record } of this.exchanges(name)) {
      summarizeRecord(summary, tunnelled, record);
    }
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
