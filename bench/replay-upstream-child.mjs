/**
 * The replay bench's upstream, in a process of its own (forked by replay-bench.mjs over IPC): a local HTTPS
 * server on 127.0.0.1 imitating the routes an agent run touches (same shapes as test/helpers/upstream.ts):
 *   /echo                          small JSON document describing the request (keep-alive load)
 *   POST /v1/chat/completions      OpenAI-style; stream:true → 5 SSE frames, GAP ms apart (chunked)
 *   POST /v1/embeddings            deterministic embedding
 *   GET /tool/weather?city=X       deterministic weather document
 * Every response is deterministic (no dates in bodies), so replayed bodies can be compared with live ones.
 * IPC: { type: 'start', certPem, keyPem, streamGapMs } → { type: 'ready', port }; { type: 'stats' } → counts.
 * Exits when the parent goes away.
 */
import { createHash } from 'node:crypto';
import https from 'node:https';

if (!process.send) {
  console.error('replay-upstream-child.mjs is started by replay-bench.mjs');
  process.exit(2);
}

let streamGapMs = 5;
const stats = { connections: 0, requests: 0 };

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
    return sendJson(res, 200, { method, url: req.url, headers: req.rawHeaders, bodyLength: body.length, bodySha256: createHash('sha256').update(body).digest('hex') });
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

process.on('message', (message) => {
  if (message.type === 'stats') return process.send({ type: 'stats:done', ...stats });
  if (message.type !== 'start') return;
  streamGapMs = message.streamGapMs ?? 5;
  const server = https.createServer({ cert: message.certPem, key: message.keyPem, ALPNProtocols: ['http/1.1'] });
  server.keepAliveTimeout = 30_000;
  server.headersTimeout = 30_000;
  server.on('secureConnection', () => stats.connections++);
  server.on('tlsClientError', () => {});
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
  server.listen(0, '127.0.0.1', () => process.send({ type: 'ready', port: server.address().port }));
});

process.on('disconnect', () => process.exit(0));
