import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readdirSync } from 'node:fs';
import https from 'node:https';
import { TunnelAgent, request, startHarness, type Harness } from './helpers/proxy.js';

/**
 * A short version of the load promise (the long one belongs in bench/): 200 concurrent SSE streams and a burst
 * of keep-alive requests through a recording daemon: zero errors, every exchange stored, and no file
 * descriptor or listener left behind (counted in this process, which hosts the daemon).
 */
let h: Harness;

beforeAll(async () => {
  h = await startHarness();
});

afterAll(async () => {
  await h?.close();
});

const openFds = () => readdirSync('/proc/self/fd').length;

function stream(agent: https.Agent, ca: string, i: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = https.request('https://tools.example.test/sse-timed?frames=5&gap=40', { agent, ca, headers: { 'x-test-id': `load-${i}` } }, (res) => {
      let frames = 0;
      res.on('data', (c: Buffer) => (frames += (c.toString().match(/^data:/gm) ?? []).length));
      res.on('end', () => resolve(frames));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

describe('load (short version)', () => {
  it('200 concurrent SSE streams and 1,000 keep-alive requests: no errors, all stored, no fd or listener leak', async () => {
    // warm up once so lazily created things (leaf contexts, pools, the trace) exist before counting
    const warm = new TunnelAgent(h.daemon.port);
    await request('https://tools.example.test/echo', { agent: warm, ca: h.caPem });
    warm.destroy();
    await new Promise((r) => setTimeout(r, 200));
    const fdsBefore = openFds();
    const listenersBefore = h.daemon.listener.server.listenerCount('connection');
    const storedBefore = (await h.exchanges()).length;

    const streamAgent = new TunnelAgent(h.daemon.port, undefined, { maxSockets: 200 });
    const frames = await Promise.all(Array.from({ length: 200 }, (_, i) => stream(streamAgent, h.caPem, i)));
    streamAgent.destroy();
    expect(frames.every((f) => f === 5)).toBe(true);

    const keepAlive = new TunnelAgent(h.daemon.port, undefined, { maxSockets: 8 });
    const statuses = await Promise.all(Array.from({ length: 1000 }, () => request('https://tools.example.test/echo', { agent: keepAlive, ca: h.caPem }).then((r) => r.status)));
    keepAlive.destroy();
    expect(statuses.filter((s) => s !== 200)).toEqual([]);

    expect((await h.exchanges()).length - storedBefore).toBe(1200);
    // let closed sockets and idle upstream connections (4 s pool timeout) go
    await new Promise((r) => setTimeout(r, 4500));
    expect(h.daemon.listener.openConnections).toBe(0);
    expect(h.daemon.listener.server.listenerCount('connection')).toBe(listenersBefore);
    expect(openFds()).toBeLessThanOrEqual(fdsBefore + 2);
    console.log(`load: 200 streams + 1000 keep-alive requests; fds ${fdsBefore} -> ${openFds()}; rss ${Math.round(process.memoryUsage().rss / 2 ** 20)} MiB`);
  }, 60_000);
});
