import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import https from 'node:https';
import { TunnelAgent, entityBody, request, startHarness, type Harness } from './helpers/proxy.js';
import { generateLargeBody } from './helpers/upstream.js';

let h: Harness;
let agent: TunnelAgent;

beforeAll(async () => {
  h = await startHarness();
});

afterAll(async () => {
  agent?.destroy();
  await h?.close();
});

function sha(b: Buffer): string {
  return createHash('sha256').update(b).digest('hex');
}

async function lastExchange() {
  const all = await h.exchanges();
  return all.at(-1)!;
}

describe('capture through CONNECT with Node https', () => {
  beforeAll(() => {
    agent = new TunnelAgent(h.daemon.port);
  });

  const shapes: { name: string; url: string; method?: string; body?: string; id: string }[] = [
    { name: 'JSON chat completion', url: 'https://api.openai.com/v1/chat/completions', method: 'POST', body: '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}', id: 'chat-json' },
    { name: 'OpenAI SSE stream with a tool call', url: 'https://api.openai.com/v1/chat/completions', method: 'POST', body: '{"model":"gpt-4o-mini","stream":true,"messages":[]}', id: 'chat-sse' },
    { name: 'Anthropic SSE with input_json_delta', url: 'https://api.anthropic.com/v1/messages', method: 'POST', body: '{"model":"claude-haiku-4-5","stream":true,"messages":[]}', id: 'anthropic-sse' },
    { name: 'embeddings', url: 'https://api.openai.com/v1/embeddings', method: 'POST', body: '{"model":"text-embedding-3-small","input":"hello"}', id: 'embeddings' },
    { name: 'gzip response', url: 'https://tools.example.test/gzip', id: 'gzip' },
    { name: 'tool call', url: 'https://tools.example.test/tool/weather?city=Paris', id: 'tool' },
  ];

  for (const shape of shapes) {
    it(`${shape.name}: client bytes = upstream bytes = stored bytes`, async () => {
      const res = await request(shape.url, {
        agent,
        ca: h.caPem,
        method: shape.method,
        body: shape.body,
        headers: { 'x-test-id': shape.id, 'accept-encoding': 'gzip', ...(shape.body ? { 'content-type': 'application/json' } : {}) },
      });
      expect(res.status).toBe(200);
      const sent = h.upstream.sent.get(shape.id)!;
      expect(sent).toBeDefined();
      expect(sha(res.body)).toBe(sha(sent));
      const ex = await lastExchange();
      expect(ex.record.state).toBe('complete');
      expect(ex.record.route).toBe('connect');
      expect(sha(entityBody(ex.responseHead, ex.responseBody))).toBe(sha(sent));
      expect(ex.record.response!.status).toBe(200);
      // the stored request is what the upstream received
      const received = h.upstream.requests.find((r) => r.id === shape.id)!;
      expect(ex.requestBody.toString()).toBe(received.body.toString());
      const storedHead = ex.requestHead.toString('latin1');
      expect(storedHead.startsWith(`${shape.method ?? 'GET'} ${new URL(shape.url).pathname}`)).toBe(true);
      expect(storedHead).toContain('x-test-id: ' + shape.id);
    });
  }

  it('stores gzip bodies compressed, as they crossed the wire', async () => {
    const ex = (await h.exchanges()).find((e) => e.requestHead.includes('x-test-id: gzip'))!;
    expect(ex.responseHead.toString('latin1')).toMatch(/content-encoding: gzip/i);
    expect(ex.record.response!.flags).not.toContain('decoded');
    expect(entityBody(ex.responseHead, ex.responseBody).subarray(0, 2)).toEqual(Buffer.from([0x1f, 0x8b]));
  });

  it('keeps streamed frames as separate chunks', async () => {
    const ex = (await h.exchanges()).find((e) => e.requestHead.includes('x-test-id: chat-sse'))!;
    expect(ex.record.response!.chunks.length).toBeGreaterThan(3);
    expect(entityBody(ex.responseHead, ex.responseBody).toString()).toContain('data: [DONE]');
    const offsets = ex.record.response!.chunks.map(([t]) => t);
    expect([...offsets].sort((a, b) => a - b)).toEqual(offsets);
  });

  it('a large (10 MB) body passes and is stored intact', async () => {
    const res = await request('https://tools.example.test/large?mb=10', { agent, ca: h.caPem, headers: { 'x-test-id': 'large' } });
    expect(res.body.length).toBe(10 * 1024 * 1024);
    expect(res.body.equals(generateLargeBody(10 * 1024 * 1024))).toBe(true);
    const ex = await lastExchange();
    expect(ex.record.response!.bodyLength).toBe(10 * 1024 * 1024);
    expect(ex.responseBody.equals(res.body)).toBe(true);
  });

  it('keep-alive: several requests on one client connection', async () => {
    const local = new TunnelAgent(h.daemon.port);
    const before = h.upstream.connections;
    const reused: boolean[] = [];
    for (let i = 0; i < 4; i++) {
      const res = await new Promise<boolean>((resolve, reject) => {
        const req = https.request('https://tools.example.test/echo', { agent: local, ca: h.caPem }, (r) => {
          r.resume();
          r.on('end', () => resolve(req.reusedSocket));
        });
        req.on('error', reject);
        req.end();
      });
      reused.push(res);
    }
    local.destroy();
    expect(reused).toEqual([false, true, true, true]);
    // the daemon pools upstream connections too: at most one new upstream connection for four requests
    expect(h.upstream.connections - before).toBeLessThanOrEqual(1);
  });

  it('stores SSE chunk offsets and the client sees the first frame before the last is sent', async () => {
    const res = await request('https://tools.example.test/sse-timed?frames=5&gap=50', { agent, ca: h.caPem, headers: { 'x-test-id': 'timed' } });
    const sentAt = h.upstream.frameSentAt.get('timed')!;
    expect(sentAt).toHaveLength(5);
    const firstArrival = performance.timeOrigin + res.chunkTimes[0]!;
    expect(firstArrival).toBeLessThan(sentAt[4]!);
    const ex = await lastExchange();
    const offsets = ex.record.response!.chunks.map(([t]) => t);
    expect(offsets.length).toBeGreaterThanOrEqual(5);
    const gaps = offsets.slice(1, 5).map((t, i) => t - offsets[i]!);
    for (const gap of gaps) {
      expect(gap).toBeGreaterThan(35);
      expect(gap).toBeLessThan(150);
    }
  });
});
