import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import net from 'node:net';
import { TunnelAgent, request, startHarness, type Harness } from './helpers/proxy.js';

let h: Harness;

beforeAll(async () => {
  h = await startHarness({ timeouts: { headerMs: 400, idleMs: 700 } });
});

afterAll(async () => {
  await h?.close();
});

function collect(socket: net.Socket): Promise<{ text: string; ms: number }> {
  const started = performance.now();
  return new Promise((resolve) => {
    let text = '';
    socket.on('data', (c: Buffer) => (text += c.toString('latin1')));
    socket.on('error', () => undefined);
    socket.on('close', () => resolve({ text, ms: performance.now() - started }));
  });
}

describe('slow and silent clients', () => {
  it('a request head that trickles in is answered 408 after the header timeout, and closed', async () => {
    const socket = net.connect(h.daemon.port, '127.0.0.1');
    const done = collect(socket);
    socket.write('GET http://tools.example.test/echo HTTP/1.1\r\nHost: tools.example.test\r\n');
    const slow = setInterval(() => socket.writable && socket.write('X-Slow: 1\r\n'), 100);
    const { text, ms } = await done;
    clearInterval(slow);
    expect(text).toMatch(/^HTTP\/1\.1 408 /);
    expect(ms).toBeGreaterThan(350);
    expect(ms).toBeLessThan(3000);
  });

  it('a connection that says nothing, or idles after a response, is closed after the idle timeout', async () => {
    const silent = net.connect(h.daemon.port, '127.0.0.1');
    const { text, ms } = await collect(silent);
    expect(text).toBe('');
    expect(ms).toBeGreaterThan(600);
    expect(ms).toBeLessThan(3000);
    // a keep-alive client after its response: served, then closed when idle
    const agent = new TunnelAgent(h.daemon.port);
    const res = await request('https://tools.example.test/echo', { agent, ca: h.caPem });
    expect(res.status).toBe(200);
    const socket = Object.values(agent.freeSockets).flat()[0]!;
    const closed = await new Promise<number>((resolve) => {
      const t0 = performance.now();
      socket.once('close', () => resolve(performance.now() - t0));
    });
    expect(closed).toBeLessThan(3000);
    agent.destroy();
  });

  it('a slow stream (gaps longer than both timeouts) is not cut off', async () => {
    const agent = new TunnelAgent(h.daemon.port);
    const res = await request('https://tools.example.test/sse-timed?frames=3&gap=900', { agent, ca: h.caPem });
    agent.destroy();
    expect(res.status).toBe(200);
    expect(res.body.toString().match(/^data:/gm)).toHaveLength(3);
  });
});
