import { DaemonClient } from '../daemon-client.js';
import { homePaths } from '../home.js';
import type { ReplayReport } from '../replay/verdict.js';
import { decodeExchange, type ExchangeRecord, type StoredExchange, type TraceMeta } from './schema.js';
import { StoreLockedError, TraceStore, type TraceSummary } from './store.js';

/** One row of `mitm-replay ls`. */
export interface TraceListing {
  meta: TraceMeta;
  summary: TraceSummary;
  lastVerdict: string | null;
}

/**
 * Read access to a home's traces, whoever holds the store: the running daemon (over its control API, since
 * LevelDB admits one process), or the store opened directly when no daemon runs.
 */
export interface TraceReader {
  list(): Promise<TraceListing[]>;
  /** `last` allowed */
  meta(name: string): Promise<TraceMeta | undefined>;
  records(name: string): Promise<ExchangeRecord[]>;
  exchange(name: string, seq: number): Promise<StoredExchange | undefined>;
  reports(name: string): Promise<{ runId: string; finishedAt: number }[]>;
  blob(hash: string): Promise<Buffer | undefined>;
  close(): Promise<void>;
}

export async function listTraces(store: TraceStore): Promise<TraceListing[]> {
  const listings: TraceListing[] = [];
  for (const meta of await store.listTraces()) {
    const reports = await store.listReports<ReplayReport>(meta.name);
    listings.push({ meta, summary: await store.summarize(meta.name), lastVerdict: reports.at(-1)?.verdict.ending ?? null });
  }
  return listings.sort((a, b) => a.meta.createdAt - b.meta.createdAt);
}

export async function traceRecords(store: TraceStore, name: string): Promise<ExchangeRecord[]> {
  const records: ExchangeRecord[] = [];
  for await (const record of store.records(name)) records.push(record);
  return records;
}

export function storeReader(store: TraceStore): TraceReader {
  const resolve = async (name: string) => (name === 'last' ? ((await store.latestTraceName()) ?? '') : name);
  return {
    list: () => listTraces(store),
    meta: async (name) => store.getTrace(await resolve(name)),
    records: async (name) => traceRecords(store, await resolve(name)),
    exchange: async (name, seq) => store.getExchange(await resolve(name), seq),
    reports: async (name) => store.listReports(await resolve(name)),
    blob: (hash) => store.getBlob(hash),
    close: () => store.close(),
  };
}

function clientReader(client: DaemonClient): TraceReader {
  const enc = encodeURIComponent;
  return {
    list: () => client.request<TraceListing[]>('GET', '/traces'),
    meta: (name) => client.getTrace(name),
    records: (name) => client.request<ExchangeRecord[]>('GET', `/traces/${enc(name)}/exchanges`),
    exchange: async (name, seq) => {
      try {
        return decodeExchange(await client.requestRaw('GET', `/traces/${enc(name)}/exchanges/${seq}`));
      } catch (err) {
        if ((err as { status?: number }).status === 404) return undefined;
        throw err;
      }
    },
    reports: (name) => client.request('GET', `/traces/${enc(name)}/reports`),
    blob: (hash) => client.getBlob(hash),
    close: async () => undefined,
  };
}

/** How long a command waits for a store another process holds briefly (a command, a starting daemon, `ui`). */
const LOCKED_WAIT_MS = 3000;

/**
 * The running daemon's reader, or the store opened directly. Another process may hold the store for a moment
 * (a short command, a daemon about to publish its state file, the viewer reading a page): try again for a few
 * seconds before saying the store is in use.
 */
export async function openTraceReader(home: string): Promise<TraceReader> {
  const paths = homePaths(home);
  const deadline = Date.now() + LOCKED_WAIT_MS;
  for (;;) {
    const client = await DaemonClient.find(paths.stateFile);
    if (client) return clientReader(client);
    try {
      return storeReader(await TraceStore.open(paths.store));
    } catch (err) {
      if (!(err instanceof StoreLockedError) || Date.now() >= deadline) throw err;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

/** A trace's metadata and every exchange, through any reader; undefined when there is no such trace. */
export async function readWholeTrace(reader: TraceReader, name: string): Promise<{ meta: TraceMeta; exchanges: StoredExchange[] } | undefined> {
  const meta = await reader.meta(name);
  if (!meta) return undefined;
  const exchanges: StoredExchange[] = [];
  for (const record of await reader.records(meta.name)) {
    const exchange = await reader.exchange(meta.name, record.seq);
    if (exchange) exchanges.push(exchange);
  }
  return { meta, exchanges };
}
