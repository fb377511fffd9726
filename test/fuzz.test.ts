import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import net from 'node:net';
import tls from 'node:tls';
import { prng } from './helpers/prng.js';
import { TunnelAgent, request, startHarness, type Harness } from './helpers/proxy.js';

/**
 * A bounded, seeded fuzz run against the listener (and the decrypted side of a CONNECT): malformed request
 * lines, oversized heads, header injection, smuggling-shaped framing, odd CONNECT targets, garbage instead of a
 * ClientHello, random mutations of valid requests. The daemon must answer with a 4xx or close, never crash,
 * never store garbage as an exchange, and keep serving well-formed clients throughout.
 * FUZZ_SEED and FUZZ_CASES reproduce or extend a run.
 */
const SEED = Number(process.env.FUZZ_SEED ?? 20261129);
const CASES = Number(process.env.FUZZ_CASES ?? 300);

let h: Harness;

beforeAll(async () => {
  h = await startHarness({ timeouts: { headerMs: 300, idleMs: 600 } });
});

afterAll(async () => {
  await h?.close();
});

const VALID = [
  'GET http://tools.example.test/echo HTTP/1.1\r\nHost: tools.example.test\r\n\r\n',
  'POST http://tools.example.test/echo HTTP/1.1\r\nHost: tools.example.test\r\nContent-Length: 5\r\n\r\nhello',
  'POST http://tools.example.test/echo HTTP/1.1\r\nHost: tools.example.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n',
  'CONNECT tools.example.test:443 HTTP/1.1\r\nHost: tools.example.test:443\r\n\r\n',
];

const NASTY = [
  'GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
  'POST http://tools.example.test/echo HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!',
  'POST http://tools.example.test/echo HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n',
  'POST http://tools.example.test/echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nxx',
  'POST http://tools.example.test/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n',
  'GET http://tools.example.test/echo HTTP/1.1\r\nX-Injected: a\rb: c\r\n\r\n',
  'GET http://tools.example.test/echo HTTP/1.1\r\n Folded: header\r\n\r\n',
  'GET http://tools.example.test/echo HTTP/1.1\r\n: no-name\r\n\r\n',
  `GET http://tools.example.test/${'a'.repeat(70_000)} HTTP/1.1\r\n\r\n`,
  `GET http://tools.example.test/echo HTTP/1.1\r\n${'X-Big: y\r\n'.repeat(8000)}\r\n`,
  'CONNECT [::1]:0 HTTP/1.1\r\n\r\n',
  'CONNECT tools.example.test:70000 HTTP/1.1\r\n\r\n',
  'CONNECT 127.0.0.1:PORT HTTP/1.1\r\n\r\n',
  'CONNECT bücher.example:443 HTTP/1.1\r\n\r\n',
  'CONNECT :443 HTTP/1.1\r\n\r\n',
  'CONNECT tools.example.test HTTP/1.1\r\n\r\n',
  'GET ftp://tools.example.test/ HTTP/1.1\r\n\r\n',
  'GET http://[::1:443/ HTTP/1.1\r\n\r\n',
  'GET http://tools.example.test/echo HTTP/2.0\r\n\r\n',
  'G\0ET / HTTP/1.1\r\n\r\n',
  '\x16\x03\x01\x00\x05hello',
  '\r\n\r\n\r\n',
];

function mutate(rand: () => number, input: string): Buffer {
  const bytes = Buffer.from(input.replaceAll('PORT', String(h.daemon.port)), 'latin1');
  const out = Buffer.from(bytes);
  const edits = 1 + Math.floor(rand() * 4);
  for (let i = 0; i < edits; i++) {
    const at = Math.floor(rand() * out.length);
    const kind = rand();
    if (kind < 0.4) out[at] = Math.floor(rand() * 256);
    else if (kind < 0.6) out[at] = [0x0d, 0x0a, 0x3a, 0x20, 0x00][Math.floor(rand() * 5)]!;
    else if (kind < 0.8) return Buffer.concat([out.subarray(0, at), out.subarray(at + 1 + Math.floor(rand() * 8))]);
    else return Buffer.concat([out.subarray(0, at), Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 16) }, () => Math.floor(rand() * 256))), out.subarray(at)]);
  }
  return out;
}

/** Sends bytes (split at random points), returns what came back before the daemon closed (or 2 s passed). */
function throwAt(bytes: Buffer, rand: () => number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(h.daemon.port, '127.0.0.1');
    let answer = '';
    const timer = setTimeout(() => socket.destroy(), 2000);
    socket.on('data', (c: Buffer) => (answer += c.toString('latin1')));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(answer);
    });
    const cut = Math.floor(rand() * bytes.length);
    socket.write(bytes.subarray(0, cut));
    setTimeout(() => {
      if (!socket.destroyed) socket.end(bytes.subarray(cut));
    }, 2);
  });
}

async function healthy(): Promise<void> {
  const agent = new TunnelAgent(h.daemon.port);
  const res = await request('https://tools.example.test/echo', { agent, ca: h.caPem, headers: { 'x-test-id': 'health' } });
  agent.destroy();
  expect(res.status).toBe(200);
}

describe(`fuzzing the listener (seed ${SEED}, ${CASES} cases)`, () => {
  it('answers 4xx or closes, never crashes, stores no garbage, keeps serving well-formed clients', async () => {
    const rand = prng(SEED);
    const before = (await h.exchanges()).length;
    const statuses = new Map<string, number>();
    for (let i = 0; i < CASES; i++) {
      const base = rand() < 0.5 ? NASTY[Math.floor(rand() * NASTY.length)]! : VALID[Math.floor(rand() * VALID.length)]!;
      const bytes = rand() < 0.25 ? Buffer.from(base.replaceAll('PORT', String(h.daemon.port)), 'latin1') : mutate(rand, base);
      const answer = await throwAt(bytes, rand);
      // bytes that start like a TLS record (0x16) get the TLS side of the listener, which answers with an alert
      const status = /^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1] ?? (answer === '' ? 'closed' : answer.charCodeAt(0) === 0x15 ? 'tls-alert' : 'other');
      statuses.set(status, (statuses.get(status) ?? 0) + 1);
      // 2xx only for requests that are still well-formed after mutation; 5xx only for upstream trouble
      expect(status, `case ${i}: ${JSON.stringify(bytes.toString('latin1').slice(0, 120))} -> ${answer.slice(0, 120)}`).toMatch(/^(1\d\d|2\d\d|4\d\d|501|502|504|closed|tls-alert)$/);
      if (i % 50 === 49) await healthy();
    }
    await healthy();
    // garbage never became an exchange: what was stored parses as a request of a known method
    for (const ex of (await h.exchanges()).slice(before)) {
      if (ex.record.kind !== 'http') continue;
      expect(ex.requestHead.toString('latin1')).toMatch(/^(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH|[A-Z]+) \S+ HTTP\/1\.[01]\r\n/);
    }
    console.log(`fuzz seed ${SEED}: ${CASES} cases, outcomes ${JSON.stringify(Object.fromEntries(statuses))}`);
  }, 120_000);

  it('garbage and broken TLS inside a CONNECT tunnel never crash it', async () => {
    const rand = prng(SEED + 1);
    for (let i = 0; i < 40; i++) {
      const socket = net.connect(h.daemon.port, '127.0.0.1');
      socket.on('error', () => undefined);
      socket.write('CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n');
      await new Promise((r) => socket.once('data', r));
      if (i % 2 === 0) {
        socket.end(Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 2000) }, () => Math.floor(rand() * 256))));
      } else {
        // a real ClientHello, then garbage where the HTTP request should be
        const secure = tls.connect({ socket, servername: 'api.openai.com', ca: h.caPem });
        secure.on('error', () => undefined);
        await new Promise((r) => secure.once('secureConnect', r));
        secure.end(Buffer.from(Array.from({ length: 1 + Math.floor(rand() * 500) }, () => Math.floor(rand() * 256))));
      }
      await new Promise((r) => setTimeout(r, 5));
      socket.destroy();
    }
    await healthy();
  }, 60_000);
});
