import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import net from 'node:net';
import tls from 'node:tls';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { Daemon } from '../src/daemon.js';
import { createLogger } from '../src/log.js';
import { parseConnectTo } from '../src/proxy/connect-to.js';
import { TunnelAgent, connectTunnel, request, startHarness, tempHome, type Harness } from './helpers/proxy.js';

let h: Harness;

beforeAll(async () => {
  h = await startHarness();
});

afterAll(async () => {
  await h?.close();
});

function readUntilClosed(socket: net.Socket, timeoutMs = 5000): Promise<Buffer> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(Buffer.concat(chunks));
    }, timeoutMs);
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks));
    });
  });
}

async function healthy(): Promise<void> {
  const agent = new TunnelAgent(h.daemon.port);
  const res = await request('https://tools.example.test/echo', { agent, ca: h.caPem });
  agent.destroy();
  expect(res.status).toBe(200);
}

describe('verbatim request capture', () => {
  it('stores what a raw TLS client wrote (odd case, spacing, duplicates, chunked body), less hop-by-hop headers', async () => {
    const tunnel = await connectTunnel(h.daemon.port, 'tools.example.test:443');
    const socket = tls.connect({ socket: tunnel, servername: 'tools.example.test', ca: h.caPem });
    await new Promise((resolve) => socket.once('secureConnect', resolve));
    const head =
      'POST /echo?q=1 HTTP/1.1\r\n' +
      'HoSt: tools.example.test\r\n' +
      'X-Odd-Case:    spaced   value\r\n' +
      'x-dup: one\r\n' +
      'Connection: keep-alive, X-Hop\r\n' +
      'X-Hop: goes-away\r\n' +
      'x-dup: two\r\n' +
      'Transfer-Encoding: chunked\r\n' +
      'Keep-Alive: timeout=5\r\n' +
      'x-test-id: verbatim\r\n' +
      '\r\n';
    const body = '5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n';
    socket.write(head);
    socket.write(body.slice(0, 9));
    await new Promise((r) => setTimeout(r, 20));
    socket.write(body.slice(9));
    const response = await new Promise<string>((resolve) => {
      let text = '';
      socket.on('data', (c: Buffer) => {
        text += c.toString('latin1');
        if (text.includes('bodySha256')) resolve(text);
      });
    });
    socket.destroy();
    expect(response).toMatch(/^HTTP\/1\.1 200/);
    const ex = (await h.exchanges()).find((e) => e.requestHead.includes('x-test-id: verbatim'))!;
    const expectedHead =
      'POST /echo?q=1 HTTP/1.1\r\n' +
      'HoSt: tools.example.test\r\n' +
      'X-Odd-Case:    spaced   value\r\n' +
      'x-dup: one\r\n' +
      'x-dup: two\r\n' +
      'Transfer-Encoding: chunked\r\n' +
      'x-test-id: verbatim\r\n' +
      '\r\n';
    expect(ex.requestHead.toString('latin1')).toBe(expectedHead);
    expect(ex.requestBody.toString('latin1')).toBe(body);
    expect(ex.record.request!.droppedHeaders).toEqual(['Connection', 'X-Hop', 'Keep-Alive']);
    // and the upstream received exactly the stored request
    const received = h.upstream.requests.find((r) => r.id === 'verbatim')!;
    expect(received.rawHeaders).toEqual(['HoSt', 'tools.example.test', 'X-Odd-Case', 'spaced   value', 'x-dup', 'one', 'x-dup', 'two', 'Transfer-Encoding', 'chunked', 'x-test-id', 'verbatim']);
    expect(received.body.toString()).toBe('hello, world');
  });
});

describe('bad input and upstream faults', () => {
  it('garbage instead of a TLS ClientHello: the connection closes, the error is recorded, the daemon stays up', async () => {
    const tunnel = await connectTunnel(h.daemon.port, 'api.openai.com:443');
    tunnel.write('this is not a ClientHello\r\n\r\n');
    await readUntilClosed(tunnel);
    await healthy();
    const errors = (await h.exchanges()).filter((e) => e.record.kind === 'error' && e.record.origin.host === 'api.openai.com');
    expect(errors.length).toBeGreaterThanOrEqual(1);
    expect(errors[0]!.record.error!.code).toBe('not-tls');
  });

  it('a TLS ClientHello that is cut off midway is recorded as a TLS error', async () => {
    const tunnel = await connectTunnel(h.daemon.port, 'api.anthropic.com:443');
    tunnel.write(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0xde, 0xad]));
    tunnel.end();
    await readUntilClosed(tunnel);
    await healthy();
    const errors = (await h.exchanges()).filter((e) => e.record.kind === 'error' && e.record.origin.host === 'api.anthropic.com');
    expect(errors.length).toBe(1);
    expect(errors[0]!.record.error!.phase).toBe('tls');
  });

  it('CONNECT to a name under .invalid: 502 with a reason, recorded, daemon stays up', async () => {
    const socket = net.connect(h.daemon.port, '127.0.0.1');
    socket.write('CONNECT does-not-exist.invalid:443 HTTP/1.1\r\nHost: does-not-exist.invalid:443\r\n\r\n');
    const answer = (await readUntilClosed(socket)).toString('latin1');
    expect(answer).toMatch(/^HTTP\/1\.1 502/);
    expect(answer).toContain('.invalid');
    await healthy();
    const tunnels = (await h.exchanges()).filter((e) => e.record.origin.host === 'does-not-exist.invalid');
    expect(tunnels).toHaveLength(1);
    expect(tunnels[0]!.record.error!.code).toBe('ENOTFOUND');
  });

  it('an upstream that resets mid-stream: the client sees the cut, the exchange is recorded incomplete', async () => {
    const agent = new TunnelAgent(h.daemon.port);
    await expect(request('https://tools.example.test/reset-mid-stream', { agent, ca: h.caPem, headers: { 'x-test-id': 'reset' } })).rejects.toThrow();
    agent.destroy();
    await healthy();
    const ex = (await h.exchanges()).find((e) => e.requestHead.includes('x-test-id: reset'))!;
    expect(ex.record.state).toBe('incomplete');
    expect(ex.record.error!.code).toBe('upstream-reset');
    // the bytes that did arrive are kept
    expect(ex.record.response!.status).toBe(200);
    expect(ex.responseBody.length).toBeGreaterThan(0);
  });

  it('malformed requests get a 4xx and nothing is recorded for them', async () => {
    const before = (await h.exchanges()).length;
    for (const bad of [
      'GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n',
      'NOT A REQUEST\r\n\r\n',
      `GET http://tools.example.test/ HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(70_000)}\r\n\r\n`,
      'GET http://tools.example.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n',
    ]) {
      const socket = net.connect(h.daemon.port, '127.0.0.1');
      socket.write(bad);
      const answer = (await readUntilClosed(socket)).toString('latin1');
      expect(answer).toMatch(/^HTTP\/1\.1 4\d\d/);
    }
    expect((await h.exchanges()).length).toBe(before);
    await healthy();
  });

  it('refuses to CONNECT to its own address (no loops)', async () => {
    const socket = net.connect(h.daemon.port, '127.0.0.1');
    socket.write(`CONNECT 127.0.0.1:${h.daemon.port} HTTP/1.1\r\nHost: 127.0.0.1:${h.daemon.port}\r\n\r\n`);
    const answer = (await readUntilClosed(socket)).toString('latin1');
    expect(answer).toMatch(/^HTTP\/1\.1 403/);
    expect(answer).toContain('itself');
  });

  it('an upstream certificate that does not verify: 502 naming the TLS failure, recorded as a TLS error', async () => {
    const home = tempHome();
    const strict = await Daemon.start({
      home,
      port: 0,
      intercept: ['tools.example.test'],
      connectTo: [parseConnectTo(`::127.0.0.1:${h.upstream.port}`)],
      upstreamCAs: [],
      logger: createLogger({ level: 'silent' }),
    });
    try {
      const agent = new TunnelAgent(strict.port);
      const res = await request('https://tools.example.test/echo', { agent, ca: readFileSync(join(home, 'certs', 'ca.pem'), 'utf8') });
      agent.destroy();
      expect(res.status).toBe(502);
      expect(res.body.toString()).toMatch(/TLS to tools\.example\.test:443 failed/);
      const writer = await strict.anonymousWriter();
      await writer.flush(false);
      const stored = [];
      for await (const ex of strict.store.exchanges(writer.name)) stored.push(ex);
      expect(stored).toHaveLength(1);
      expect(stored[0]!.record.error!.phase).toBe('tls');
      expect(stored[0]!.record.state).toBe('incomplete');
    } finally {
      await strict.stop();
      rmSync(home, { recursive: true, force: true });
    }
  });
});
