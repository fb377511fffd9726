/**
 * Shared pieces of the replay bench (self-contained, so it does not depend on the record-path bench's files):
 * a throwaway upstream CA, a cheap raw HTTP/1.1 keep-alive client (direct or through a CONNECT tunnel with
 * session credentials), a control-API client, and a CPU-profile summary. Loopback only.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import forge from 'node-forge';

export const now = () => performance.now();
const CRLF2 = Buffer.from('\r\n\r\n');

// ---------------------------------------------------------------------------------------------------------------
// Throwaway upstream CA (the public web PKI for the bench upstream); keys from node:crypto, signed by forge
// ---------------------------------------------------------------------------------------------------------------

const DAY_MS = 24 * 60 * 60 * 1000;

function rsaKey() {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  return { keyPem: privateKey, key: forge.pki.privateKeyFromPem(privateKey), publicKey: forge.pki.publicKeyFromPem(publicKey) };
}

function serial() {
  const bytes = randomBytes(16);
  bytes[0] &= 0x7f;
  return bytes.toString('hex');
}

/** @param {string[]} names DNS names and IP literals for the upstream's server certificate */
export function createUpstreamCa(names) {
  const ca = rsaKey();
  const caCert = forge.pki.createCertificate();
  caCert.publicKey = ca.publicKey;
  caCert.serialNumber = serial();
  caCert.validity.notBefore = new Date(Date.now() - DAY_MS);
  caCert.validity.notAfter = new Date(Date.now() + 30 * DAY_MS);
  const subject = [
    { name: 'commonName', value: 'mitm-replay replay-bench upstream CA' },
    { name: 'organizationName', value: 'mitm-replay bench (throwaway)' },
  ];
  caCert.setSubject(subject);
  caCert.setIssuer(subject);
  caCert.setExtensions([
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, digitalSignature: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  caCert.sign(ca.key, forge.md.sha256.create());
  const leaf = rsaKey();
  const cert = forge.pki.createCertificate();
  cert.publicKey = leaf.publicKey;
  cert.serialNumber = serial();
  cert.validity.notBefore = new Date(Date.now() - DAY_MS);
  cert.validity.notAfter = new Date(Date.now() + 30 * DAY_MS);
  cert.setSubject([{ name: 'commonName', value: names[0] }]);
  cert.setIssuer(caCert.subject.attributes);
  cert.setExtensions([
    { name: 'basicConstraints', cA: false, critical: true },
    { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
    { name: 'extKeyUsage', serverAuth: true },
    { name: 'subjectAltName', altNames: names.map((n) => (net.isIP(n) ? { type: 7, ip: n } : { type: 2, value: n })) },
    { name: 'subjectKeyIdentifier' },
    { name: 'authorityKeyIdentifier', keyIdentifier: caCert.generateSubjectKeyIdentifier().getBytes() },
  ]);
  cert.sign(ca.key, forge.md.sha256.create());
  return { caCertPem: forge.pki.certificateToPem(caCert), certPem: forge.pki.certificateToPem(cert), keyPem: leaf.keyPem };
}

// ---------------------------------------------------------------------------------------------------------------
// Raw keep-alive client
// ---------------------------------------------------------------------------------------------------------------

export function withTimeout(promise, ms, what, onTimeout) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => {
        onTimeout?.();
        reject(new Error(`${what} timed out after ${ms} ms`));
      }, ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

export function basicAuth(id, token) {
  return `Basic ${Buffer.from(`${encodeURIComponent(id)}:${encodeURIComponent(token)}`).toString('base64')}`;
}

/** Sends CONNECT on a fresh plain socket to the proxy and resolves with the socket once it answered 200. */
export function connectTunnel({ proxyPort, target, proxyAuthorization, timeoutMs = 15_000 }) {
  const raw = net.connect({ host: '127.0.0.1', port: proxyPort });
  raw.setNoDelay(true);
  raw.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${proxyAuthorization ? `Proxy-Authorization: ${proxyAuthorization}\r\n` : ''}\r\n`);
  const answer = new Promise((resolve, reject) => {
    let buffered = Buffer.alloc(0);
    const cleanup = () => {
      raw.off('data', onData);
      raw.off('error', onError);
      raw.off('close', onClose);
    };
    const onData = (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      const end = buffered.indexOf(CRLF2);
      if (end < 0) return;
      cleanup();
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(buffered.toString('latin1', 0, end))?.[1] ?? 0);
      if (status !== 200) {
        raw.destroy();
        reject(new Error(`CONNECT ${target} answered ${status}: ${buffered.toString('utf8', end + 4).trim().slice(0, 200)}`));
        return;
      }
      if (buffered.length > end + 4) raw.unshift(buffered.subarray(end + 4));
      resolve(raw);
    };
    const onError = (err) => {
      cleanup();
      reject(err);
    };
    const onClose = () => {
      cleanup();
      reject(new Error('proxy closed the connection before answering CONNECT'));
    };
    raw.on('data', onData);
    raw.on('error', onError);
    raw.on('close', onClose);
  });
  return withTimeout(answer, timeoutMs, `CONNECT ${target}`, () => raw.destroy());
}

/**
 * A TLS connection to `host:443`-style origin `target`: directly to 127.0.0.1:directPort (the upstream, with the
 * origin's name as SNI), or through a CONNECT tunnel to the proxy. `secureContext` carries the CA trusted.
 */
export async function openTls({ proxyPort = null, directPort, target, servername, secureContext, proxyAuthorization, timeoutMs = 15_000 }) {
  let socket = null;
  const work = (async () => {
    const base = proxyPort == null ? { host: '127.0.0.1', port: directPort } : { socket: await connectTunnel({ proxyPort, target, proxyAuthorization, timeoutMs }) };
    return new Promise((resolve, reject) => {
      socket = tls.connect({ ...base, servername, secureContext, ALPNProtocols: ['http/1.1'] });
      socket.setNoDelay(true);
      socket.once('error', reject);
      socket.once('secureConnect', () => {
        socket.off('error', reject);
        resolve(socket);
      });
    });
  })();
  return withTimeout(work, timeoutMs, `TLS to ${target}`, () => socket?.destroy());
}

/** One keep-alive HTTP/1.1 connection; request(bytes) sends a prebuilt request and resolves with the response. */
export class Conn {
  constructor(socket) {
    this.socket = socket;
    this.pending = null;
    this.closed = false;
    socket.on('data', (chunk) => this.#onData(chunk));
    socket.on('error', (err) => this.#fail(err));
    socket.on('close', () => {
      this.closed = true;
      this.#fail(new Error('connection closed mid-response'));
    });
  }

  /** Resolves { status, bytes, start, end, closes } (times: performance.now()). */
  request(bytes, timeoutMs = 15_000) {
    if (this.pending) throw new Error('one request at a time');
    if (this.closed) return Promise.reject(new Error('connection is closed'));
    const promise = new Promise((resolve, reject) => {
      this.pending = { resolve, reject, start: now(), head: null, status: 0, mode: 'head', remaining: 0, bytes: 0, line: '', chunkState: 'size', closes: false };
    });
    this.socket.write(bytes);
    return withTimeout(promise, timeoutMs, 'request', () => {
      this.pending = null;
      this.socket.destroy();
    });
  }

  close() {
    this.socket.destroy();
  }

  #fail(err) {
    const p = this.pending;
    if (!p) return;
    this.pending = null;
    p.reject(err);
  }

  #finish() {
    const p = this.pending;
    this.pending = null;
    p.resolve({ status: p.status, bytes: p.bytes, start: p.start, end: now(), closes: p.closes });
  }

  #onData(chunk) {
    const p = this.pending;
    if (!p) return;
    let data = chunk;
    if (p.mode === 'head') {
      data = p.head ? Buffer.concat([p.head, chunk]) : chunk;
      const end = data.indexOf(CRLF2);
      if (end < 0) {
        p.head = data;
        return;
      }
      const head = data.toString('latin1', 0, end);
      data = data.subarray(end + 4);
      p.head = null;
      p.status = Number(head.slice(9, 12));
      p.closes = /\r\nconnection:\s*close/i.test(head);
      const length = /\r\ncontent-length:\s*(\d+)/i.exec(head);
      if (/\r\ntransfer-encoding:[^\r]*chunked/i.test(head)) p.mode = 'chunked';
      else {
        p.mode = 'length';
        p.remaining = length ? Number(length[1]) : 0;
      }
      if (p.mode === 'length' && p.remaining === 0) return this.#finish();
    }
    if (p.mode === 'length') {
      const take = Math.min(p.remaining, data.length);
      p.bytes += take;
      p.remaining -= take;
      if (p.remaining === 0) this.#finish();
      return;
    }
    let pos = 0;
    while (pos < data.length) {
      if (p.chunkState === 'data') {
        const take = Math.min(p.remaining, data.length - pos);
        p.bytes += take;
        p.remaining -= take;
        pos += take;
        if (p.remaining === 0) p.chunkState = 'data-crlf';
        continue;
      }
      const eol = data.indexOf(10, pos);
      if (eol < 0) {
        p.line += data.toString('latin1', pos);
        return;
      }
      const line = (p.line + data.toString('latin1', pos, eol)).replace(/\r$/, '');
      p.line = '';
      pos = eol + 1;
      if (p.chunkState === 'data-crlf') p.chunkState = 'size';
      else if (p.chunkState === 'size') {
        const size = parseInt(line.split(';')[0], 16);
        if (size === 0) p.chunkState = 'trailer';
        else {
          p.remaining = size;
          p.chunkState = 'data';
        }
      } else if (line === '') return this.#finish();
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Control API (what the CLI uses): POST /__mitm-replay/api/sessions, POST …/sessions/<id>/end
// ---------------------------------------------------------------------------------------------------------------

export class ControlClient {
  constructor(port, token) {
    this.port = port;
    this.token = token;
    // one keep-alive connection for control calls, as a long-lived CLI/daemon client would have
    this.agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  }

  request(method, path, body, timeoutMs = 60_000) {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port: this.port,
          method,
          path: `/__mitm-replay/api${path}`,
          headers: { authorization: `Bearer ${this.token}`, 'content-type': 'application/json', ...(payload ? { 'content-length': payload.length } : {}) },
          agent: this.agent,
          timeout: timeoutMs,
        },
        (res) => {
          const chunks = [];
          res.on('data', (c) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            let parsed;
            try {
              parsed = JSON.parse(text);
            } catch {
              return reject(new Error(`control ${method} ${path}: ${res.statusCode} ${text.slice(0, 200)}`));
            }
            if (res.statusCode >= 400) reject(new Error(`control ${method} ${path}: ${res.statusCode} ${parsed.error ?? text}`));
            else resolve(parsed);
          });
        },
      );
      req.on('timeout', () => req.destroy(new Error(`control ${method} ${path}: no answer within ${timeoutMs} ms`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  createSession(request) {
    return this.request('POST', '/sessions', request);
  }

  endSession(id, result = {}) {
    return this.request('POST', `/sessions/${encodeURIComponent(id)}/end`, result);
  }

  close() {
    this.agent.destroy();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// CPU profile summary (V8 .cpuprofile, as `node --cpu-prof` or node:inspector write it)
// ---------------------------------------------------------------------------------------------------------------

function shortUrl(url) {
  if (!url) return '';
  const dist = url.indexOf('/dist/');
  if (dist >= 0) return url.slice(dist + 1);
  const nm = url.lastIndexOf('/node_modules/');
  if (nm >= 0) return url.slice(nm + 1);
  return url.replace(/^file:\/\//, '');
}

const frameKey = (f) => {
  const url = shortUrl(f.url);
  return `${f.functionName || '(anonymous)'}${url ? ` ${url}:${f.lineNumber + 1}` : ''}`;
};

/** Top functions by self time, self time per file, and project (dist/) functions by inclusive time. */
export function summarizeProfile(profile, topN = 15) {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  const selfUs = new Map();
  const { samples = [], timeDeltas = [] } = profile;
  for (let i = 0; i < samples.length; i++) selfUs.set(samples[i], (selfUs.get(samples[i]) ?? 0) + Math.max(0, timeDeltas[i + 1] ?? 0));
  let busy = 0;
  let idle = 0;
  const self = new Map();
  const files = new Map();
  const inclusive = new Map();
  for (const [id, us] of selfUs) {
    const node = byId.get(id);
    const name = node.callFrame.functionName;
    if (name === '(idle)') {
      idle += us;
      continue;
    }
    busy += us;
    const key = frameKey(node.callFrame);
    self.set(key, (self.get(key) ?? 0) + us);
    const file = shortUrl(node.callFrame.url) || name || '(native)';
    files.set(file, (files.get(file) ?? 0) + us);
    const seen = new Set();
    for (let cur = id; cur !== undefined; cur = parent.get(cur)) {
      const frame = byId.get(cur).callFrame;
      if (!frame.url.includes('/dist/')) continue;
      const k = frameKey(frame);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + us);
    }
  }
  const top = (map) =>
    [...map.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, topN)
      .map(([key, us]) => ({ key, ms: us / 1000, pct: busy > 0 ? (100 * us) / busy : 0 }));
  return { busyMs: busy / 1000, idleMs: idle / 1000, self: top(self), files: top(files), inclusive: top(inclusive) };
}

export function formatProfile(title, s) {
  const row = (r) => `  ${r.pct.toFixed(1).padStart(5)}%  ${r.ms.toFixed(1).padStart(8)} ms  ${r.key}`;
  return [
    `### ${title}: ${s.busyMs.toFixed(0)} ms busy, ${s.idleMs.toFixed(0)} ms idle`,
    '',
    'Top self time:',
    ...s.self.map(row),
    '',
    'Self time by file:',
    ...s.files.slice(0, 10).map(row),
    '',
    'Project (dist/) functions, inclusive time:',
    ...s.inclusive.map(row),
  ].join('\n');
}
