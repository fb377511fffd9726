/**
 * The bench upstream, in a process of its own (forked by proxy-bench.mjs, replay-bench.mjs and
 * repro-paused-upstream.mjs over IPC): a local HTTPS server on 127.0.0.1 with the routes the benches use (same
 * shapes as test/helpers/upstream.ts). Every response is deterministic (no dates in bodies), so replayed bodies can
 * be compared with live ones.
 *   /echo                          small JSON document describing the request
 *   GET /large?mb=N                N MiB of deterministic bytes (content-length)
 *   GET /sse-timed?frames=N&gap=MS N SSE frames, the first at once, then one every MS ms (chunked)
 *   POST /v1/chat/completions      OpenAI-style; stream:true → 5 SSE frames, streamGapMs apart (chunked)
 *   POST /v1/embeddings            deterministic embedding
 *   GET /tool/weather?city=X       deterministic weather document
 * IPC: { type: 'start', certPem, keyPem, streamGapMs? (default 5) } → { type: 'ready', port };
 * { type: 'stats' } → TLS connections (and how many resumed) and requests accepted so far.
 * Exits when the parent goes away.
 */
import { createHash } from 'node:crypto';
import https from 'node:https';

if (!process.send) {
  console.error('upstream-child.mjs is started by the benches (proxy-bench.mjs, replay-bench.mjs)');
  process.exit(2);
}

const MIB = 1024 * 1024;
/** One pre-generated 64 KiB block of pseudo-random bytes, reused: the bench measures the proxy, not the generator. */
const BLOCK = (() => {
  const buf = Buffer.allocUnsafe(64 * 1024);
  let x = 0x9e3779b9;
  for (let i = 0; i < buf.length; i += 4) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    buf.writeUInt32LE(x, i);
  }
  return buf;
})();

let streamGapMs = 5;

function num(url, name, fallback) {
  const raw = url.searchParams.get(name);
  const value = raw === null || raw === '' ? fallback : Number(raw);
  return Number.isFinite(value) && value >= 0 ? value : fallback;
}

function sendJson(res, status, value) {
  const body = Buffer.from(JSON.stringify(value));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': body.length });
  res.end(body);
}

function chunk(model, delta, finish) {
  return JSON.stringify({ id: 'chatcmpl-bench-1', object: 'chat.completion.chunk', created: 1700000000, model, choices: [{ index: 0, delta, finish_reason: finish }] });
}

function streamFrames(model) {
  return [
    chunk(model, { role: 'assistant', content: null, tool_calls: [{ index: 0, id: 'call_bench_1', type: 'function', function: { name: 'get_weather', arguments: '' } }] }, null),
    ...['{"ci', 'ty": "Pa', 'ris"}'].map((a) => chunk(model, { tool_calls: [{ index: 0, function: { arguments: a } }] }, null)),
    chunk(model, {}, 'tool_calls'),
    '[DONE]',
  ].map((data) => `data: ${data}\n\n`);
}

function embedding(text, dimensions = 8) {
  const digest = createHash('sha256').update(text).digest();
  return Array.from({ length: dimensions }, (_, i) => Math.round(((digest.readUInt16BE(2 * i) / 0xffff) * 2 - 1) * 1e6) / 1e6);
}

async function route(req, res, body) {
  const url = new URL(req.url ?? '/', 'http://upstream.invalid');
  const method = req.method ?? 'GET';
  if (url.pathname === '/echo') {
    return sendJson(res, 200, {
      method,
      url: req.url,
      headers: req.rawHeaders,
      bodyLength: body.length,
      bodySha256: createHash('sha256').update(body).digest('hex'),
    });
  }
  if (method === 'GET' && url.pathname === '/large') {
    const total = Math.floor(Math.min(num(url, 'mb', 10), 1024) * MIB);
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total });
    for (let written = 0; written < total; ) {
      const size = Math.min(BLOCK.length, total - written);
      written += size;
      const chunk = size === BLOCK.length ? BLOCK : BLOCK.subarray(0, size);
      if (written === total) return res.end(chunk);
      if (!res.write(chunk)) {
        await new Promise((resolve) => {
          const done = () => {
            res.off('drain', done);
            res.off('close', done);
            resolve();
          };
          res.on('drain', done);
          res.on('close', done);
        });
        if (res.destroyed) return;
      }
    }
    return res.end();
  }
  if (method === 'GET' && url.pathname === '/sse-timed') {
    const frames = Math.min(Math.floor(num(url, 'frames', 5)), 10_000);
    const gap = Math.min(num(url, 'gap', 50), 60_000);
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    res.flushHeaders();
    for (let seq = 0; seq < frames; seq++) {
      if (seq > 0 && gap > 0) await new Promise((resolve) => setTimeout(resolve, gap));
      if (res.destroyed) return;
      res.write(`id: ${seq}\ndata: ${JSON.stringify({ seq, of: frames })}\n\n`);
    }
    return res.end();
  }
  if (method === 'POST' && url.pathname === '/v1/chat/completions') {
    const json = JSON.parse(body.toString('utf8') || '{}');
    const model = typeof json.model === 'string' ? json.model : 'gpt-4o-mini';
    if (json.stream === true) {
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
      res.flushHeaders();
      const frames = streamFrames(model);
      for (let i = 0; i < frames.length; i++) {
        if (i > 0 && streamGapMs > 0) await new Promise((resolve) => setTimeout(resolve, streamGapMs));
        if (res.destroyed) return;
        res.write(frames[i]);
      }
      return res.end();
    }
    return sendJson(res, 200, {
      id: 'chatcmpl-bench-2',
      object: 'chat.completion',
      created: 1700000000,
      model,
      choices: [{ index: 0, message: { role: 'assistant', content: 'It is sunny in Paris and rainy in London.', refusal: null }, logprobs: null, finish_reason: 'stop' }],
      usage: { prompt_tokens: 40, completion_tokens: 10, total_tokens: 50 },
    });
  }
  if (method === 'POST' && url.pathname === '/v1/embeddings') {
    const json = JSON.parse(body.toString('utf8') || '{}');
    const inputs = Array.isArray(json.input) ? json.input.map(String) : [String(json.input ?? '')];
    return sendJson(res, 200, {
      object: 'list',
      data: inputs.map((input, index) => ({ object: 'embedding', index, embedding: embedding(input) })),
      model: json.model ?? 'text-embedding-3-small',
      usage: { prompt_tokens: inputs.length, total_tokens: inputs.length },
    });
  }
  if (method === 'GET' && url.pathname === '/tool/weather') {
    const city = url.searchParams.get('city') ?? 'Paris';
    const h = createHash('sha256').update(city).digest();
    return sendJson(res, 200, { city, temperatureC: (h[0] % 40) - 5, conditions: ['sunny', 'cloudy', 'rain', 'snow', 'windy'][h[1] % 5], source: 'bench-upstream' });
  }
  return sendJson(res, 404, { error: { type: 'not_found', message: `no route for ${method} ${url.pathname}` } });
}

const stats = { connections: 0, requests: 0, resumed: 0 };

process.on('message', (message) => {
  if (message.type === 'stats') return process.send({ type: 'stats:done', ...stats });
  if (message.type !== 'start') return;
  const { certPem, keyPem } = message;
  streamGapMs = message.streamGapMs ?? 5;
  const server = https.createServer({ cert: certPem, key: keyPem, ALPNProtocols: ['http/1.1'] });
  server.keepAliveTimeout = 30_000;
  server.headersTimeout = 30_000;
  server.on('secureConnection', (socket) => {
    stats.connections++;
    if (socket.isSessionReused()) stats.resumed++;
  });
  server.on('request', (req, res) => {
    stats.requests++;
    res.on('error', () => {});
    req.on('error', () => {});
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      route(req, res, Buffer.concat(chunks)).catch((err) => {
        if (!res.headersSent) sendJson(res, 500, { error: String(err) });
        else res.destroy();
      });
    });
  });
  server.on('tlsClientError', () => {});
  server.listen(0, '127.0.0.1', () => process.send({ type: 'ready', port: server.address().port }));
});

process.on('disconnect', () => process.exit(0));
