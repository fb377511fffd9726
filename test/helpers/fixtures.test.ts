/**
 * Tests for the test fixtures themselves: the throwaway upstream CA and the
 * local upstream server. Clients here talk to the upstream directly (no proxy).
 */
import { createHash, createPrivateKey, X509Certificate } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestCa, DEFAULT_UPSTREAM_NAMES, type TestCa } from './test-ca.js';
import {
  ANTHROPIC_PARTIAL_JSON_FRAGMENTS,
  generateLargeBody,
  GZIP_DOCUMENT,
  nowMs,
  startSink,
  startTestUpstream,
  type TestUpstream,
} from './upstream.js';

interface Response {
  status: number;
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  /** Entity body exactly as received (no content decoding). */
  body: Buffer;
  /** Arrival time (nowMs) of each data chunk. */
  chunkTimes: number[];
  socket: net.Socket;
}

interface RequestOptions {
  method?: string;
  headers?: http.OutgoingHttpHeaders;
  body?: string | Buffer;
  agent?: http.Agent | false;
  servername?: string;
}

let ca: TestCa;
let upstream: TestUpstream;

function request(target: TestUpstream, path: string, options: RequestOptions = {}): Promise<Response> {
  const url = new URL(path, target.origin);
  const body = typeof options.body === 'string' ? Buffer.from(options.body) : options.body;
  const headers: http.OutgoingHttpHeaders = { ...options.headers };
  if (body) headers['content-length'] = body.length;
  const common = { method: options.method ?? 'GET', headers, agent: options.agent ?? false };
  return new Promise((resolve, reject) => {
    const onResponse = (res: http.IncomingMessage) => {
      const socket = res.socket; // detached from the response once a keep-alive agent reuses it
      const chunks: Buffer[] = [];
      const chunkTimes: number[] = [];
      res.on('data', (chunk: Buffer) => {
        chunks.push(chunk);
        chunkTimes.push(nowMs());
      });
      res.on('error', reject);
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          rawHeaders: res.rawHeaders,
          body: Buffer.concat(chunks),
          chunkTimes,
          socket,
        }),
      );
    };
    const req =
      url.protocol === 'https:'
        ? https.request(url, { ...common, ca: ca.caCertPem, servername: options.servername }, onResponse)
        : http.request(url, common, onResponse);
    req.on('error', reject);
    req.end(body);
  });
}

const postJson = (path: string, value: unknown, headers: http.OutgoingHttpHeaders = {}) =>
  request(upstream, path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(value),
  });

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

/** Splits an SSE body into frames of {event?, data}. */
function parseSse(body: Buffer): { event?: string; data: string }[] {
  return body
    .toString('utf8')
    .split('\n\n')
    .filter((frame) => frame.trim() !== '')
    .map((frame) => {
      const out: { event?: string; data: string } = { data: '' };
      for (const line of frame.split('\n')) {
        if (line.startsWith('event: ')) out.event = line.slice(7);
        if (line.startsWith('data: ')) out.data = line.slice(6);
      }
      return out;
    });
}

beforeAll(async () => {
  ca = await createTestCa();
  upstream = await startTestUpstream({ tls: { certPem: ca.certPem, keyPem: ca.keyPem } });
});

afterAll(async () => {
  await upstream?.close();
  await ca?.cleanup();
});

describe('test CA', () => {
  it('writes only the CA certificate into its temp dir', async () => {
    expect(ca.caPath.startsWith(ca.dir)).toBe(true);
    expect(await readdir(ca.dir)).toEqual(['upstream-ca.pem']);
    expect(await readFile(ca.caPath, 'utf8')).toBe(ca.caCertPem);
    expect(ca.caCertPem).toContain('BEGIN CERTIFICATE');
    expect(ca.caCertPem).not.toContain('PRIVATE KEY');
  });

  it('issues a server certificate for every requested name, signed by the CA', () => {
    const caCert = new X509Certificate(ca.caCertPem);
    const leaf = new X509Certificate(ca.certPem);
    expect(caCert.ca).toBe(true);
    expect(leaf.ca).toBe(false);
    expect(leaf.checkIssued(caCert)).toBe(true);
    expect(leaf.verify(caCert.publicKey)).toBe(true);
    expect(leaf.checkPrivateKey(createPrivateKey(ca.keyPem))).toBe(true);
    for (const name of DEFAULT_UPSTREAM_NAMES) {
      if (net.isIP(name)) expect(leaf.checkIP(name), name).toBe(name);
      else expect(leaf.checkHost(name), name).toBe(name);
    }
    expect(leaf.checkHost('evil.example.com')).toBeUndefined();
  });

  it('can issue extra (e.g. expired) leaves that TLS clients reject', async () => {
    const expired = ca.issue(['localhost'], {
      notBefore: new Date(Date.now() - 10 * 86_400_000),
      notAfter: new Date(Date.now() - 86_400_000),
    });
    const server = await startTestUpstream({ tls: expired });
    try {
      await expect(request(server, '/echo')).rejects.toMatchObject({ code: 'CERT_HAS_EXPIRED' });
      // Node clients verify after the (TLS 1.3) handshake, so the server still counts a connection.
      expect(server.requests).toHaveLength(0);
    } finally {
      await server.close();
    }
  });
});

describe('upstream over TLS', () => {
  it('serves names from the certificate via SNI, trusting only the upstream CA', async () => {
    const ok = await request(upstream, '/tool/weather?city=Paris', { servername: 'api.openai.com' });
    expect(ok.status).toBe(200);
    await expect(request(upstream, '/echo', { servername: 'not-in-cert.example' })).rejects.toMatchObject({
      code: 'ERR_TLS_CERT_ALTNAME_INVALID',
    });
  });

  it('chat completions (JSON): echoes model, content-length, deterministic, recorded in sent', async () => {
    const payload = { model: 'gpt-test-model', messages: [{ role: 'user', content: 'hi' }] };
    const a = await postJson('/v1/chat/completions', payload, { 'x-test-id': 'chat-json-a' });
    const b = await postJson('/v1/chat/completions', payload, { 'x-test-id': 'chat-json-b' });
    expect(a.status).toBe(200);
    expect(a.headers['content-type']).toBe('application/json');
    expect(Number(a.headers['content-length'])).toBe(a.body.length);
    expect(a.headers['x-upstream-request-id']).toBe('chat-json-a');
    const json = JSON.parse(a.body.toString());
    expect(json.model).toBe('gpt-test-model');
    expect(json.object).toBe('chat.completion');
    expect(typeof json.choices[0].message.content).toBe('string');
    expect(b.body.equals(a.body)).toBe(true);
    expect(upstream.sent.get('chat-json-a')).toEqual(a.body);
    const recorded = upstream.requests.find((r) => r.id === 'chat-json-a')!;
    expect(recorded.method).toBe('POST');
    expect(recorded.url).toBe('/v1/chat/completions');
    expect(JSON.parse(recorded.body.toString())).toEqual(payload);
    expect(recorded.rawHeaders).toContain('x-test-id');
  });

  it('chat completions (stream): OpenAI SSE with fragmented tool-call arguments, one write per frame', async () => {
    const payload = { model: 'gpt-4o-mini', stream: true, messages: [] };
    const a = await postJson('/v1/chat/completions', payload, { 'x-test-id': 'chat-sse-a' });
    const b = await postJson('/v1/chat/completions', payload, { 'x-test-id': 'chat-sse-b' });
    expect(a.status).toBe(200);
    expect(a.headers['content-type']).toMatch(/^text\/event-stream/);
    expect(a.headers['transfer-encoding']).toBe('chunked');
    expect(a.headers['content-length']).toBeUndefined();
    expect(b.body.equals(a.body)).toBe(true);
    expect(upstream.sent.get('chat-sse-a')).toEqual(a.body);

    const frames = parseSse(a.body);
    expect(frames.every((f) => f.event === undefined)).toBe(true);
    expect(frames.at(-1)!.data).toBe('[DONE]');
    const chunks = frames.slice(0, -1).map((f) => JSON.parse(f.data));
    expect(chunks.every((c) => c.model === 'gpt-4o-mini' && c.object === 'chat.completion.chunk')).toBe(true);
    const fragments = chunks.map((c) => c.choices[0].delta.tool_calls?.[0]?.function?.arguments).filter((x) => x !== undefined);
    expect(fragments.length).toBeGreaterThan(2);
    expect(JSON.parse(fragments.join(''))).toEqual({ city: 'Paris' });
    expect(chunks.at(-1).choices[0].finish_reason).toBe('tool_calls');
    // One frame per write: each frame arrived on its own (5 ms apart by default).
    expect(upstream.frameSentAt.get('chat-sse-a')).toHaveLength(frames.length);
    expect(a.chunkTimes.length).toBeGreaterThan(2); // usually exactly frames.length
  });

  it('messages (stream): Anthropic SSE with tool_use, empty first partial_json, mid-stream ping', async () => {
    const a = await postJson('/v1/messages', { model: 'claude-test', stream: true, max_tokens: 10, messages: [] }, { 'x-test-id': 'msg-sse' });
    expect(a.status).toBe(200);
    expect(a.headers['content-type']).toMatch(/^text\/event-stream/);
    expect(upstream.sent.get('msg-sse')).toEqual(a.body);
    const frames = parseSse(a.body);
    const events = frames.map((f) => f.event);
    expect(events[0]).toBe('message_start');
    expect(events[1]).toBe('content_block_start');
    expect(events.slice(-4)).toEqual(['content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
    const pingAt = events.indexOf('ping');
    expect(pingAt).toBeGreaterThan(events.indexOf('content_block_delta'));
    expect(pingAt).toBeLessThan(events.lastIndexOf('content_block_delta'));
    for (const f of frames) expect(JSON.parse(f.data).type).toBe(f.event);
    expect(JSON.parse(frames[0]!.data).message.model).toBe('claude-test');
    expect(JSON.parse(frames[1]!.data).content_block.type).toBe('tool_use');
    const partials = frames
      .filter((f) => f.event === 'content_block_delta')
      .map((f) => JSON.parse(f.data).delta.partial_json as string);
    expect(partials).toEqual(ANTHROPIC_PARTIAL_JSON_FRAGMENTS);
    expect(partials[0]).toBe('');
    expect(JSON.parse(partials.join(''))).toEqual({ city: 'Paris' });
  });

  it('messages (JSON)', async () => {
    const a = await postJson('/v1/messages', { model: 'claude-test', max_tokens: 10, messages: [] });
    expect(a.headers['content-type']).toBe('application/json');
    const json = JSON.parse(a.body.toString());
    expect(json).toMatchObject({ type: 'message', model: 'claude-test', role: 'assistant' });
  });

  it('embeddings: deterministic float arrays', async () => {
    const a = await postJson('/v1/embeddings', { model: 'emb-test', input: ['one', 'two'] });
    const b = await postJson('/v1/embeddings', { model: 'emb-test', input: ['one', 'two'] });
    expect(b.body.equals(a.body)).toBe(true);
    const json = JSON.parse(a.body.toString());
    expect(json.model).toBe('emb-test');
    expect(json.data).toHaveLength(2);
    expect(json.data[0].embedding).toHaveLength(8);
    expect(json.data[0].embedding.every((x: unknown) => typeof x === 'number' && x >= -1 && x <= 1)).toBe(true);
    expect(json.data[0].embedding).not.toEqual(json.data[1].embedding);
  });

  it('gzip: compressed bytes on the wire and in sent', async () => {
    const a = await request(upstream, '/gzip', { headers: { 'x-test-id': 'gz' } });
    expect(a.headers['content-encoding']).toBe('gzip');
    expect(Number(a.headers['content-length'])).toBe(a.body.length);
    expect(a.body[0]).toBe(0x1f);
    expect(a.body[1]).toBe(0x8b);
    expect(upstream.sent.get('gz')).toEqual(a.body);
    expect(JSON.parse(gunzipSync(a.body).toString())).toEqual(GZIP_DOCUMENT);
  });

  it('large: N MB of deterministic, non-repeating bytes with content-length', async () => {
    const a = await request(upstream, '/large?mb=3', { headers: { 'x-test-id': 'large3' } });
    const size = 3 * 1024 * 1024;
    expect(a.status).toBe(200);
    expect(a.headers['content-type']).toBe('application/octet-stream');
    expect(Number(a.headers['content-length'])).toBe(size);
    expect(a.body.length).toBe(size);
    expect(sha256(a.body)).toBe(sha256(generateLargeBody(size)));
    expect(sha256(upstream.sent.get('large3')!)).toBe(sha256(a.body));
    const block = 64 * 1024;
    expect(a.body.subarray(0, block).equals(a.body.subarray(block, 2 * block))).toBe(false);
  });

  it('large: default is 10 MB', async () => {
    const a = await request(upstream, '/large');
    expect(a.body.length).toBe(10 * 1024 * 1024);
  });

  it('sse-timed: frames written gap ms apart, send times recorded', async () => {
    const a = await request(upstream, '/sse-timed?frames=4&gap=80', { headers: { 'x-test-id': 'timed' } });
    expect(a.headers['content-type']).toMatch(/^text\/event-stream/);
    const frames = parseSse(a.body);
    expect(frames.map((f) => JSON.parse(f.data).seq)).toEqual([0, 1, 2, 3]);
    const sentAt = upstream.frameSentAt.get('timed')!;
    expect(sentAt).toHaveLength(4);
    for (let i = 1; i < sentAt.length; i++) expect(sentAt[i]! - sentAt[i - 1]!).toBeGreaterThanOrEqual(75);
    // The client saw them spread out as well.
    expect(a.chunkTimes.length).toBe(4);
    expect(a.chunkTimes[3]! - a.chunkTimes[0]!).toBeGreaterThanOrEqual(3 * 60);
    expect(a.chunkTimes[0]!).toBeGreaterThanOrEqual(sentAt[0]!);
  });

  it('reset-mid-stream: client sees an error after partial data; sent holds the partial body', async () => {
    const received: Buffer[] = [];
    const error = await new Promise<NodeJS.ErrnoException>((resolve, reject) => {
      const req = https.request(
        new URL('/reset-mid-stream', upstream.origin),
        { ca: ca.caCertPem, agent: false, headers: { 'x-test-id': 'reset' } },
        (res) => {
          res.on('data', (chunk: Buffer) => received.push(chunk));
          res.on('end', () => reject(new Error('response ended cleanly')));
          res.on('error', resolve);
        },
      );
      req.on('error', resolve);
      req.end();
    });
    expect(error.code).toBe('ECONNRESET');
    const body = Buffer.concat(received);
    expect(body.toString()).toContain('second chunk');
    expect(upstream.sent.get('reset')).toEqual(body);
  });

  it('echo: GET and POST', async () => {
    const get = await request(upstream, '/echo?x=1', { headers: { 'X-Custom': 'Case-Kept' } });
    const getJson = JSON.parse(get.body.toString());
    expect(getJson).toMatchObject({ method: 'GET', url: '/echo?x=1', bodyLength: 0 });
    expect(getJson.headers).toContain('X-Custom');
    expect(getJson.headers).toContain('Case-Kept');

    const payload = Buffer.from('some request body \u00e9', 'utf8');
    const post = await request(upstream, '/echo', { method: 'POST', body: payload });
    expect(JSON.parse(post.body.toString())).toMatchObject({
      method: 'POST',
      url: '/echo',
      bodyLength: payload.length,
      bodySha256: sha256(payload),
    });
  });

  it('tool/weather and 404', async () => {
    const weather = await request(upstream, '/tool/weather?city=Oslo');
    expect(weather.status).toBe(200);
    expect(JSON.parse(weather.body.toString())).toMatchObject({ city: 'Oslo', source: 'test-upstream' });
    const missing = await request(upstream, '/nope');
    expect(missing.status).toBe(404);
    expect(missing.headers['content-type']).toBe('application/json');
    expect(JSON.parse(missing.body.toString()).error.type).toBe('not_found');
  });

  it('default request ids count per method and url', async () => {
    const before = upstream.requests.filter((r) => r.method === 'GET' && r.url === '/tool/weather?city=Rome').length;
    const a = await request(upstream, '/tool/weather?city=Rome');
    const b = await request(upstream, '/tool/weather?city=Rome');
    expect(a.headers['x-upstream-request-id']).toBe(`GET /tool/weather?city=Rome #${before + 1}`);
    expect(b.headers['x-upstream-request-id']).toBe(`GET /tool/weather?city=Rome #${before + 2}`);
    expect(upstream.sent.get(`GET /tool/weather?city=Rome #${before + 2}`)).toEqual(b.body);
  });

  it('keep-alive: several requests on one connection', async () => {
    const server = await startTestUpstream({ tls: { certPem: ca.certPem, keyPem: ca.keyPem } });
    const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const first = await request(server, '/echo', { agent });
      const second = await request(server, '/v1/chat/completions', { agent, method: 'POST', body: '{"stream":true}' });
      const third = await request(server, '/gzip', { agent });
      expect([first.status, second.status, third.status]).toEqual([200, 200, 200]);
      expect(first.socket).toBeInstanceOf(net.Socket);
      expect(second.socket).toBe(first.socket);
      expect(third.socket).toBe(first.socket);
      expect(server.connections).toBe(1);
      expect(server.requests).toHaveLength(3);
    } finally {
      agent.destroy();
      await server.close();
    }
  });

  it('close() destroys idle keep-alive sockets and is idempotent', async () => {
    const server = await startTestUpstream({ tls: { certPem: ca.certPem, keyPem: ca.keyPem } });
    const agent = new https.Agent({ keepAlive: true });
    const res = await request(server, '/echo', { agent });
    const closed = new Promise((resolve) => res.socket.once('close', resolve));
    await Promise.all([server.close(), server.close()]);
    await closed;
    agent.destroy();
  });
});

describe('plain HTTP upstream', () => {
  it('works without TLS', async () => {
    const server = await startTestUpstream({ tls: null });
    try {
      expect(server.origin).toBe(`http://127.0.0.1:${server.port}`);
      const a = await request(server, '/echo', { method: 'POST', body: 'x' });
      expect(JSON.parse(a.body.toString())).toMatchObject({ method: 'POST', bodyLength: 1 });
      expect(server.connections).toBe(1);
    } finally {
      await server.close();
    }
  });
});

describe('IPv6 loopback upstream', () => {
  it('brackets the host in origin and serves over ::1', async (ctx) => {
    let server: TestUpstream;
    try {
      server = await startTestUpstream({ tls: { certPem: ca.certPem, keyPem: ca.keyPem }, host: '::1' });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EADDRNOTAVAIL') return ctx.skip('no IPv6 loopback here');
      throw err;
    }
    try {
      expect(server.origin).toBe(`https://[::1]:${server.port}`);
      const a = await request(server, '/tool/weather?city=Lima');
      expect(JSON.parse(a.body.toString()).city).toBe('Lima');
    } finally {
      await server.close();
    }
  });
});

describe('sink', () => {
  it('accepts and immediately closes connections', async () => {
    const sink = await startSink();
    try {
      const socket = net.connect(sink.port, '127.0.0.1');
      const data: Buffer[] = [];
      socket.on('data', (d: Buffer) => data.push(d));
      await new Promise((resolve) => socket.on('close', resolve));
      expect(Buffer.concat(data).length).toBe(0);
      expect(sink.connections).toBe(1);
    } finally {
      await sink.close();
    }
  });

  it('echo mode echoes', async () => {
    const sink = await startSink({ mode: 'echo' });
    try {
      const socket = net.connect(sink.port, '127.0.0.1');
      socket.write('ping');
      const [reply] = (await new Promise((resolve) => socket.once('data', (d) => resolve([d])))) as [Buffer];
      expect(reply.toString()).toBe('ping');
      socket.destroy();
    } finally {
      await sink.close();
    }
  });
});
