import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import { join } from 'node:path';
import tls from 'node:tls';
import { Daemon } from '../src/daemon.js';
import { createLogger } from '../src/log.js';
import { parseConnectTo } from '../src/proxy/connect-to.js';
import { TunnelAgent, tempHome } from './helpers/proxy.js';
import { createTestCa, type TestCa } from './helpers/test-ca.js';

/** An upstream that misbehaves on purpose: each path is one way of failing. */
let ca: TestCa;
let server: tls.Server;
let home: string;
let daemon: Daemon;
let caPem: string;

beforeAll(async () => {
  ca = await createTestCa(['bad.example.test']);
  server = tls.createServer({ cert: ca.certPem, key: ca.keyPem }, (socket) => {
    socket.once('data', (chunk: Buffer) => {
      const path = chunk.toString('latin1').split(' ')[1];
      if (path === '/malformed') socket.end('HTTP/1.1 abc nonsense\r\n\r\n');
      else if (path === '/stall') socket.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part');
      else if (path === '/bad-framing') socket.end('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n');
      else if (path === '/bad-chunk') {
        // a good head and chunk first, broken framing later: the client already has part of the response
        socket.write('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n');
        setTimeout(() => socket.end('zz\r\nxx\r\n'), 30);
      }
      else socket.end('HTTP/1.1 204 No Content\r\n\r\n');
    });
    socket.on('error', () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  home = tempHome();
  daemon = await Daemon.start({
    home,
    port: 0,
    intercept: ['bad.example.test'],
    connectTo: [parseConnectTo(`::127.0.0.1:${(server.address() as { port: number }).port}`)],
    upstreamCAs: [ca.caCertPem],
    logger: createLogger({ level: 'silent' }),
  });
  caPem = readFileSync(join(home, 'certs', 'ca.pem'), 'utf8');
});

afterAll(async () => {
  await daemon?.stop();
  server?.close();
  await ca?.cleanup();
  if (home) rmSync(home, { recursive: true, force: true });
});

/** What a Node client sees: a response, or the error it fails with. */
function attempt(path: string, timeoutMs = 3000): Promise<{ status?: number; error?: string }> {
  const agent = new TunnelAgent(daemon.port);
  return new Promise((resolve) => {
    const req = https.request(`https://bad.example.test${path}`, { agent, ca: caPem, timeout: timeoutMs }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode }));
      res.on('error', (err: Error & { code?: string }) => resolve({ error: err.code ?? err.message }));
      res.on('aborted', () => resolve({ error: 'aborted' }));
    });
    req.on('timeout', () => req.destroy(Object.assign(new Error('client timeout'), { code: 'CLIENT_TIMEOUT' })));
    req.on('error', (err: Error & { code?: string }) => resolve({ error: err.code ?? err.message }));
    req.end();
  }).finally(() => agent.destroy()) as Promise<{ status?: number; error?: string }>;
}

async function stored() {
  const writer = await daemon.anonymousWriter();
  await writer.flush(false);
  const out = [];
  for await (const ex of daemon.store.exchanges(writer.name)) out.push(ex.record);
  return out;
}

describe('upstream faults: the agent fails as it would without the proxy, the trace records the error', () => {
  it('a malformed status line: the client connection fails, recorded as bad-response, daemon healthy', async () => {
    const result = await attempt('/malformed');
    expect(result.status).toBe(502);
    const record = (await stored()).find((r) => r.request?.target === '/malformed')!;
    expect(record.state).toBe('incomplete');
    expect(record.error?.code).toBe('bad-response');
    expect((await attempt('/ok')).status).toBe(204);
  });

  it('broken framing in the first read (nothing reached the client yet): 502 naming it', async () => {
    const result = await attempt('/bad-framing');
    expect(result.status).toBe(502);
    const record = (await stored()).find((r) => r.request?.target === '/bad-framing')!;
    expect(record.error?.code).toBe('bad-response');
  });

  it('broken chunk framing mid-body: the client sees the response cut, recorded incomplete', async () => {
    const result = await attempt('/bad-chunk');
    // the head (200) had reached the client; the body was cut, so the client fails rather than ending cleanly
    expect(result.error).toBeDefined();
    const record = (await stored()).find((r) => r.request?.target === '/bad-chunk')!;
    expect(record.state).toBe('incomplete');
    expect(record.error?.code).toBe('bad-response');
  });

  it('a stalled upstream: the client times out on its own clock; the exchange is recorded cut off by the client', async () => {
    const result = await attempt('/stall', 600);
    expect(result.error).toBe('CLIENT_TIMEOUT');
    await new Promise((r) => setTimeout(r, 100));
    const record = (await stored()).find((r) => r.request?.target === '/stall')!;
    expect(record.state).toBe('incomplete');
    expect(record.error?.code).toBe('client-aborted');
    expect(record.response?.status).toBe(200);
    expect((await attempt('/ok')).status).toBe(204);
  });
});
