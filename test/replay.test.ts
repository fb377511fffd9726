import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Agent, ProxyAgent, fetch as undiciFetch } from 'undici';
import OpenAI from 'openai';
import https from 'node:https';
import type { ReplayReport, Verdict } from '../src/replay/verdict.js';
import { childEnvironment } from '../src/launch/child-env.js';
import { TunnelAgent, basicAuth, connectTunnel, request, startHarness, type ClientResponse, type Harness } from './helpers/proxy.js';

let h: Harness;

beforeAll(async () => {
  h = await startHarness();
});

afterAll(async () => {
  await h?.close();
});

interface Client {
  get(url: string, headers?: Record<string, string>): Promise<ClientResponse>;
  post(url: string, body: string, headers?: Record<string, string>): Promise<ClientResponse>;
  /** the body bytes received before the response failed (or ended) */
  partial(url: string): Promise<Buffer>;
  close(): void;
}

function clientFor(session: { id: string; token: string }): Client {
  const agent = new TunnelAgent(h.daemon.port, basicAuth(session.id, session.token), { maxSockets: 8 });
  return {
    get: (url, headers) => request(url, { agent, ca: h.caPem, headers }),
    post: (url, body, headers) => request(url, { agent, ca: h.caPem, method: 'POST', body, headers: { 'content-type': 'application/json', ...headers } }),
    partial: (url) =>
      new Promise((resolve) => {
        const chunks: Buffer[] = [];
        const done = () => resolve(Buffer.concat(chunks));
        const req = https.request(url, { agent, ca: h.caPem }, (res) => {
          res.on('data', (d: Buffer) => chunks.push(d));
          res.on('error', done);
          res.on('close', done);
        });
        req.on('error', done);
        req.end();
      }),
    close: () => agent.destroy(),
  };
}

/** Records what `steps` does into a fresh trace; returns its name. */
async function recordTrace(name: string, steps: (c: Client) => Promise<void>): Promise<string> {
  const session = await h.daemon.registerSession({ trace: name });
  const client = clientFor(session);
  await steps(client);
  client.close();
  await h.daemon.endSession(session.id);
  return name;
}

/** Replays a trace while `steps` runs; returns the report and the upstream traffic seen meanwhile. */
async function replayTrace(trace: string, steps: (c: Client) => Promise<void>, options: { diagnostic?: boolean; pace?: 'fast' | 'recorded' } = {}) {
  const session = await h.daemon.registerSession({ mode: 'replay', trace, ...options });
  const connectionsBefore = h.upstream.connections;
  const requestsBefore = h.upstream.requests.length;
  const client = clientFor(session);
  await steps(client);
  client.close();
  const ended = await h.daemon.endSession(session.id);
  if (ended.mode !== 'replay') throw new Error('not a replay');
  return { report: ended.report, upstreamConnections: h.upstream.connections - connectionsBefore, upstreamRequests: h.upstream.requests.length - requestsBefore };
}

function expectInvariants(v: Verdict): void {
  expect(v.exact + v.diverged + v.missing).toBe(v.requests);
  expect(v.reused + v.unused).toBe(v.recorded);
}

const CHAT = 'https://api.openai.com/v1/chat/completions';
const chatBody = (content: string, stream = false) => JSON.stringify({ model: 'gpt-4o-mini', stream, messages: [{ role: 'user', content }] });

describe('replay matching and the verdict', () => {
  it('identical run: PASS, byte-identical responses, zero upstream connections', async () => {
    const recorded: Buffer[] = [];
    const trace = await recordTrace('pass', async (c) => {
      recorded.push((await c.post(CHAT, chatBody('weather?', true))).body);
      recorded.push((await c.get('https://tools.example.test/tool/weather?city=Paris')).body);
      recorded.push((await c.post(CHAT, chatBody('answer'))).body);
    });
    const replayed: Buffer[] = [];
    const { report, upstreamConnections, upstreamRequests } = await replayTrace(trace, async (c) => {
      replayed.push((await c.post(CHAT, chatBody('weather?', true))).body);
      replayed.push((await c.get('https://tools.example.test/tool/weather?city=Paris')).body);
      replayed.push((await c.post(CHAT, chatBody('answer'))).body);
    });
    expect(report.line).toBe('verdict: recorded=3 requests=3 reused=3 exact=3 reordered=0 diverged=0 missing=0 unused=0 egress=blocked -> PASS');
    expect(replayed.map((b) => b.toString('hex'))).toEqual(recorded.map((b) => b.toString('hex')));
    expect(upstreamConnections).toBe(0);
    expect(upstreamRequests).toBe(0);
    expectInvariants(report.verdict);
  });

  it('the same request asked twice gets the two recorded answers in recorded order', async () => {
    const ids: string[] = [];
    const header = (r: ClientResponse) => r.rawHeaders[r.rawHeaders.findIndex((x) => x.toLowerCase() === 'x-upstream-request-id') + 1]!;
    const trace = await recordTrace('twice', async (c) => {
      for (let i = 0; i < 3; i++) ids.push(header(await c.get('https://tools.example.test/echo')));
    });
    expect(new Set(ids).size).toBe(3);
    const served: string[] = [];
    const { report } = await replayTrace(trace, async (c) => {
      for (let i = 0; i < 3; i++) served.push(header(await c.get('https://tools.example.test/echo')));
    });
    expect(served).toEqual(ids);
    expect(report.verdict.ending).toBe('PASS');
  });

  it('parallel requests arriving out of order are still exact, flagged reordered', async () => {
    const trace = await recordTrace('parallel', async (c) => {
      for (const q of ['a', 'b', 'c']) await c.post(CHAT, chatBody(q));
    });
    const answers: string[] = [];
    const { report } = await replayTrace(trace, async (c) => {
      for (const q of ['c', 'a', 'b']) answers.push((await c.post(CHAT, chatBody(q))).body.toString());
    });
    expect(report.verdict).toMatchObject({ recorded: 3, requests: 3, exact: 3, diverged: 0, missing: 0, unused: 0, ending: 'PASS' });
    expect(report.verdict.reordered).toBeGreaterThanOrEqual(2);
    expect(report.requests[0]).toMatchObject({ outcome: 'exact', reordered: true, recordedPosition: 2 });
    expectInvariants(report.verdict);
  });

  it('fewer steps: unused; more steps: missing, refused with 502 and no upstream; invariants hold', async () => {
    const trace = await recordTrace('steps', async (c) => {
      await c.post(CHAT, chatBody('one'));
      await c.post(CHAT, chatBody('two'));
    });
    const fewer = await replayTrace(trace, async (c) => {
      await c.post(CHAT, chatBody('one'));
    });
    expect(fewer.report.verdict).toMatchObject({ recorded: 2, requests: 1, exact: 1, unused: 1, ending: 'FAIL' });
    expect(fewer.report.unused).toHaveLength(1);
    expectInvariants(fewer.report.verdict);

    let refused: ClientResponse | null = null;
    const more = await replayTrace(trace, async (c) => {
      await c.post(CHAT, chatBody('one'));
      await c.post(CHAT, chatBody('two'));
      refused = await c.post(CHAT, chatBody('three'));
      await c.get('https://tools.example.test/tool/weather?city=Rome');
    });
    expect(more.report.verdict).toMatchObject({ recorded: 2, requests: 4, exact: 2, missing: 2, diverged: 0, unused: 0, ending: 'FAIL' });
    expect(more.upstreamConnections).toBe(0);
    expect(refused!.status).toBe(502);
    expect(refused!.rawHeaders).toContain('x-should-retry');
    const error = JSON.parse(refused!.body.toString());
    expect(error.error.message).toContain("trace 'steps'");
    expect(error.error.message).toContain('request 3 to POST https://api.openai.com:443/v1/chat/completions');
    expectInvariants(more.report.verdict);
  });

  it('a changed prompt: strict refuses it (FAIL) and locates the divergence', async () => {
    const trace = await recordTrace('changed', async (c) => {
      await c.post(CHAT, chatBody('first'));
      await c.post(CHAT, chatBody('What is the weather in Paris?'));
    });
    let refusal: ClientResponse | null = null;
    const { report } = await replayTrace(trace, async (c) => {
      await c.post(CHAT, chatBody('first'));
      refusal = await c.post(CHAT, chatBody('What is the weather in Milan?'));
    });
    expect(report.verdict).toMatchObject({ exact: 1, diverged: 1, missing: 0, unused: 1, reused: 1, ending: 'FAIL' });
    expectInvariants(report.verdict);
    expect(refusal!.status).toBe(502);
    const diverged = report.requests[1]!;
    expect(diverged).toMatchObject({ outcome: 'diverged', position: 1, recordedPosition: 1, served: false });
    expect(diverged.requestHash).not.toBe(diverged.recordedHash);
    const d = diverged.divergence!;
    expect(d.json.map((j) => j.path)).toEqual(['messages[0].content']);
    const recordedBody = chatBody('What is the weather in Paris?');
    expect(d.body.firstDifferentByte).toBe(recordedBody.indexOf('Paris'));
    expect(d.head.firstDifferentByte).toBeNull();
    expect(JSON.parse(refusal!.body.toString()).error.message).toContain('messages[0].content');
  });

  it('diagnostic mode serves the recorded response, labelled, and the verdict is DIAGNOSTIC', async () => {
    const trace = await recordTrace('diag', async (c) => {
      await c.post(CHAT, chatBody('recorded prompt'));
    });
    let served: ClientResponse | null = null;
    const { report } = await replayTrace(
      trace,
      async (c) => {
        served = await c.post(CHAT, chatBody('another prompt'));
      },
      { diagnostic: true },
    );
    expect(served!.status).toBe(200);
    const label = served!.rawHeaders[served!.rawHeaders.indexOf('x-mitm-replay-divergence') + 1];
    expect(label).toBe(report.requests[0]!.divergenceId);
    expect(report.verdict).toMatchObject({ diverged: 1, reused: 1, unused: 0, exact: 0, ending: 'DIAGNOSTIC' });
    expect(report.line.endsWith('-> DIAGNOSTIC')).toBe(true);
    expectInvariants(report.verdict);
  });

  it('refusals: the provider error shape, an event: error frame for streams; diagnostic still refuses what has no counterpart', async () => {
    const trace = await recordTrace('shapes', async (c) => {
      await c.post(CHAT, chatBody('recorded'));
    });
    const responses: ClientResponse[] = [];
    const { report } = await replayTrace(
      trace,
      async (c) => {
        responses.push(await c.post(CHAT, chatBody('recorded')));
        responses.push(await c.post(CHAT, chatBody('one more', true)));
        responses.push(await c.post('https://api.anthropic.com/v1/messages', JSON.stringify({ model: 'claude-haiku-4-5', messages: [] })));
      },
      { diagnostic: true },
    );
    const [served, stream, anthropic] = responses;
    expect(served!.status).toBe(200);
    expect(stream!.status).toBe(502);
    const header = (r: ClientResponse, name: string) => r.rawHeaders[r.rawHeaders.findIndex((h) => h.toLowerCase() === name) + 1];
    expect(header(stream!, 'content-type')).toBe('text/event-stream');
    expect(header(stream!, 'x-should-retry')).toBe('false');
    const frame = stream!.body.toString();
    expect(frame.startsWith('event: error\ndata: ')).toBe(true);
    expect(JSON.parse(frame.split('\n')[1]!.slice(6)).error.message).toContain('no unused recording');
    expect(anthropic!.status).toBe(502);
    const anthropicError = JSON.parse(anthropic!.body.toString());
    expect(anthropicError.type).toBe('error');
    expect(anthropicError.error.type).toBe('mitm_replay_refused');
    expect(report.verdict).toMatchObject({ requests: 3, exact: 1, missing: 2, ending: 'DIAGNOSTIC' });
    expectInvariants(report.verdict);
  });

  it('--allow-live lets a named tunnelled host through and says so: egress=live:N', async () => {
    const trace = await recordTrace('live', async (c) => {
      await c.get('https://tools.example.test/echo');
    });
    const session = await h.daemon.registerSession({ mode: 'replay', trace, allowLive: ['tunnel.example.test'] });
    const client = clientFor(session);
    await client.get('https://tools.example.test/echo');
    // tunnel.example.test was never intercepted: its tunnel goes live (here, to the local upstream)
    const tunnel = await connectTunnel(h.daemon.port, 'tunnel.example.test:443', basicAuth(session.id, session.token));
    tunnel.destroy();
    client.close();
    const ended = (await h.daemon.endSession(session.id)) as { report: ReplayReport };
    expect(ended.report.verdict.egress).toBe('live:1');
    expect(ended.report.line).toContain('egress=live:1 -> PASS');
  });

  it('SSE replay: byte-identical frames; --pace recorded keeps the gaps within a few ms', async () => {
    const url = 'https://tools.example.test/sse-timed?frames=5&gap=60';
    let recorded: ClientResponse | null = null;
    const trace = await recordTrace('sse', async (c) => {
      recorded = await c.get(url);
    });
    let fast: ClientResponse | null = null;
    await replayTrace(trace, async (c) => {
      fast = await c.get(url);
    });
    expect(fast!.body.equals(recorded!.body)).toBe(true);
    let paced: ClientResponse | null = null;
    const { report } = await replayTrace(
      trace,
      async (c) => {
        paced = await c.get(url);
      },
      { pace: 'recorded' },
    );
    expect(report.verdict.ending).toBe('PASS');
    expect(paced!.body.equals(recorded!.body)).toBe(true);
    const gaps = (r: ClientResponse) => r.chunkTimes.slice(1).map((t, i) => t - r.chunkTimes[i]!);
    const recordedGaps = gaps(recorded!).slice(0, 4);
    const pacedGaps = gaps(paced!).slice(0, 4);
    expect(pacedGaps).toHaveLength(4);
    for (let i = 0; i < 4; i++) expect(Math.abs(pacedGaps[i]! - recordedGaps[i]!)).toBeLessThan(15);
    // fast pace does not wait
    expect(fast!.chunkTimes.at(-1)! - fast!.chunkTimes[0]!).toBeLessThan(60);
  });

  it('an upstream reset mid-stream is replayed as the same failure at the same byte', async () => {
    let live = Buffer.alloc(0);
    const trace = await recordTrace('reset', async (c) => {
      live = await c.partial('https://tools.example.test/reset-mid-stream');
    });
    expect(live.length).toBeGreaterThan(0);
    let replayed = Buffer.alloc(0);
    const { report } = await replayTrace(trace, async (c) => {
      replayed = await c.partial('https://tools.example.test/reset-mid-stream');
    });
    expect(replayed.toString("latin1")).toBe(live.toString("latin1"));
    expect(report.verdict.ending).toBe('PASS');
    // and the client saw a failure, not a clean end
    const session = await h.daemon.registerSession({ mode: 'replay', trace });
    await expect(clientFor(session).get('https://tools.example.test/reset-mid-stream')).rejects.toThrow();
    await h.daemon.endSession(session.id);
  });

  it('egress: a host that was not intercepted is refused (403) unless --allow-live names it', async () => {
    const trace = await recordTrace('egress', async (c) => {
      await c.get('https://tools.example.test/echo');
    });
    const session = await h.daemon.registerSession({ mode: 'replay', trace });
    const socket = await import('node:net').then((net) => net.connect(h.daemon.port, '127.0.0.1'));
    const auth = basicAuth(session.id, session.token);
    const answer = await new Promise<string>((resolve) => {
      let text = '';
      socket.on('data', (c: Buffer) => (text += c.toString()));
      socket.on('close', () => resolve(text));
      socket.write(`CONNECT github.com:443 HTTP/1.1\r\nHost: github.com:443\r\nProxy-Authorization: ${auth}\r\n\r\n`);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 403/);
    expect(answer).toContain('--allow-live github.com');
    const ended = await h.daemon.endSession(session.id);
    const report = (ended as { report: ReplayReport }).report;
    expect(report.verdict.refusedTunnels).toBe(1);
    expect(report.line).toContain('egress=blocked refused-tunnels=1 -> FAIL');
  });
});

describe('routes and SDKs', () => {
  it('a trace recorded on the base-URL route replays through HTTPS_PROXY, and the reverse', async () => {
    const apiKey = 'sk-test-0000000000000000000000000000';
    const viaBase = (prefix: string) => {
      const env = childEnvironment({ proxyUrl: '', baseUrlPrefix: prefix, paths: h.daemon.paths, from: {} });
      const dispatcher = new Agent({ connect: { ca: h.caPem } });
      return new OpenAI({ apiKey, baseURL: env.OPENAI_BASE_URL, maxRetries: 0, fetch: ((u: string, i: RequestInit) => undiciFetch(u, { ...(i as object), dispatcher } as never)) as never });
    };
    const viaProxy = (session: { id: string; token: string }) => {
      const dispatcher = new ProxyAgent({ uri: `http://127.0.0.1:${h.daemon.port}`, token: basicAuth(session.id, session.token), requestTls: { ca: h.caPem } });
      return new OpenAI({ apiKey, baseURL: 'https://api.openai.com/v1', maxRetries: 0, fetch: ((u: string, i: RequestInit) => undiciFetch(u, { ...(i as object), dispatcher } as never)) as never });
    };
    const call = async (client: OpenAI) => {
      const c = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] });
      const s = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], stream: true });
      let args = '';
      for await (const chunk of s) args += chunk.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments ?? '';
      return `${c.choices[0]!.message.content}|${args}`;
    };
    // recorded on the base-URL route, replayed through HTTPS_PROXY
    const rec1 = await h.daemon.registerSession({ trace: 'sdk-base' });
    const liveAnswer = await call(viaBase(rec1.baseUrlPrefix));
    await h.daemon.endSession(rec1.id);
    const rep1 = await h.daemon.registerSession({ mode: 'replay', trace: 'sdk-base' });
    expect(await call(viaProxy(rep1))).toBe(liveAnswer);
    const end1 = (await h.daemon.endSession(rep1.id)) as { report: ReplayReport };
    expect(end1.report.verdict.ending).toBe('PASS');
    expect(end1.report.requests.map((r) => r.route)).toEqual(['connect', 'connect']);
    // recorded through HTTPS_PROXY, replayed on the base-URL route
    const rec2 = await h.daemon.registerSession({ trace: 'sdk-proxy' });
    await call(viaProxy(rec2));
    await h.daemon.endSession(rec2.id);
    const rep2 = await h.daemon.registerSession({ mode: 'replay', trace: 'sdk-proxy' });
    expect(await call(viaBase(rep2.baseUrlPrefix))).toBe(liveAnswer);
    const end2 = (await h.daemon.endSession(rep2.id)) as { report: ReplayReport };
    expect(end2.report.line).toContain('exact=2');
    expect(end2.report.verdict.ending).toBe('PASS');
  });

  it('the official openai SDK (default retries) against a strict miss fails at once', async () => {
    await recordTrace('sdk-miss', async (c) => {
      await c.post(CHAT, chatBody('recorded'));
    });
    const session = await h.daemon.registerSession({ mode: 'replay', trace: 'sdk-miss' });
    const dispatcher = new ProxyAgent({ uri: `http://127.0.0.1:${h.daemon.port}`, token: basicAuth(session.id, session.token), requestTls: { ca: h.caPem } });
    const client = new OpenAI({ apiKey: 'sk-x', baseURL: 'https://api.openai.com/v1', fetch: ((u: string, i: RequestInit) => undiciFetch(u, { ...(i as object), dispatcher } as never)) as never });
    const started = performance.now();
    const error = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'something else' }] }).catch((e: unknown) => e);
    expect(performance.now() - started).toBeLessThan(400);
    expect((error as { status?: number }).status).toBe(502);
    expect(String((error as Error).message)).toContain('diverged');
    await dispatcher.close();
    const ended = (await h.daemon.endSession(session.id)) as { report: ReplayReport };
    // one request: no retries
    expect(ended.report.verdict.requests).toBe(1);
  });
});
