import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { TunnelAgent, request, startHarness, type Harness } from './helpers/proxy.js';
import { DEFAULT_UPSTREAM_NAMES } from './helpers/test-ca.js';

/**
 * The short version of the memory promise (the long one, 10,000 connections to 500 hosts, is bench/load-bench.mjs):
 * many sequential connections to more distinct hosts than the leaf cache holds leave the cache at its cap and the
 * heap flat, and every exchange is stored.
 */
const HOSTS = 60;
const CONNECTIONS = 600;
const CAP = 20;

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const heapMb = () => {
  gc();
  gc();
  return process.memoryUsage().heapUsed / 2 ** 20;
};

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ leafCacheSize: CAP, upstreamNames: [...DEFAULT_UPSTREAM_NAMES, '*.load.test'], interceptExtra: ['*.load.test'] });
});
afterAll(async () => {
  await h?.close();
});

describe('leaf cache under many hosts (short version)', () => {
  it(`${CONNECTIONS} sequential connections to ${HOSTS} hosts: cache at its cap (${CAP}), heap flat, all stored`, async () => {
    const heap: number[] = [];
    const rss: number[] = [];
    for (let i = 0; i < CONNECTIONS; i++) {
      // a new connection each time: a new CONNECT, a new TLS handshake, a leaf for that host
      const agent = new TunnelAgent(h.daemon.port);
      const res = await request(`https://h${i % HOSTS}.load.test/echo`, { agent, ca: h.caPem });
      agent.destroy();
      expect(res.status).toBe(200);
      if ((i + 1) % 150 === 0) {
        heap.push(heapMb());
        rss.push(process.memoryUsage().rss / 2 ** 20);
      }
    }
    const stats = h.daemon.listener.leafStats;
    expect(stats.size).toBe(CAP);
    // cycling through three times the cap, least recently used first, misses every time
    expect(stats.misses).toBeGreaterThanOrEqual(CONNECTIONS - CAP);
    // the heap after the first quarter is what it stays at (evicted contexts are freed)
    expect(heap.at(-1)! - heap[0]!).toBeLessThan(8);
    // and so is the process (TLS contexts live outside the JS heap); loose, as it includes the test's own clients
    expect(rss.at(-1)! - rss[0]!).toBeLessThan(40);
    expect((await h.exchanges()).length).toBe(CONNECTIONS);
    console.log(`leaf cache: ${CONNECTIONS} connections, ${HOSTS} hosts, cap ${CAP}: size ${stats.size}, misses ${stats.misses}; heap after GC (MiB) ${heap.map((x) => x.toFixed(1)).join(' → ')}; RSS (MiB) ${rss.map((x) => x.toFixed(0)).join(' → ')}`);
  }, 120_000);
});
