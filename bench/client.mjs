/**
 * A minimal, cheap HTTP/1.1 client for the load generators (proxy-bench.mjs, replay-bench.mjs): raw TLS sockets,
 * direct or through a CONNECT tunnel (with session credentials when given), one request at a time per connection,
 * no body kept (only counted). Using it for every mode keeps the client's own CPU cost small and identical, so the
 * figures are about the servers and proxies.
 */
import net from 'node:net';
import tls from 'node:tls';

const CRLF2 = Buffer.from('\r\n\r\n');

export const now = () => performance.now();

function withTimeout(promise, ms, what, onTimeout) {
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

/** The Proxy-Authorization value that names a daemon session (its id and token). */
export function basicAuth(id, token) {
  return `Basic ${Buffer.from(`${encodeURIComponent(id)}:${encodeURIComponent(token)}`).toString('base64')}`;
}

/** Writes CONNECT on a fresh plain socket to the proxy on 127.0.0.1 and returns the socket at once. */
function sendConnect({ proxyPort, target, proxyAuthorization }) {
  const raw = net.connect({ host: '127.0.0.1', port: proxyPort });
  raw.setNoDelay(true);
  raw.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${proxyAuthorization ? `Proxy-Authorization: ${proxyAuthorization}\r\n` : ''}\r\n`);
  return raw;
}

/** Resolves with `raw` once the proxy answered CONNECT with 200 (bytes after the head are put back); otherwise rejects. */
function tunnelAnswer(raw, target) {
  return new Promise((resolve, reject) => {
    let buffered = Buffer.alloc(0);
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
    const cleanup = () => {
      raw.off('data', onData);
      raw.off('error', onError);
      raw.off('close', onClose);
    };
    raw.on('data', onData);
    raw.on('error', onError);
    raw.on('close', onClose);
  });
}

/** Sends CONNECT `target` on a fresh plain socket to the proxy and resolves with the socket once it answered 200. */
export function connectTunnel({ proxyPort, target, proxyAuthorization, timeoutMs = 15_000 }) {
  const raw = sendConnect({ proxyPort, target, proxyAuthorization });
  return withTimeout(tunnelAnswer(raw, target), timeoutMs, `CONNECT ${target}`, () => raw.destroy());
}

function tlsHandshake(options, onSocket) {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({ ALPNProtocols: ['http/1.1'], ...options });
    onSocket(socket);
    socket.setNoDelay(true);
    const onError = (err) => {
      socket.destroy();
      reject(err);
    };
    socket.once('error', onError);
    socket.once('secureConnect', () => {
      socket.off('error', onError);
      resolve(socket);
    });
  });
}

/**
 * Opens a TLS connection to the origin `host:port`: directly to 127.0.0.1:directPort (default: port) when proxyPort
 * is null, or through a CONNECT tunnel to the proxy on 127.0.0.1:proxyPort (with `proxyAuthorization` when given).
 * `servername` is the SNI (none for IPs); the certificate is checked against it, or against `host` without it
 * (IP literal → iPAddress SAN). `secureContext` carries the CA the client trusts (the upstream CA directly, the
 * proxy's CA through a proxy).
 */
export async function openTls({ proxyPort = null, host, port, directPort = port, servername, secureContext, proxyAuthorization, timeoutMs = 15_000 }) {
  let raw = null;
  let socket = null;
  const work = (async () => {
    if (proxyPort == null) {
      return tlsHandshake({ host: '127.0.0.1', port: directPort, servername, secureContext }, (s) => (socket = s));
    }
    const target = `${host}:${port}`;
    raw = sendConnect({ proxyPort, target, proxyAuthorization });
    await tunnelAnswer(raw, target);
    return tlsHandshake({ socket: raw, host, servername, secureContext }, (s) => (socket = s));
  })();
  return withTimeout(work, timeoutMs, `connect to ${host}:${port}`, () => {
    socket?.destroy();
    raw?.destroy();
  });
}

/** One keep-alive HTTP/1.1 connection; request() / send() may be called again once the previous one resolved. */
export class Conn {
  constructor(socket) {
    this.socket = socket;
    this.pending = null;
    this.closed = false;
    socket.on('data', (chunk) => this.#onData(chunk));
    socket.on('error', (err) => this.#fail(err));
    socket.on('close', () => {
      this.closed = true;
      if (this.pending?.mode === 'eof') this.#finish();
      else this.#fail(new Error('connection closed mid-response'));
    });
  }

  /** Sends `GET path` (see send() for what it resolves with). */
  request(path, { host, close = false, timeoutMs = 15_000 } = {}) {
    const head = `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nUser-Agent: mitm-replay-bench\r\nAccept: */*\r\n${close ? 'Connection: close\r\n' : ''}\r\n`;
    return this.send(head, { timeoutMs, what: `GET ${path}` });
  }

  /**
   * Writes a prebuilt request (string or Buffer) and resolves when the whole response has arrived:
   * { status, bytes (entity bytes), start, firstByte (first entity byte), end, closes (the response said
   * Connection: close) } — times from performance.now().
   */
  send(bytes, { timeoutMs = 15_000, what = 'request' } = {}) {
    if (this.pending) throw new Error('one request at a time');
    if (this.closed) return Promise.reject(new Error('connection is closed'));
    const promise = new Promise((resolve, reject) => {
      this.pending = {
        resolve,
        reject,
        start: now(),
        firstByte: 0,
        head: null,
        status: 0,
        closes: false,
        mode: 'head',
        remaining: 0,
        bytes: 0,
        line: '',
        chunkState: 'size',
      };
    });
    this.socket.write(bytes);
    const pending = this.pending;
    return withTimeout(promise, timeoutMs, what, () => {
      // say how far the response got, for the report
      this.stalled = pending.mode === 'head' ? `no response head (${pending.head?.length ?? 0} bytes of head)` : `head received (status ${pending.status}), ${pending.bytes} body bytes`;
      this.pending = null;
      this.socket.destroy();
    }).catch((err) => {
      if (this.stalled) err.message += `: ${this.stalled}`;
      throw err;
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
    p.resolve({ status: p.status, bytes: p.bytes, start: p.start, firstByte: p.firstByte || now(), end: now(), closes: p.closes });
  }

  #entity(p, length) {
    if (length <= 0) return;
    if (p.bytes === 0) p.firstByte = now();
    p.bytes += length;
  }

  #onData(chunk) {
    const p = this.pending;
    if (!p) return; // nothing expected (e.g. bytes after a close); ignore
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
      else if (length) {
        p.mode = 'length';
        p.remaining = Number(length[1]);
      } else p.mode = 'eof';
      if (p.mode === 'length' && p.remaining === 0) return this.#finish();
    }
    if (p.mode === 'length') {
      const take = Math.min(p.remaining, data.length);
      this.#entity(p, take);
      p.remaining -= take;
      if (p.remaining === 0) this.#finish();
      return;
    }
    if (p.mode === 'eof') {
      this.#entity(p, data.length);
      return;
    }
    // chunked
    let pos = 0;
    while (pos < data.length) {
      if (p.chunkState === 'data') {
        const take = Math.min(p.remaining, data.length - pos);
        this.#entity(p, take);
        p.remaining -= take;
        pos += take;
        if (p.remaining === 0) p.chunkState = 'data-crlf';
        continue;
      }
      // 'size', 'data-crlf' and 'trailer' are line-oriented
      const eol = data.indexOf(10, pos);
      if (eol < 0) {
        p.line += data.toString('latin1', pos);
        return;
      }
      const line = (p.line + data.toString('latin1', pos, eol)).replace(/\r$/, '');
      p.line = '';
      pos = eol + 1;
      if (p.chunkState === 'data-crlf') {
        p.chunkState = 'size';
      } else if (p.chunkState === 'size') {
        const size = parseInt(line.split(';')[0], 16);
        if (size === 0) p.chunkState = 'trailer';
        else {
          p.remaining = size;
          p.chunkState = 'data';
        }
      } else if (line === '') {
        return this.#finish(); // end of trailers
      }
    }
  }
}
