import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import net from 'node:net';
import { TunnelAgent, basicAuth, request, startHarness, type Harness } from './helpers/proxy.js';

let h: Harness;

beforeAll(async () => {
  h = await startHarness({ upstreamPlain: false });
});

afterAll(async () => {
  await h?.close();
});

function rawExchange(port: number, text: string): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    let answer = '';
    socket.on('data', (c: Buffer) => (answer += c.toString('latin1')));
    socket.on('close', () => resolve(answer));
    socket.on('error', () => resolve(answer));
    socket.write(text);
    setTimeout(() => socket.destroy(), 3000);
  });
}

describe('session credentials', () => {
  it('several agents record into their own traces through one daemon at once', async () => {
    const a = await h.daemon.registerSession({ trace: 'agent-a', source: 'env' });
    const b = await h.daemon.registerSession({ trace: 'agent-b', source: 'env' });
    const agentA = new TunnelAgent(h.daemon.port, basicAuth(a.trace, a.token));
    const agentB = new TunnelAgent(h.daemon.port, basicAuth(b.trace, b.token));
    const results = await Promise.all([
      request('https://tools.example.test/echo', { agent: agentA, ca: h.caPem, headers: { 'x-test-id': 'sess-a1' } }),
      request('https://tools.example.test/echo', { agent: agentB, ca: h.caPem, headers: { 'x-test-id': 'sess-b1' } }),
      request('https://api.openai.com/v1/embeddings', { agent: agentA, ca: h.caPem, method: 'POST', body: '{"input":"x"}', headers: { 'x-test-id': 'sess-a2' } }),
    ]);
    agentA.destroy();
    agentB.destroy();
    expect(results.map((r) => r.status)).toEqual([200, 200, 200]);
    const endA = await h.daemon.endSession('agent-a');
    const endB = await h.daemon.endSession('agent-b');
    expect(endA.summary.exchanges).toBe(2);
    expect(endB.summary.exchanges).toBe(1);
    const ids = async (trace: string) => {
      const out: string[] = [];
      for await (const ex of h.daemon.store.exchanges(trace)) out.push(/x-test-id: (\S+)/.exec(ex.requestHead.toString())![1]!);
      return out.sort();
    };
    expect(await ids('agent-a')).toEqual(['sess-a1', 'sess-a2']);
    expect(await ids('agent-b')).toEqual(['sess-b1']);
  });

  it('wrong token or unknown session: 407 with a clear message for CONNECT and plain HTTP; nothing recorded', async () => {
    const s = await h.daemon.registerSession({ trace: 'guarded', source: 'env' });
    const cases = [
      basicAuth('guarded', 'not-the-token'),
      basicAuth('no-such-session', s.token),
      'Bearer whatever',
    ];
    for (const auth of cases) {
      const connect = await rawExchange(h.daemon.port, `CONNECT tools.example.test:443 HTTP/1.1\r\nHost: tools.example.test:443\r\nProxy-Authorization: ${auth}\r\n\r\n`);
      expect(connect).toMatch(/^HTTP\/1\.1 407 /);
      expect(connect).toMatch(/proxy-authenticate: Basic/i);
      expect(connect).toMatch(/mitm-replay: (wrong token|no live session|unsupported Proxy-Authorization)/);
      expect(connect).not.toContain(s.token);
      const plain = await rawExchange(h.daemon.port, `GET http://tools.example.test/echo HTTP/1.1\r\nHost: tools.example.test\r\nProxy-Authorization: ${auth}\r\n\r\n`);
      expect(plain).toMatch(/^HTTP\/1\.1 407 /);
    }
    const end = await h.daemon.endSession('guarded');
    expect(end.summary.exchanges).toBe(0);
    expect(h.upstream.requests.some((r) => r.url === '/echo' && r.rawHeaders.includes('tools.example.test') && !r.rawHeaders.includes('x-test-id'))).toBe(false);
  });

  it('a session name that is taken is refused; an invalid name is refused', async () => {
    await h.daemon.registerSession({ trace: 'taken', source: 'env' });
    await expect(h.daemon.registerSession({ trace: 'taken', source: 'env' })).rejects.toThrow(/live session/);
    await expect(h.daemon.registerSession({ trace: 'bad name', source: 'env' })).rejects.toThrow(/invalid trace name/);
    await h.daemon.endSession('taken');
    await expect(h.daemon.registerSession({ trace: 'taken', source: 'env' })).rejects.toThrow(/already exists/);
  });
});

describe('a daemon listening beyond loopback (--allow-remote)', () => {
  it('refuses anonymous traffic on every route and serves sessions', async () => {
    const remote = await startHarness({ requireCredentials: true });
    try {
      const anonymous = [
        `CONNECT tools.example.test:443 HTTP/1.1\r\nHost: tools.example.test:443\r\n\r\n`,
        `GET http://tools.example.test/echo HTTP/1.1\r\nHost: tools.example.test\r\n\r\n`,
        `GET /__mitm-replay/b/-/https/api.openai.com/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`,
      ];
      for (const text of anonymous) {
        const answer = await rawExchange(remote.daemon.port, text);
        expect(answer).toMatch(/^HTTP\/1\.1 407 /);
        expect(answer).toContain('--allow-remote');
      }
      const s = await remote.daemon.registerSession({ trace: 'remote-ok', source: 'env' });
      const agent = new TunnelAgent(remote.daemon.port, basicAuth(s.trace, s.token));
      const res = await request('https://tools.example.test/echo', { agent, ca: remote.caPem });
      agent.destroy();
      expect(res.status).toBe(200);
    } finally {
      await remote.close();
    }
  });
});
