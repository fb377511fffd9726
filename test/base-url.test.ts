import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { Agent, ProxyAgent, fetch as undiciFetch } from 'undici';
import { join } from 'node:path';
import { ROOT, runCli } from './helpers/cli.js';
import { childEnvironment } from '../src/launch/child-env.js';
import type { StoredExchange } from '../src/trace/schema.js';
import { basicAuth, startHarness, type Harness } from './helpers/proxy.js';
import { TOOL_ARGUMENT_FRAGMENTS } from './helpers/upstream.js';

let h: Harness;

beforeAll(async () => {
  h = await startHarness();
});

afterAll(async () => {
  await h?.close();
});

/** Headers whose value the SDK makes up per call (none expected; listed here if a version adds one). */
const PER_CALL_HEADERS = /^(idempotency-key|x-stainless-retry-count):.*$/gim;

function storedRequest(ex: StoredExchange): string {
  return Buffer.concat([ex.requestHead, ex.requestBody]).toString('latin1').replace(PER_CALL_HEADERS, '$1: <per-call>');
}

describe('base-URL route for SDKs that ignore HTTPS_PROXY', () => {
  it('the official openai SDK works through OPENAI_BASE_URL (streaming included) and stores the same bytes as through HTTPS_PROXY', async () => {
    const session = await h.daemon.registerSession({ trace: 'sdk', source: 'env' });
    const env = childEnvironment({ proxyUrl: session.proxyUrl, baseUrlPrefix: session.baseUrlPrefix, paths: h.daemon.paths, from: {} });
    expect(env.OPENAI_BASE_URL).toMatch(/\/https\/api\.openai\.com\/v1$/);
    const apiKey = 'sk-test-not-a-real-key-000000000000000000000000';

    // 1. through the base-URL route. Both routes use the same fetch implementation (the undici package), since
    //    Node's bundled fetch writes header names in another case and offers other encodings: a different client.
    const direct = new Agent({ connect: { ca: h.caPem } });
    const viaBase = new OpenAI({
      apiKey,
      baseURL: env.OPENAI_BASE_URL,
      maxRetries: 0,
      fetch: ((url: string, init: RequestInit) => undiciFetch(url, { ...(init as object), dispatcher: direct } as never)) as never,
    });
    const completion = await viaBase.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] });
    expect(completion.model).toBe('gpt-4o-mini');
    const stream = await viaBase.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'weather?' }], stream: true });
    let args = '';
    for await (const chunk of stream) args += chunk.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments ?? '';
    expect(args).toBe(TOOL_ARGUMENT_FRAGMENTS.join(''));

    // 2. the same calls through HTTPS_PROXY (CONNECT), with undici's ProxyAgent
    const dispatcher = new ProxyAgent({ uri: `http://127.0.0.1:${h.daemon.port}`, token: basicAuth(session.trace, session.token), requestTls: { ca: h.caPem } });
    const viaProxy = new OpenAI({
      apiKey,
      baseURL: 'https://api.openai.com/v1',
      maxRetries: 0,
      fetch: ((url: string, init: RequestInit) => undiciFetch(url, { ...(init as object), dispatcher } as never)) as never,
    });
    await viaProxy.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] });
    const stream2 = await viaProxy.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'weather?' }], stream: true });
    for await (const _ of stream2) void _;
    await dispatcher.close();
    await direct.close();

    await h.daemon.endSession('sdk');
    const exchanges: StoredExchange[] = [];
    for await (const ex of h.daemon.store.exchanges('sdk')) exchanges.push(ex);
    expect(exchanges.map((e) => e.record.route)).toEqual(['base-url', 'base-url', 'connect', 'connect']);
    expect(exchanges.every((e) => e.record.state === 'complete')).toBe(true);
    const [baseJson, baseStream, proxyJson, proxyStream] = exchanges.map(storedRequest);
    expect(baseJson).toMatch(/^POST \/v1\/chat\/completions HTTP\/1\.1\r\n/);
    expect(baseJson).toMatch(/\r\nhost: api\.openai\.com\r\n/i);
    expect(baseJson).toContain('[REDACTED:');
    expect(baseJson).toBe(proxyJson);
    expect(baseStream).toBe(proxyStream);
    // the streamed response kept its frames
    expect(exchanges[1]!.record.response!.chunks.length).toBeGreaterThan(3);
  });

  it("an unmodified SDK agent (Node's own fetch, defaults) under `mitm-replay record`, streaming included", async () => {
    const secret = 'sk-proj-' + 'x7Kq'.repeat(12);
    const result = await runCli(['record', '--home', h.home, '--trace', 'sdk-agent', '--', process.execPath, join(ROOT, 'test', 'fixtures', 'openai-agent.mjs')], {
      env: { OPENAI_API_KEY: secret, OPENAI_BASE_URL: '' },
    });
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual({ model: 'gpt-4o-mini', args: TOOL_ARGUMENT_FRAGMENTS.join('') });
    expect(result.stderr).toContain('trace sdk-agent: 2 exchanges');
    const exchanges: StoredExchange[] = [];
    for await (const ex of h.daemon.store.exchanges('sdk-agent')) exchanges.push(ex);
    expect(exchanges.map((e) => e.record.route)).toEqual(['base-url', 'base-url']);
    expect(exchanges[0]!.requestHead.toString()).toMatch(/^POST \/v1\/chat\/completions HTTP\/1\.1\r\n/);
    expect(exchanges[1]!.record.response!.chunks.length).toBeGreaterThan(3);
    expect(exchanges.map((e) => e.requestHead.toString()).join('')).not.toContain(secret);
  });
});
