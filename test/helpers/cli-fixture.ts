/** Shared set-up for tests that drive the real CLI: a test upstream with its own CA, a work dir, store readers. */
import { afterAll, beforeAll } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TraceStore } from '../../src/trace/store.js';
import type { StoredExchange, TraceMeta } from '../../src/trace/schema.js';
import { haveTool } from './cli.js';
import { createTestCa, type TestCa } from './test-ca.js';
import { startTestUpstream, type TestUpstream } from './upstream.js';

export interface UpstreamFixture {
  ca: TestCa;
  upstream: TestUpstream;
  work: string;
  /** a fresh home under the work dir */
  freshHome(): string;
  /** daemon flags that send every connection to the test upstream and trust its CA */
  routing(): string[];
}

/** Registers beforeAll/afterAll hooks for a test upstream; the returned object is filled in by beforeAll. */
export function useUpstreamFixture(prefix: string): UpstreamFixture {
  const fixture = {} as UpstreamFixture;
  beforeAll(async () => {
    haveTool('curl');
    fixture.ca = await createTestCa();
    fixture.upstream = await startTestUpstream({ tls: { certPem: fixture.ca.certPem, keyPem: fixture.ca.keyPem } });
    fixture.work = mkdtempSync(join(tmpdir(), `mitm-replay-${prefix}-`));
    fixture.freshHome = () => mkdtempSync(join(fixture.work, 'home-'));
    fixture.routing = () => ['--connect-to', `::127.0.0.1:${fixture.upstream.port}`, '--upstream-ca', fixture.ca.caPath];
  });
  afterAll(async () => {
    await fixture.upstream?.close();
    await fixture.ca?.cleanup();
    if (fixture.work) rmSync(fixture.work, { recursive: true, force: true });
  });
  return fixture;
}

async function withStore<T>(home: string, read: (store: TraceStore) => Promise<T>): Promise<T> {
  const store = await TraceStore.open(join(home, 'traces'));
  try {
    return await read(store);
  } finally {
    await store.close();
  }
}

/** Every exchange of a trace, read from the home's store (no daemon may hold it). */
export function readTrace(home: string, name: string): Promise<StoredExchange[]> {
  return withStore(home, async (store) => {
    const out: StoredExchange[] = [];
    for await (const ex of store.exchanges(name)) out.push(ex);
    return out;
  });
}

export function readMeta(home: string, name: string): Promise<TraceMeta | undefined> {
  return withStore(home, (store) => store.getTrace(name));
}
