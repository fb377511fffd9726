#!/usr/bin/env node
// Measures whether the `http-mitm-proxy` package (installed as a dependency)
// can satisfy mitm-replay's verbatim-capture requirements.
//
// Everything runs on 127.0.0.1 only:
//   raw TLS client --CONNECT--> http-mitm-proxy --TLS--> raw TLS upstream
// The upstream is a tls.createServer that logs the exact decrypted bytes it
// receives and answers with hand-written bytes; the client logs the exact
// bytes it receives.  We then diff both directions.
//
// Usage: node scripts/compare-http-mitm-proxy.mjs
// Self-contained, exits on its own in well under 30 s.

import net from 'node:net';
import tls from 'node:tls';
import https from 'node:https';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { performance, monitorEventLoopDelay } from 'node:perf_hooks';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Proxy } = require('http-mitm-proxy');
const mitmPkg = require('http-mitm-proxy/package.json');

const LOOPBACK = '127.0.0.1';
const T_START = performance.now();
const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'cmp-http-mitm-proxy-'));
const openSockets = new Set();
const servers = [];
const proxies = [];
const libLog = [];

// ---------------------------------------------------------------- output utils
const out = (...a) => console.log(...a);
const origDebug = console.debug;
const origInfo = console.info;
const origError = console.error;
// http-mitm-proxy logs through console.debug/info/error; keep it but tag it.
console.debug = (...a) => { libLog.push(['debug', a.join(' ')]); out('    [http-mitm-proxy console.debug]', ...a); };
console.info = (...a) => { libLog.push(['info', a.join(' ')]); out('    [http-mitm-proxy console.info]', ...a); };
console.error = (...a) => { libLog.push(['error', a.map(String).join(' ')]); out('    [http-mitm-proxy console.error]', ...a.map(String)); };

function vis(buf) {
  // Printable rendering of bytes: CR/LF/TAB made visible, non-ASCII as \xNN.
  let s = '';
  for (const b of buf) {
    if (b === 0x0d) s += '\\r';
    else if (b === 0x0a) s += '\\n';
    else if (b === 0x09) s += '\\t';
    else if (b >= 0x20 && b < 0x7f) s += String.fromCharCode(b);
    else s += '\\x' + b.toString(16).padStart(2, '0');
  }
  return s;
}
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex').slice(0, 16);
const ms = (x) => x.toFixed(1).padStart(7) + ' ms';
const hr = (t) => out('\n' + '='.repeat(100) + '\n' + t + '\n' + '='.repeat(100));

function sideBySide(leftTitle, left, rightTitle, right) {
  // Line-by-line (split after each \n) two-column view of two byte strings.
  const split = (b) => {
    const parts = [];
    let p = 0;
    for (;;) {
      const i = b.indexOf(0x0a, p);
      if (i < 0) { if (p < b.length) parts.push(b.subarray(p)); break; }
      parts.push(b.subarray(p, i + 1));
      p = i + 1;
    }
    return parts.map(vis);
  };
  const L = split(left), R = split(right);
  const w = Math.max(leftTitle.length, ...L.map((s) => s.length), 20);
  out(`  ${leftTitle.padEnd(w)} | =? | ${rightTitle}`);
  out(`  ${'-'.repeat(w)}-+----+-${'-'.repeat(Math.min(60, w))}`);
  for (let i = 0; i < Math.max(L.length, R.length); i++) {
    const l = L[i] ?? '', r = R[i] ?? '';
    out(`  ${l.padEnd(w)} | ${l === r ? ' =' : '!='} | ${r}`);
  }
}

// --------------------------------------------------------- minimal HTTP framing
function parseHead(buf, headEnd) {
  const lines = buf.subarray(0, headEnd).toString('latin1').split('\r\n');
  const start = lines[0];
  const fields = lines.slice(1).map((l) => {
    const i = l.indexOf(':');
    return { raw: l, name: l.slice(0, i), value: l.slice(i + 1) };
  });
  return { start, fields };
}

// Returns null if incomplete, else { headLen, total (-1 = until close), head, chunks }
function frame(buf, isResponse) {
  const he = buf.indexOf('\r\n\r\n');
  if (he < 0) return null;
  const headLen = he + 4;
  const head = parseHead(buf, he);
  const get = (n) => head.fields.filter((f) => f.name.trim().toLowerCase() === n).map((f) => f.value.trim());
  const te = get('transfer-encoding').join(',').toLowerCase();
  const cl = get('content-length')[0];
  const status = isResponse ? Number(head.start.split(' ')[1]) : 0;
  if (isResponse && (status === 204 || status === 304 || (status >= 100 && status < 200))) {
    return { headLen, total: headLen, head, chunks: null };
  }
  if (te.includes('chunked')) {
    const chunks = [];
    let p = headLen;
    for (;;) {
      const le = buf.indexOf('\r\n', p);
      if (le < 0) return null;
      const sizeLine = buf.subarray(p, le).toString('latin1');
      const size = parseInt(sizeLine.split(';')[0].trim(), 16);
      p = le + 2;
      if (size === 0) {
        const trailerStart = p;
        for (;;) {
          const e = buf.indexOf('\r\n', p);
          if (e < 0) return null;
          const empty = e === p;
          p = e + 2;
          if (empty) break;
        }
        chunks.push({ sizeLine, size, data: Buffer.alloc(0), trailers: buf.subarray(trailerStart, p - 2) });
        return { headLen, total: p, head, chunks };
      }
      if (buf.length < p + size + 2) return null;
      chunks.push({ sizeLine, size, data: buf.subarray(p, p + size) });
      p += size + 2;
    }
  }
  if (cl !== undefined) {
    const n = Number(cl);
    return buf.length >= headLen + n ? { headLen, total: headLen + n, head, chunks: null } : null;
  }
  if (isResponse) return { headLen, total: -1, head, chunks: null };
  return { headLen, total: headLen, head, chunks: null };
}

function decodedBody(buf, f) {
  if (!f) return Buffer.alloc(0);
  if (f.chunks) return Buffer.concat(f.chunks.map((c) => c.data));
  return buf.subarray(f.headLen, f.total < 0 ? buf.length : f.total);
}

// Compare two HTTP messages byte-for-byte and semantically; return findings.
function diffMessages(label, sent, got, isResponse) {
  const fs_ = frame(sent, isResponse), fg = frame(got, isResponse);
  const findings = [];
  const same = Buffer.compare(sent, got) === 0;
  findings.push(`${label}: byte-identical = ${same}  (sent ${sent.length} B sha256:${sha(sent)}, received ${got.length} B sha256:${sha(got)})`);
  if (same || !fs_ || !fg) {
    if (!fg) findings.push(`${label}: received bytes do not form a complete HTTP message`);
    return findings;
  }
  if (fs_.head.start !== fg.head.start) findings.push(`${label}: start line changed: "${fs_.head.start}" -> "${fg.head.start}"`);
  const byName = (h) => {
    const m = new Map();
    for (const f of h.fields) {
      const k = f.name.trim().toLowerCase();
      if (!m.has(k)) m.set(k, []);
      m.get(k).push(f);
    }
    return m;
  };
  const S = byName(fs_.head), G = byName(fg.head);
  for (const [k, fsArr] of S) {
    const gArr = G.get(k);
    if (!gArr) { findings.push(`${label}: header REMOVED: ${fsArr.map((f) => JSON.stringify(f.raw)).join(', ')}`); continue; }
    if (fsArr.length !== gArr.length) {
      findings.push(`${label}: duplicate handling: ${fsArr.length} line(s) ${JSON.stringify(fsArr.map((f) => f.raw))} -> ${gArr.length} line(s) ${JSON.stringify(gArr.map((f) => f.raw))}`);
      continue;
    }
    fsArr.forEach((f, i) => {
      const g = gArr[i];
      if (f.name !== g.name) findings.push(`${label}: header name case changed: ${JSON.stringify(f.name)} -> ${JSON.stringify(g.name)}`);
      if (f.value !== g.value) {
        const ws = f.value.trim() === g.value.trim();
        findings.push(`${label}: header value ${ws ? 'WHITESPACE' : 'CONTENT'} changed for ${k}: ${JSON.stringify(f.value)} -> ${JSON.stringify(g.value)}`);
      }
    });
  }
  for (const [k, gArr] of G) if (!S.has(k)) findings.push(`${label}: header ADDED: ${gArr.map((f) => JSON.stringify(f.raw)).join(', ')}`);
  const orderS = [...S.keys()].filter((k) => G.has(k));
  const orderG = [...G.keys()].filter((k) => S.has(k));
  if (orderS.join('|') !== orderG.join('|')) findings.push(`${label}: header ORDER changed: [${orderS.join(', ')}] -> [${orderG.join(', ')}]`);
  const desc = (f) => (f.chunks ? `chunked [${f.chunks.map((c) => JSON.stringify(c.sizeLine)).join(', ')}]` : `length-delimited/other (${f.total < 0 ? 'until-close' : f.total - f.headLen} B)`);
  const dS = desc(fs_), dG = desc(fg);
  if (dS !== dG) findings.push(`${label}: body FRAMING changed: ${dS} -> ${dG}`);
  const bS = decodedBody(sent, fs_), bG = decodedBody(got, fg);
  findings.push(`${label}: decoded body identical = ${Buffer.compare(bS, bG) === 0} (${JSON.stringify(bS.toString('latin1'))} vs ${JSON.stringify(bG.toString('latin1'))})`);
  return findings;
}

// --------------------------------------------------------------- certificates
function makeUpstreamCert() {
  const key = path.join(tmpDir, 'upstream.key');
  const crt = path.join(tmpDir, 'upstream.crt');
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost',
    '-keyout', key, '-out', crt,
  ], { stdio: 'ignore' });
  return { key: fs.readFileSync(key), cert: fs.readFileSync(crt) };
}

// ------------------------------------------------------------------ upstream
const RESPONSE_WRITES = [
  Buffer.from(
    'HTTP/1.1 200 OK\r\n' +
    'X-Odd:   spaced\r\n' +
    'content-TYPE: text/plain\r\n' +
    'X-Dup: a\r\n' +
    'X-Dup: b\r\n' +
    'Set-Cookie: a=1\r\n' +
    'Set-Cookie: b=2\r\n' +
    'Transfer-Encoding: chunked\r\n' +
    '\r\n' +
    '5\r\nhello\r\n', 'latin1'),
  Buffer.from('6\r\n world\r\n', 'latin1'),
  Buffer.from('0\r\n\r\n', 'latin1'),
];
// /split: one 11-byte chunk (with a chunk extension) split across two writes,
// followed by a trailer field.
const SPLIT_WRITES = [
  Buffer.from('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n\r\nb;ext=up\r\nhello', 'latin1'),
  Buffer.from(' world\r\n0\r\nX-Trailer: t\r\n\r\n', 'latin1'),
];
const SMALL_RESPONSE = 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Up: 1\r\n\r\nok';

function startUpstream(creds) {
  const state = { connections: 0, requests: [], reads: [], writes: [] };
  const srv = tls.createServer({ key: creds.key, cert: creds.cert }, (sock) => {
    state.connections++;
    openSockets.add(sock);
    sock.on('close', () => openSockets.delete(sock));
    sock.on('error', () => {});
    let buf = Buffer.alloc(0);
    let busy = Promise.resolve();
    sock.on('data', (d) => {
      state.reads.push({ t: performance.now(), n: d.length });
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const f = frame(buf, false);
        if (!f) break;
        const raw = Buffer.from(buf.subarray(0, f.total));
        buf = buf.subarray(f.total);
        state.requests.push({ raw, t: performance.now() });
        const closeAfter = f.head.fields.some((x) => x.name.trim().toLowerCase() === 'connection' && /close/i.test(x.value));
        const target = f.head.start.split(' ')[1];
        busy = busy.then(async () => {
          if (target === '/echo' || target === '/split') {
            const writes = target === '/echo' ? RESPONSE_WRITES : SPLIT_WRITES;
            for (let i = 0; i < writes.length; i++) {
              if (i > 0) await new Promise((r) => setTimeout(r, 30));
              state.writes.push({ t: performance.now(), n: writes[i].length });
              sock.write(writes[i]);
            }
          } else {
            sock.write(closeAfter ? SMALL_RESPONSE.replace('\r\n\r\n', '\r\nConnection: close\r\n\r\n') : SMALL_RESPONSE);
          }
          if (closeAfter) sock.end();
        });
      }
    });
  });
  servers.push(srv);
  return new Promise((resolve) => srv.listen(0, LOOPBACK, () => resolve({ srv, state, port: srv.address().port })));
}

// -------------------------------------------------------------------- client
function wrapClient(sock) {
  const st = { sock, buf: Buffer.alloc(0), waiter: null, closed: false, events: [] };
  openSockets.add(sock);
  const check = () => {
    if (!st.waiter) return;
    const f = frame(st.buf, true);
    if (f && f.total >= 0) {
      const msg = Buffer.from(st.buf.subarray(0, f.total));
      st.buf = st.buf.subarray(f.total);
      const w = st.waiter; st.waiter = null; clearTimeout(w.timer);
      w.resolve({ msg, f, closeAfter: f.head.fields.some((x) => x.name.trim().toLowerCase() === 'connection' && /close/i.test(x.value)) });
    } else if (st.closed) {
      const msg = st.buf; st.buf = Buffer.alloc(0);
      const w = st.waiter; st.waiter = null; clearTimeout(w.timer);
      w.resolve({ msg, f, eof: true, closeAfter: true });
    }
  };
  sock.on('data', (d) => { st.events.push({ t: performance.now(), n: d.length, d: Buffer.from(d) }); st.buf = Buffer.concat([st.buf, d]); check(); });
  const onEnd = () => { st.closed = true; check(); };
  sock.on('end', onEnd);
  sock.on('close', () => { openSockets.delete(sock); onEnd(); });
  sock.on('error', (e) => { st.err = e; onEnd(); });
  st.request = (bytes, timeoutMs = 5000) => new Promise((resolve, reject) => {
    st.events = [];
    const timer = setTimeout(() => { st.waiter = null; reject(new Error('response timeout; got so far: ' + vis(st.buf))); }, timeoutMs);
    st.waiter = { resolve, timer };
    st.t0 = performance.now();
    sock.write(bytes);
    check();
  });
  st.destroy = () => sock.destroy();
  return st;
}

function readConnectReply(sock) {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const onData = (d) => {
      buf = Buffer.concat([buf, d]);
      const i = buf.indexOf('\r\n\r\n');
      if (i >= 0) {
        sock.removeListener('data', onData);
        sock.pause();
        const rest = buf.subarray(i + 4);
        if (rest.length) sock.unshift(rest);
        resolve(buf.subarray(0, i + 4));
      }
    };
    sock.on('data', onData);
    sock.once('error', reject);
  });
}

async function connectViaProxy(proxyPort, authority, servername) {
  const raw = net.connect({ host: LOOPBACK, port: proxyPort });
  openSockets.add(raw);
  raw.on('close', () => openSockets.delete(raw));
  await new Promise((r, j) => { raw.once('connect', r); raw.once('error', j); });
  raw.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  const reply = await readConnectReply(raw);
  const opts = { socket: raw, rejectUnauthorized: false };
  if (servername) opts.servername = servername;
  const t = tls.connect(opts);
  await new Promise((r, j) => { t.once('secureConnect', r); t.once('error', j); });
  const c = wrapClient(t);
  c.connectReply = reply;
  c.peerCert = t.getPeerCertificate();
  return c;
}

async function connectDirect(port, ca) {
  const t = tls.connect({ host: LOOPBACK, port, ca });
  await new Promise((r, j) => { t.once('secureConnect', r); t.once('error', j); });
  return wrapClient(t);
}

// ---------------------------------------------------------------- the proxies
function startMitm(name, listenExtra, hooks) {
  const proxy = new Proxy();
  proxy.errors = [];
  proxy.onError((ctx, err, kind) => proxy.errors.push(`${kind}: ${err && err.message}`));
  if (hooks) hooks(proxy);
  const sslCaDir = path.join(tmpDir, `sslCaDir-${name}`);
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    proxy.listen({ port: 0, host: LOOPBACK, sslCaDir, ...listenExtra }, (err) => {
      if (err) return reject(err);
      proxies.push(proxy);
      resolve({ proxy, port: proxy.httpServer.address().port, startupMs: performance.now() - t0, sslCaDir });
    });
  });
}

function listeningServers() {
  return process._getActiveHandles()
    .filter((h) => h instanceof net.Server && h.listening)
    .map((h) => {
      const a = h.address();
      return `${h.constructor.name}@${typeof a === 'string' ? a : `${a.address}:${a.port}`}`;
    });
}

// ---------------------------------------------------------- verbatim experiment
async function verbatimTest(title, upstream, connect) {
  hr(title);
  const PORT = upstream.port;
  const request = Buffer.from(
    'POST /echo HTTP/1.1\r\n' +
    `Host: 127.0.0.1:${PORT}\r\n` +
    'X-Odd-Case:    spaced   value\r\n' +
    'x-dup: one\r\n' +
    'x-dup: two\r\n' +
    'Transfer-Encoding: chunked\r\n' +
    '\r\n' +
    '5\r\nhello\r\n' +
    '7;ext=1\r\n, world\r\n' +
    '0\r\n\r\n', 'latin1');
  upstream.state.requests = [];
  upstream.state.reads = [];
  upstream.state.writes = [];
  const c = await connect();
  const res = await c.request(request);
  await new Promise((r) => setTimeout(r, 50)); // let any trailing bytes arrive
  const upReq = upstream.state.requests[0]?.raw ?? Buffer.alloc(0);
  const upstreamWrote = Buffer.concat(RESPONSE_WRITES);
  const clientGot = Buffer.concat(c.events.map((e) => e.d));

  out('\n-- REQUEST: what the client wrote (1 write) vs the raw decrypted bytes the upstream received');
  sideBySide('client wrote', request, 'upstream received', upReq);
  const t0 = c.t0;
  out(`  upstream TLS reads for this request: ${upstream.state.reads.length} -> ${upstream.state.reads.map((r) => `${r.n}B@+${(r.t - t0).toFixed(1)}ms`).join(', ')}`);

  out('\n-- RESPONSE: what the upstream wrote (3 writes, 30 ms apart) vs what the client received');
  sideBySide('upstream wrote', upstreamWrote, 'client received', clientGot);
  out(`  upstream writes : ${upstream.state.writes.length} -> ${upstream.state.writes.map((w) => `${w.n}B@+${(w.t - t0).toFixed(1)}ms`).join(', ')}`);
  out(`  client data evts: ${c.events.length} -> ${c.events.map((e) => `${e.n}B@+${(e.t - t0).toFixed(1)}ms`).join(', ')}`);
  c.events.forEach((e, i) => out(`     event ${i}: ${JSON.stringify(vis(e.d))}`));

  out('\n-- FINDINGS');
  const f1 = diffMessages('request ', request, upReq, false);
  const f2 = diffMessages('response', upstreamWrote, clientGot, true);
  for (const f of [...f1, ...f2]) out('  * ' + f);
  c.destroy();
  return { request, upReq, clientGot, events: c.events, writes: upstream.state.writes, t0 };
}

// ------------------------------------------------------------ timing experiment
async function timeSequential(label, n, upstream, connectFn, { closePerConn = true } = {}) {
  const PORT = upstream.port;
  const req = Buffer.from(`GET /small HTTP/1.1\r\nHost: 127.0.0.1:${PORT}\r\n\r\n`, 'latin1');
  const connsBefore = upstream.state.connections;
  let conn = null, clientConns = 0, ok = 0;
  const lat = [];
  const t0 = performance.now();
  let sample = null;
  for (let i = 0; i < n; i++) {
    if (!conn || conn.closed) { conn = await connectFn(); clientConns++; }
    const s = performance.now();
    const r = await conn.request(req);
    lat.push(performance.now() - s);
    if (r.f && decodedBody(r.msg, r.f).toString() === 'ok') ok++;
    if (i === 0) sample = r.msg;
    if (r.closeAfter) { conn.destroy(); conn = null; }
  }
  const total = performance.now() - t0;
  if (conn && closePerConn) conn.destroy();
  lat.sort((a, b) => a - b);
  const pct = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
  return {
    label, n, ok, total, clientConns,
    upstreamConns: upstream.state.connections - connsBefore,
    mean: lat.reduce((a, b) => a + b, 0) / n, p50: pct(0.5), p99: pct(0.99), sample,
  };
}

// ---------------------------------------------------------------------- main
async function main() {
  out(`http-mitm-proxy ${mitmPkg.version}, node ${process.version}, tmp ${tmpDir}`);

  hr('STATIC: grep of node_modules/http-mitm-proxy/dist/lib/proxy.js');
  const libSrc = fs.readFileSync(require.resolve('http-mitm-proxy/dist/lib/proxy.js'), 'utf8').split('\n');
  const pats = [/createServer/, /SNICallback/, /addContext/, /rawHeaders/, /filterAndCanonizeHeaders\(/, /transfer-encoding/, /\["connection"\]/, /host: "0\.0\.0\.0"/, /rejectUnauthorized/];
  libSrc.forEach((l, i) => { if (pats.some((p) => p.test(l))) out(`  proxy.js:${String(i + 1).padStart(4)}: ${l.trim()}`); });
  out(`  'SNICallback' occurrences: ${libSrc.filter((l) => /SNICallback/.test(l)).length}; 'rawHeaders' occurrences: ${libSrc.filter((l) => /rawHeaders/.test(l)).length}; 'rejectUnauthorized' occurrences: ${libSrc.filter((l) => /rejectUnauthorized/.test(l)).length}`);

  const creds = makeUpstreamCert();
  const upstream = await startUpstream(creds);
  out(`\nupstream HTTPS (raw tls.createServer) on ${LOOPBACK}:${upstream.port}`);

  // A: defaults. The only non-default is an https.Agent that trusts our throwaway
  //    upstream cert (the lib's own agent would reject a self-signed upstream).
  //    keepAlive:false mirrors the lib's default internal agent.
  const A = await startMitm('A-default', { httpsAgent: new https.Agent({ keepAlive: false, ca: creds.cert }) });
  // B: keepAlive:true (proxy option + upstream agent).
  const B = await startMitm('B-keepalive', { keepAlive: true, httpsAgent: new https.Agent({ keepAlive: true, ca: creds.cert }) });
  // C: like B plus pass-through (non-modifying) observer hooks a recorder would need.
  const observed = { reqRawHeaders: null, reqData: [], resRawHeaders: null, resData: [] };
  const C = await startMitm('C-observers', { keepAlive: true, httpsAgent: new https.Agent({ keepAlive: true, ca: creds.cert }) }, (p) => {
    p.onRequest((ctx, cb) => { observed.reqRawHeaders = ctx.clientToProxyRequest.rawHeaders; cb(); });
    p.onRequestData((ctx, chunk, cb) => { observed.reqData.push(Buffer.from(chunk)); cb(null, chunk); });
    p.onResponse((ctx, cb) => { observed.resRawHeaders = ctx.serverToProxyResponse.rawHeaders; cb(); });
    p.onResponseData((ctx, chunk, cb) => { observed.resData.push(Buffer.from(chunk)); cb(null, chunk); });
  });
  out(`proxy A (defaults)            on ${LOOPBACK}:${A.port}  (listen() incl. CA generation: ${A.startupMs.toFixed(0)} ms)`);
  out(`proxy B (keepAlive:true)      on ${LOOPBACK}:${B.port}  (listen(): ${B.startupMs.toFixed(0)} ms)`);
  out(`proxy C (B + observer hooks)  on ${LOOPBACK}:${C.port}  (listen(): ${C.startupMs.toFixed(0)} ms)`);

  // ---- per-host HTTPS server check (runtime)
  hr('PER-HOST HTTPS SERVER CHECK (runtime, proxy A)');
  const before = listeningServers();
  out(`  listening net.Server handles before first CONNECT (${before.length}): ${before.join(', ')}`);
  out(`  proxy A sslServers keys before: ${JSON.stringify(Object.keys(A.proxy.sslServers))}`);
  const eld = monitorEventLoopDelay({ resolution: 1 });
  eld.enable();
  let t = performance.now();
  const first = await connectViaProxy(A.port, `127.0.0.1:${upstream.port}`);
  const firstMs = performance.now() - t;
  eld.disable();
  const after1 = listeningServers();
  out(`  first CONNECT+TLS handshake to 127.0.0.1:${upstream.port} took ${firstMs.toFixed(0)} ms; max event-loop delay during it: ${(eld.max / 1e6).toFixed(1)} ms`);
  out(`  CONNECT reply bytes from proxy: ${JSON.stringify(vis(first.connectReply))}`);
  out(`  leaf cert presented to client: subject CN=${first.peerCert.subject?.CN} issuer CN=${first.peerCert.issuer?.CN} SAN=${first.peerCert.subjectaltname} bits=${first.peerCert.bits}`);
  out(`  listening handles after  (${after1.length}): new = ${after1.filter((x) => !before.includes(x)).join(', ') || '(none)'}`);
  out(`  proxy A sslServers keys after: ${JSON.stringify(Object.keys(A.proxy.sslServers))}`);
  first.sock.end();
  // Second, different hostname (TLS handshake only; no HTTP request => no upstream/DNS use).
  eld.reset(); eld.enable();
  t = performance.now();
  const second = await connectViaProxy(A.port, `second-host.invalid:${upstream.port}`, 'second-host.invalid');
  const secondMs = performance.now() - t;
  eld.disable();
  const after2 = listeningServers();
  out(`  CONNECT second-host.invalid (handshake only) took ${secondMs.toFixed(0)} ms; max event-loop delay: ${(eld.max / 1e6).toFixed(1)} ms; leaf CN=${second.peerCert.subject?.CN}`);
  out(`  listening handles after 2nd host (${after2.length}): new = ${after2.filter((x) => !after1.includes(x)).join(', ') || '(none)'}`);
  out(`  proxy A sslServers keys: ${JSON.stringify(Object.keys(A.proxy.sslServers))}`);
  second.sock.end();
  t = performance.now();
  const third = await connectViaProxy(A.port, `127.0.0.1:${upstream.port}`);
  out(`  repeat CONNECT to 127.0.0.1 (server cached): ${(performance.now() - t).toFixed(1)} ms; listening handles now ${listeningServers().length}`);
  third.sock.end();
  out(`  files written to sslCaDir: ${fs.readdirSync(A.sslCaDir, { recursive: true }).filter((f) => /\./.test(f)).join(', ')}`);

  // ---- verbatim tests
  const ctl = await verbatimTest('VERBATIM CONTROL: client -> upstream DIRECT (validates the harness)', upstream, () => connectDirect(upstream.port, creds.cert));
  const va = await verbatimTest('VERBATIM via http-mitm-proxy A (defaults)', upstream, () => connectViaProxy(A.port, `127.0.0.1:${upstream.port}`));
  const vb = await verbatimTest('VERBATIM via http-mitm-proxy B (keepAlive:true)', upstream, () => connectViaProxy(B.port, `127.0.0.1:${upstream.port}`));
  observed.reqData = []; observed.resData = [];
  const vc = await verbatimTest('VERBATIM via http-mitm-proxy C (keepAlive:true + pass-through observer hooks)', upstream, () => connectViaProxy(C.port, `127.0.0.1:${upstream.port}`));
  out('\n-- What a recorder built on http-mitm-proxy hooks can observe (proxy C):');
  out(`  clientToProxyRequest.rawHeaders : ${JSON.stringify(observed.reqRawHeaders)}`);
  out(`  onRequestData chunks            : ${JSON.stringify(observed.reqData.map((b) => b.toString('latin1')))}  (chunk-size lines / extensions not visible)`);
  out(`  serverToProxyResponse.rawHeaders: ${JSON.stringify(observed.resRawHeaders)}`);
  out(`  onResponseData chunks           : ${JSON.stringify(observed.resData.map((b) => b.toString('latin1')))}`);

  // ---- chunk split across TLS writes + response chunk extension + trailer
  hr('RESPONSE RE-FRAMING: one chunk "b;ext=up" split across 2 upstream writes, plus a trailer field');
  const splitReq = Buffer.from(`GET /split HTTP/1.1\r\nHost: 127.0.0.1:${upstream.port}\r\n\r\n`, 'latin1');
  for (const [label, connect] of [
    ['direct', () => connectDirect(upstream.port, creds.cert)],
    ['proxy B', () => connectViaProxy(B.port, `127.0.0.1:${upstream.port}`)],
  ]) {
    upstream.state.writes = [];
    const c = await connect();
    const r = await c.request(splitReq);
    await new Promise((res) => setTimeout(res, 20));
    const got = Buffer.concat(c.events.map((e) => e.d));
    out(`\n  [${label}] upstream writes: ${upstream.state.writes.map((w) => `${w.n}B@+${(w.t - c.t0).toFixed(1)}ms`).join(', ')}; client data events: ${c.events.map((e) => `${e.n}B@+${(e.t - c.t0).toFixed(1)}ms`).join(', ')}`);
    c.events.forEach((e, i) => out(`     event ${i}: ${JSON.stringify(vis(e.d))}`));
    for (const f of diffMessages('  split response', Buffer.concat(SPLIT_WRITES), got, true)) out('  * ' + f);
    const fr = frame(got, true);
    if (fr?.chunks) out(`  * chunk size lines seen by client: ${JSON.stringify(fr.chunks.map((ch) => ch.sizeLine))}; trailer bytes: ${JSON.stringify(vis(fr.chunks.at(-1).trailers))}`);
    c.sock.end();
  }

  // ---- upstream TLS verification with the library's own default agent
  hr('UPSTREAM TLS VERIFICATION: proxy D = pure defaults (no httpsAgent) against the self-signed upstream');
  const D = await startMitm('D-pure-defaults', {});
  {
    const c = await connectViaProxy(D.port, `127.0.0.1:${upstream.port}`);
    const before = upstream.state.requests.length;
    const r = await c.request(Buffer.from(`GET /small HTTP/1.1\r\nHost: 127.0.0.1:${upstream.port}\r\n\r\n`, 'latin1'));
    out(`  client received: ${JSON.stringify(vis(r.msg))}`);
    out(`  requests that reached upstream: ${upstream.state.requests.length - before}; proxy D errors: ${JSON.stringify(D.proxy.errors)}`);
    c.sock.end();
  }

  // ---- timing
  hr('TIMING: 200 sequential small GETs (Content-Length response), one client connection reused when allowed');
  const N = 200;
  const results = [];
  results.push(await timeSequential('direct (client -> upstream TLS)', N, upstream, () => connectDirect(upstream.port, creds.cert)));
  results.push(await timeSequential('via proxy A (defaults)', N, upstream, () => connectViaProxy(A.port, `127.0.0.1:${upstream.port}`)));
  results.push(await timeSequential('via proxy B (keepAlive:true)', N, upstream, () => connectViaProxy(B.port, `127.0.0.1:${upstream.port}`)));
  results.push(await timeSequential('via proxy C (B + observer hooks)', N, upstream, () => connectViaProxy(C.port, `127.0.0.1:${upstream.port}`)));
  out(`  ${'path'.padEnd(34)} ${'ok'.padStart(4)} ${'total'.padStart(10)} ${'mean'.padStart(10)} ${'p50'.padStart(10)} ${'p99'.padStart(10)}  client-conns  new-upstream-TLS-conns`);
  for (const r of results) {
    out(`  ${r.label.padEnd(34)} ${String(r.ok).padStart(4)} ${ms(r.total).padStart(10)} ${ms(r.mean).padStart(10)} ${ms(r.p50).padStart(10)} ${ms(r.p99).padStart(10)}  ${String(r.clientConns).padStart(12)}  ${String(r.upstreamConns).padStart(22)}`);
  }
  out('\n  first /small response as seen by the client on each path (upstream sent: ' + JSON.stringify(SMALL_RESPONSE) + '):');
  for (const r of results) out(`    ${r.label.padEnd(34)} ${JSON.stringify(vis(r.sample))}`);

  // ---- summary
  hr('SUMMARY');
  const eq = (a, b) => Buffer.compare(a, b) === 0;
  out(`  control (direct): request byte-identical=${eq(ctl.request, ctl.upReq)}, response byte-identical=${eq(Buffer.concat(RESPONSE_WRITES), ctl.clientGot)}, client data events=${ctl.events.length}`);
  for (const [n, v] of [['A', va], ['B', vb], ['C', vc]]) {
    out(`  proxy ${n}: request byte-identical=${eq(v.request, v.upReq)}, response byte-identical=${eq(Buffer.concat(RESPONSE_WRITES), v.clientGot)}, client data events=${v.events.length} (upstream wrote 3)`);
  }
  out(`  per-host HTTPS servers: listening handles ${before.length} -> ${after1.length} (1st host) -> ${after2.length} (2nd host); SNICallback in lib: ${libSrc.some((l) => /SNICallback/.test(l))}`);
  out(`  proxy errors: A=${JSON.stringify(A.proxy.errors)} B=${JSON.stringify(B.proxy.errors)} C=${JSON.stringify(C.proxy.errors)}`);
  out(`  http-mitm-proxy console lines: ${libLog.length}`);
}

function cleanup() {
  for (const p of proxies) { try { p.close(); } catch {} }
  for (const s of openSockets) { try { s.destroy(); } catch {} }
  for (const s of servers) { try { s.close(); } catch {} }
  try { fs.rmSync(tmpDir, { recursive: true, force: true }); } catch {}
}

const watchdog = setTimeout(() => {
  origError('WATCHDOG: exceeded 28 s, aborting');
  cleanup();
  process.exit(1);
}, 28_000);

main().then(
  () => {
    cleanup();
    clearTimeout(watchdog);
    out(`\ndone in ${((performance.now() - T_START) / 1000).toFixed(1)} s; temp dir removed: ${!fs.existsSync(tmpDir)}`);
    console.debug = origDebug; console.info = origInfo; console.error = origError;
    process.exit(0);
  },
  (err) => {
    origError('FAILED:', err);
    cleanup();
    process.exit(1);
  },
);
