/**
 * The bench upstream, in a process of its own (forked by proxy-bench.mjs over IPC): a local HTTPS server on
 * 127.0.0.1 with the test upstream's routes that the bench uses (same semantics as test/helpers/upstream.ts):
 *   /echo                          small JSON document describing the request
 *   GET /large?mb=N                N MiB of deterministic bytes (content-length)
 *   GET /sse-timed?frames=N&gap=MS N SSE frames, the first at once, then one every MS ms (chunked)
 * IPC: { type: 'start', certPem, keyPem } → { type: 'ready', port }; { type: 'stats' } → TLS connections and requests
 * accepted so far. Exits when the parent goes away.
 */
import { createHash } from 'node:crypto';
import https from 'node:https';

if (!process.send) {
  console.error('upstream-child.mjs is started by proxy-bench.mjs');
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
  return sendJson(res, 404, { error: { type: 'not_found', message: `no route for ${method} ${url.pathname}` } });
}

const stats = { connections: 0, requests: 0, resumed: 0 };

process.on('message', (message) => {
  if (message.type === 'stats') return process.send({ type: 'stats:done', ...stats });
  if (message.type !== 'start') return;
  const { certPem, keyPem } = message;
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
