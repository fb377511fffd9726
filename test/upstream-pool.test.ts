import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import tls from 'node:tls';
import { parseConnectTo } from '../src/proxy/connect-to.js';
import { UpstreamPool } from '../src/proxy/upstream.js';
import { createTestCa, type TestCa } from './helpers/test-ca.js';
import { startTestUpstream, type TestUpstream } from './helpers/upstream.js';

let ca: TestCa;
let upstream: TestUpstream;

beforeAll(async () => {
  ca = await createTestCa();
  upstream = await startTestUpstream({ tls: { certPem: ca.certPem, keyPem: ca.keyPem } });
});

afterAll(async () => {
  await upstream?.close();
  await ca?.cleanup();
});

function pool(): UpstreamPool {
  return new UpstreamPool({ connectTo: [parseConnectTo(`::127.0.0.1:${upstream.port}`)], extraCAs: [ca.caCertPem], isSelf: () => false });
}

describe('upstream pool', () => {
  it('reuses an idle keep-alive connection for the same origin', async () => {
    const p = pool();
    const origin = { scheme: 'https' as const, host: 'api.openai.com', port: 443 };
    const first = await p.acquire(origin);
    expect(first.reused).toBe(false);
    p.release(first);
    const second = await p.acquire(origin);
    expect(second.reused).toBe(true);
    expect(second.socket).toBe(first.socket);
    // another origin gets its own connection
    const other = await p.acquire({ ...origin, host: 'api.anthropic.com' });
    expect(other.socket).not.toBe(first.socket);
    p.close();
    other.socket.destroy();
    second.socket.destroy();
  });

  it('resumes the TLS session on a new connection to the same origin', async () => {
    const p = pool();
    const a = (await p.dial(true, 'api.openai.com', 443)) as tls.TLSSocket;
    // TLS 1.3 tickets arrive after the handshake: let the 'session' event fire
    a.write('GET /echo HTTP/1.1\r\nHost: api.openai.com\r\n\r\n');
    await new Promise((r) => a.once('data', r));
    a.destroy();
    const b = (await p.dial(true, 'api.openai.com', 443)) as tls.TLSSocket;
    expect(b.isSessionReused()).toBe(true);
    b.destroy();
    p.close();
  });

  it('verifies the upstream certificate against the name asked for, not the --connect-to target', async () => {
    const p = pool();
    await expect(p.dial(true, 'not-in-the-cert.example', 443)).rejects.toThrow(/TLS to not-in-the-cert\.example:443 failed/);
    p.close();
  });
});
