/**
 * Test fixture: a local HTTPS (or plain HTTP) "upstream" that imitates the AI
 * provider and tool endpoints the proxy records (OpenAI, Anthropic, a tool API)
 * plus a few torture routes (gzip, large bodies, timed SSE, mid-stream reset).
 *
 * Everything it receives is recorded in `requests`; every response entity body
 * it writes is recorded byte for byte in `sent` (after content-encoding, without
 * chunked framing — i.e. what a recorder should store as the body).
 *
 * Loopback only: binds 127.0.0.1 unless told otherwise.
 */
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import { gzipSync } from 'node:zlib';

export interface UpstreamOptions {
  tls: { certPem: string; keyPem: string } | null;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0 (ephemeral). */
  port?: number;
  /** Pause between SSE frames of the /v1/* streaming routes, so each frame leaves as its own write. Default 5 ms. */
  streamGapMs?: number;
}

export interface RecordedRequest {
  method: string;
  url: string;
  rawHeaders: string[];
  body: Buffer;
  /** Epoch milliseconds with sub-millisecond precision (performance.timeOrigin + performance.now()). */
  receivedAt: number;
  /** The key of this request in `sent` / `frameSentAt`. */
  id: string;
}

export interface TestUpstream {
  port: number;
  /** e.g. https://127.0.0.1:PORT (IPv6 hosts are bracketed). */
  origin: string;
  /** Every request received, in order (pushed once its body has been read). */
  requests: RecordedRequest[];
  /**
   * Per request id, the exact response entity-body bytes written. The id is the `x-test-id`
   * request header if given (a repeated id overwrites), else `${method} ${url} #n` where n counts
   * requests with that method and url, from 1. The id is also returned in the
   * `x-upstream-request-id` response header.
   */
  sent: Map<string, Buffer>;
  /** For streaming routes: epoch ms (sub-ms precision) at which each SSE frame was written. */
  frameSentAt: Map<string, number[]>;
  /**
   * Connections accepted so far: completed TLS handshakes for an HTTPS upstream, TCP connections for
   * plain HTTP. A Node client that rejects the certificate still counts (it verifies after the handshake).
   */
  readonly connections: number;
  /** TLS handshakes that failed on the server side (e.g. no shared protocol/cipher, garbage instead of a ClientHello). */
  readonly tlsClientErrors: number;
  /** Closes the server and destroys open sockets (idempotent). */
  close(): Promise<void>;
}

/** Epoch milliseconds with sub-millisecond precision. */
export function nowMs(): number {
  return performance.timeOrigin + performance.now();
}

// ---------------------------------------------------------------------------
// Deterministic payloads (exported so tests can compute expectations)
// ---------------------------------------------------------------------------

export const CHAT_CREATED = 1700000000;
export const TOOL_ARGUMENT_FRAGMENTS: readonly string[] = ['{"ci', 'ty": "Pa', 'ris"}'];
export const ANTHROPIC_PARTIAL_JSON_FRAGMENTS: readonly string[] = ['', '{"city": ', '"Paris"}'];

/** The JSON document that GET /gzip serves (compressed). */
export const GZIP_DOCUMENT = {
  object: 'list',
  compressed: true,
  data: Array.from({ length: 50 }, (_, i) => ({ id: `item_${i}`, text: `gzip test item number ${i}` })),
};

const MIB = 1024 * 1024;

/**
 * Deterministic, non-repeating (xorshift32, period 2^32-1 words) byte stream used by GET /large.
 * `generateLargeBody(n)` equals the first n bytes GET /large would send.
 */
export class PatternStream {
  private state = 0x9e3779b9;
  next(length: number): Buffer {
    const words = Math.ceil(length / 4);
    const buf = Buffer.allocUnsafe(words * 4);
    let x = this.state;
    for (let i = 0; i < words; i++) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      x >>>= 0;
      buf.writeUInt32LE(x, i * 4);
    }
    this.state = x;
    // A partial trailing word is dropped; /large only asks for multiples of 4 until the last chunk.
    return buf.subarray(0, length);
  }
}

export function generateLargeBody(bytes: number): Buffer {
  return new PatternStream().next(bytes);
}

/** Deterministic embedding: floats in [-1, 1] derived from sha256(text). */
export function embeddingFor(text: string, dimensions = 8): number[] {
  const out: number[] = [];
  for (let block = 0; out.length < dimensions; block++) {
    const digest = createHash('sha256').update(`${block}:${text}`).digest();
    for (let i = 0; i + 1 < digest.length && out.length < dimensions; i += 2) {
      out.push(Math.round(((digest.readUInt16BE(i) / 0xffff) * 2 - 1) * 1e6) / 1e6);
    }
  }
  return out;
}

export function weatherFor(city: string): { city: string; temperatureC: number; conditions: string; source: string } {
  const h = createHash('sha256').update(city).digest();
  const conditions = ['sunny', 'cloudy', 'rain', 'snow', 'windy'];
  return { city, temperatureC: (h[0]! % 40) - 5, conditions: conditions[h[1]! % conditions.length]!, source: 'test-upstream' };
}

function openAiChunk(model: string, delta: unknown, finishReason: string | null): string {
  return JSON.stringify({
    id: 'chatcmpl-test-1',
    object: 'chat.completion.chunk',
    created: CHAT_CREATED,
    model,
    choices: [{ index: 0, delta, finish_reason: finishReason }],
  });
}

/** The SSE frames of a streaming chat completion (each a separate write). */
export function openAiStreamFrames(model: string): string[] {
  const frames = [
    openAiChunk(
      model,
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ index: 0, id: 'call_test_1', type: 'function', function: { name: 'get_weather', arguments: '' } }],
      },
      null,
    ),
    ...TOOL_ARGUMENT_FRAGMENTS.map((arguments_) =>
      openAiChunk(model, { tool_calls: [{ index: 0, function: { arguments: arguments_ } }] }, null),
    ),
    openAiChunk(model, {}, 'tool_calls'),
    '[DONE]',
  ];
  return frames.map((data) => `data: ${data}\n\n`);
}

export function openAiCompletion(model: string): unknown {
  return {
    id: 'chatcmpl-test-1',
    object: 'chat.completion',
    created: CHAT_CREATED,
    model,
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: 'Hello from the test upstream.', refusal: null },
        logprobs: null,
        finish_reason: 'stop',
      },
    ],
    usage: { prompt_tokens: 12, completion_tokens: 6, total_tokens: 18 },
  };
}

function sseEvent(event: string, data: unknown): string {
  return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

/** The SSE frames of a streaming Anthropic message (each a separate write). */
export function anthropicStreamFrames(model: string): string[] {
  const [first, ...rest] = ANTHROPIC_PARTIAL_JSON_FRAGMENTS;
  const delta = (partial_json: string) =>
    sseEvent('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'input_json_delta', partial_json } });
  return [
    sseEvent('message_start', {
      type: 'message_start',
      message: {
        id: 'msg_test_1',
        type: 'message',
        role: 'assistant',
        model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: 400, output_tokens: 1 },
      },
    }),
    sseEvent('content_block_start', {
      type: 'content_block_start',
      index: 0,
      content_block: { type: 'tool_use', id: 'toolu_test_1', name: 'get_weather', input: {} },
    }),
    delta(first!),
    sseEvent('ping', { type: 'ping' }),
    ...rest.map(delta),
    sseEvent('content_block_stop', { type: 'content_block_stop', index: 0 }),
    sseEvent('message_delta', {
      type: 'message_delta',
      delta: { stop_reason: 'tool_use', stop_sequence: null },
      usage: { output_tokens: 40 },
    }),
    sseEvent('message_stop', { type: 'message_stop' }),
  ];
}

export function anthropicMessage(model: string): unknown {
  return {
    id: 'msg_test_1',
    type: 'message',
    role: 'assistant',
    model,
    content: [{ type: 'text', text: 'Hello from the test upstream.' }],
    stop_reason: 'end_turn',
    stop_sequence: null,
    usage: { input_tokens: 12, output_tokens: 6 },
  };
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Wraps a response so every entity-body byte written is recorded under `id`. */
class RecordingBody {
  private chunks: Buffer[] = [];
  private recorded = false;
  private closed = false;

  constructor(
    private readonly res: http.ServerResponse,
    private readonly id: string,
    private readonly sent: Map<string, Buffer>,
  ) {
    // Whatever happens (client abort, server close), keep what was written so far.
    res.on('close', () => {
      this.closed = true;
      this.record();
    });
  }

  get alive(): boolean {
    return !this.closed && !this.res.destroyed && !this.res.writableEnded;
  }

  /** Writes one chunk; resolves once it may write more (honours backpressure). False if the response is gone. */
  async write(chunk: Buffer | string): Promise<boolean> {
    if (!this.alive) return false;
    const buf = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
    this.chunks.push(buf);
    if (this.res.write(buf)) return true;
    await new Promise<void>((resolve) => {
      const done = () => {
        this.res.off('drain', done);
        this.res.off('close', done);
        resolve();
      };
      this.res.on('drain', done);
      this.res.on('close', done);
    });
    return this.alive;
  }

  end(chunk?: Buffer | string): void {
    if (!this.alive) return this.record();
    if (chunk !== undefined) {
      const buf = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
      this.chunks.push(buf);
      this.record();
      this.res.end(buf);
    } else {
      this.record();
      this.res.end();
    }
  }

  /** Records the bytes written so far (used before a deliberate reset). */
  record(): void {
    if (this.recorded) return;
    this.recorded = true;
    this.sent.set(this.id, Buffer.concat(this.chunks));
  }
}

interface RouteContext {
  req: http.IncomingMessage;
  res: http.ServerResponse;
  url: URL;
  body: Buffer;
  out: RecordingBody;
  id: string;
  upstream: TestUpstream;
  streamGapMs: number;
}

function sendJson(ctx: RouteContext, status: number, value: unknown, extraHeaders: http.OutgoingHttpHeaders = {}): void {
  const bytes = Buffer.from(JSON.stringify(value), 'utf8');
  ctx.res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': bytes.length,
    ...extraHeaders,
  });
  ctx.out.end(bytes);
}

function parseJsonBody(ctx: RouteContext): Record<string, unknown> | null {
  try {
    const value: unknown = JSON.parse(ctx.body.toString('utf8'));
    if (value !== null && typeof value === 'object' && !Array.isArray(value)) return value as Record<string, unknown>;
  } catch {
    // fall through
  }
  sendJson(ctx, 400, { error: { type: 'invalid_request_error', message: 'request body must be a JSON object' } });
  return null;
}

/** Writes SSE frames one write at a time, `gapMs` apart, recording each frame's send time. */
async function streamFrames(ctx: RouteContext, frames: string[], gapMs: number): Promise<void> {
  ctx.res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
  });
  ctx.res.flushHeaders();
  const times: number[] = [];
  ctx.upstream.frameSentAt.set(ctx.id, times);
  for (let i = 0; i < frames.length; i++) {
    if (i > 0 && gapMs > 0) await sleep(gapMs);
    times.push(nowMs());
    if (!(await ctx.out.write(frames[i]!))) return;
  }
  ctx.out.end();
}

function numParam(url: URL, name: string, fallback: number, min: number, max: number): number | null {
  const raw = url.searchParams.get(name);
  if (raw === null || raw === '') return fallback;
  const value = Number(raw);
  return Number.isFinite(value) && value >= min && value <= max ? value : null;
}

async function route(ctx: RouteContext): Promise<void> {
  const { req, url } = ctx;
  const method = req.method ?? 'GET';
  const path = url.pathname;

  if (method === 'POST' && path === '/v1/chat/completions') {
    const body = parseJsonBody(ctx);
    if (!body) return;
    const model = typeof body.model === 'string' ? body.model : 'gpt-4o-mini';
    if (body.stream === true) return streamFrames(ctx, openAiStreamFrames(model), ctx.streamGapMs);
    return sendJson(ctx, 200, openAiCompletion(model));
  }

  if (method === 'POST' && path === '/v1/messages') {
    const body = parseJsonBody(ctx);
    if (!body) return;
    const model = typeof body.model === 'string' ? body.model : 'claude-haiku-4-5';
    if (body.stream === true) return streamFrames(ctx, anthropicStreamFrames(model), ctx.streamGapMs);
    return sendJson(ctx, 200, anthropicMessage(model));
  }

  if (method === 'POST' && path === '/v1/embeddings') {
    const body = parseJsonBody(ctx);
    if (!body) return;
    const model = typeof body.model === 'string' ? body.model : 'text-embedding-3-small';
    const inputs = Array.isArray(body.input) ? body.input.map(String) : [String(body.input ?? '')];
    const dimensions = typeof body.dimensions === 'number' && body.dimensions > 0 ? Math.min(body.dimensions, 4096) : 8;
    return sendJson(ctx, 200, {
      object: 'list',
      data: inputs.map((input, index) => ({ object: 'embedding', index, embedding: embeddingFor(input, dimensions) })),
      model,
      usage: { prompt_tokens: inputs.length, total_tokens: inputs.length },
    });
  }

  if (method === 'GET' && path === '/gzip') {
    // Always gzip, whatever accept-encoding says: the test wants compressed bytes on the wire.
    const compressed = gzipSync(Buffer.from(JSON.stringify(GZIP_DOCUMENT), 'utf8'));
    ctx.res.writeHead(200, {
      'content-type': 'application/json',
      'content-encoding': 'gzip',
      'content-length': compressed.length,
      vary: 'accept-encoding',
    });
    return ctx.out.end(compressed);
  }

  if (method === 'GET' && path === '/large') {
    const mb = numParam(url, 'mb', 10, 0, 1024);
    if (mb === null) return sendJson(ctx, 400, { error: { message: 'mb must be a number in [0, 1024]' } });
    const total = Math.floor(mb * MIB);
    ctx.res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total });
    const pattern = new PatternStream();
    for (let written = 0; written < total; ) {
      const size = Math.min(64 * 1024, total - written);
      written += size;
      // The last bytes go through end(), so `sent` is complete before the client can have them all.
      if (written === total) return ctx.out.end(pattern.next(size));
      if (!(await ctx.out.write(pattern.next(size)))) return;
    }
    return ctx.out.end();
  }

  if (method === 'GET' && path === '/sse-timed') {
    const frames = numParam(url, 'frames', 5, 0, 10_000);
    const gap = numParam(url, 'gap', 50, 0, 60_000);
    if (frames === null || gap === null) return sendJson(ctx, 400, { error: { message: 'bad frames or gap' } });
    const list = Array.from({ length: Math.floor(frames) }, (_, seq) => `id: ${seq}\ndata: ${JSON.stringify({ seq, of: frames })}\n\n`);
    return streamFrames(ctx, list, gap);
  }

  if (method === 'GET' && path === '/reset-mid-stream') {
    ctx.res.writeHead(200, { 'content-type': 'application/octet-stream' }); // chunked, no content-length
    ctx.res.flushHeaders();
    await ctx.out.write('first chunk of a response that will never finish\n');
    await sleep(20);
    await ctx.out.write('second chunk, then the connection dies\n');
    await sleep(20);
    ctx.out.record();
    req.socket.destroy(); // no terminating chunk, no close_notify
    return;
  }

  if (path === '/echo') {
    return sendJson(ctx, 200, {
      method,
      url: req.url,
      headers: req.rawHeaders,
      bodyLength: ctx.body.length,
      bodySha256: createHash('sha256').update(ctx.body).digest('hex'),
    });
  }

  if (method === 'GET' && path === '/tool/weather') {
    return sendJson(ctx, 200, weatherFor(url.searchParams.get('city') ?? 'Paris'));
  }

  return sendJson(ctx, 404, { error: { type: 'not_found', message: `no route for ${method} ${path}` } });
}

export async function startTestUpstream(options: UpstreamOptions): Promise<TestUpstream> {
  const host = options.host ?? '127.0.0.1';
  const streamGapMs = options.streamGapMs ?? 5;
  const sockets = new Set<net.Socket>();
  const perKeyCount = new Map<string, number>();
  let connections = 0;
  let tlsClientErrors = 0;
  let closing: Promise<void> | null = null;

  const server: http.Server = options.tls
    ? https.createServer({ cert: options.tls.certPem, key: options.tls.keyPem })
    : http.createServer();
  server.keepAliveTimeout = 10_000;

  server.on('connection', (socket: net.Socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    if (!options.tls) connections++;
  });
  if (options.tls) {
    server.on('secureConnection', () => connections++);
    server.on('tlsClientError', () => tlsClientErrors++);
  }

  const upstream: TestUpstream = {
    port: 0,
    origin: '',
    requests: [],
    sent: new Map(),
    frameSentAt: new Map(),
    get connections() {
      return connections;
    },
    get tlsClientErrors() {
      return tlsClientErrors;
    },
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const socket of sockets) socket.destroy();
      });
      return closing;
    },
  };

  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const receivedAt = nowMs();
    const method = req.method ?? 'GET';
    const rawUrl = req.url ?? '/';
    const testId = req.headers['x-test-id'];
    let id: string;
    if (typeof testId === 'string' && testId !== '') {
      id = testId;
    } else {
      const key = `${method} ${rawUrl}`;
      const n = (perKeyCount.get(key) ?? 0) + 1;
      perKeyCount.set(key, n);
      id = `${key} #${n}`;
    }
    res.on('error', () => {}); // a client going away mid-response is not a fixture error
    res.setHeader('x-upstream-request-id', id);

    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('error', () => {});
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      upstream.requests.push({ method, url: rawUrl, rawHeaders: [...req.rawHeaders], body, receivedAt, id });
      const ctx: RouteContext = {
        req,
        res,
        url: new URL(rawUrl, 'http://upstream.invalid'),
        body,
        out: new RecordingBody(res, id, upstream.sent),
        id,
        upstream,
        streamGapMs,
      };
      route(ctx).catch((err: unknown) => {
        if (!res.headersSent) {
          sendJson(ctx, 500, { error: { type: 'fixture_error', message: String(err) } });
        } else {
          res.destroy();
        }
      });
    });
  });

  server.listen(options.port ?? 0, host);
  await once(server, 'listening');
  const address = server.address() as net.AddressInfo;
  upstream.port = address.port;
  const hostPart = net.isIPv6(host) ? `[${host}]` : host;
  upstream.origin = `${options.tls ? 'https' : 'http'}://${hostPart}:${address.port}`;
  return upstream;
}

// ---------------------------------------------------------------------------
// Sink
// ---------------------------------------------------------------------------

export interface Sink {
  port: number;
  /** TCP connections accepted so far. */
  readonly connections: number;
  close(): Promise<void>;
}

/**
 * Starts a local plain TCP server on 127.0.0.1 — a "sink" for catch-all --connect-to in tests.
 * mode 'close' (default) accepts and immediately closes each connection; 'echo' echoes bytes back.
 */
export async function startSink(options: { mode?: 'close' | 'echo' } = {}): Promise<Sink> {
  const mode = options.mode ?? 'close';
  const sockets = new Set<net.Socket>();
  let connections = 0;
  let closing: Promise<void> | null = null;
  const server = net.createServer((socket) => {
    connections++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    if (mode === 'echo') {
      socket.pipe(socket);
    } else {
      socket.end();
    }
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as net.AddressInfo).port,
    get connections() {
      return connections;
    },
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const socket of sockets) socket.destroy();
      });
      return closing;
    },
  };
}
