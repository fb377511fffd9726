import net from 'node:net';
import tls from 'node:tls';
import { recordConnectionError, recordTunnel, type TraceWriter } from '../capture/recorder.js';
import type { LeafMinter } from '../ca/leaf.js';
import type { Logger } from '../log.js';
import type { Origin, Route } from '../trace/schema.js';
import { HttpConnection, localResponseBytes, type ConnectionTimeouts, type Dispatch, type LocalResponse } from './connection.js';
import { headerValue, type RequestHead } from './http1.js';
import { isIntercepted } from './intercept.js';
import { safeDecode, type SessionLookup, type SessionRegistry, type SessionTarget } from './sessions.js';
import { ReplayHandler } from '../replay/serve.js';
import { UI_PREFIX, type UiRequest } from '../ui/server.js';
import type { UpstreamPool } from './upstream.js';

/** TLS handshakes in progress at once (see terminateTls), and how long one may take. */
const MAX_CONCURRENT_HANDSHAKES = 4;
const HANDSHAKE_TIMEOUT_MS = 10_000;

/** A counting semaphore: `acquire` resolves with a release function once one of `size` slots is free. */
class Slots {
  private free: number;
  private readonly waiting: (() => void)[] = [];

  constructor(size: number) {
    this.free = size;
  }

  async acquire(): Promise<() => void> {
    if (this.free > 0) this.free--;
    else await new Promise<void>((resolve) => this.waiting.push(resolve));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next) next();
      else this.free++;
    };
  }
}

/** Paths on the daemon's own listener. */
export const BASE_ROUTE_PREFIX = '/__mitm-replay/b/';
export const CONTROL_PREFIX = '/__mitm-replay/api/';

export interface ListenerDeps {
  pool: UpstreamPool;
  minter: LeafMinter;
  sessions: SessionRegistry;
  intercept: string[];
  log: Logger;
  /** what traffic without session credentials does (record into the daemon's trace, or replay) */
  anonymousTarget: () => Promise<SessionTarget>;
  control: (method: string, path: string, authorization: string | undefined, body: Buffer) => Promise<LocalResponse>;
  controlAuthorized: (authorization: string | undefined) => boolean;
  /** the trace viewer (its own cookie auth, loopback only) */
  ui?: (request: UiRequest) => Promise<LocalResponse>;
  timeouts: ConnectionTimeouts;
  /** every request must carry session credentials (a daemon listening beyond loopback, --allow-remote) */
  requireCredentials?: boolean;
  /** the address clients use for the daemon itself (names the leaf served without SNI) */
  listenHost: () => string;
  /** true when host:port is this daemon's own listening address */
  isSelf: (host: string, port: number) => boolean;
}

function proxyAuthRequired(reason: string): LocalResponse {
  return {
    status: 407,
    headers: { 'proxy-authenticate': 'Basic realm="mitm-replay"' },
    body: `mitm-replay: ${reason}\n`,
    close: true,
  };
}

function refuse(status: number, message: string): Dispatch {
  return { kind: 'local', respond: () => ({ status, body: `mitm-replay: ${message}\n`, close: true }) };
}

/** `host:port`, `[v6]:port` → parts; null when malformed. */
export function parseAuthority(authority: string, defaultPort?: number): { host: string; port: number } | null {
  const match = /^(\[[0-9A-Fa-f:.]+\]|[^:[\]\s/]+)(?::(\d{1,5}))?$/.exec(authority);
  if (!match) return null;
  const host = match[1]!.replace(/^\[(.*)\]$/, '$1').toLowerCase();
  const port = match[2] === undefined ? defaultPort : Number(match[2]);
  if (port === undefined || !Number.isInteger(port) || port < 1 || port > 65535) return null;
  if (!net.isIP(host) && !/^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?$/.test(host)) return null;
  return { host, port };
}

function defaultPort(scheme: 'http' | 'https'): number {
  return scheme === 'https' ? 443 : 80;
}

export function hostHeaderFor(origin: Origin): string {
  const host = net.isIPv6(origin.host) ? `[${origin.host}]` : origin.host;
  return origin.port === defaultPort(origin.scheme) ? host : `${host}:${origin.port}`;
}

/**
 * The daemon's front door: one plain-TCP listener serving CONNECT (intercepted or tunnelled), absolute-form
 * proxy requests, the base-URL route for SDKs that ignore HTTPS_PROXY, and the control API.
 */
export class ProxyListener {
  readonly server: net.Server;
  private readonly sockets = new Set<net.Socket>();

  /** the leaf cache: hits, misses and how many hosts it holds */
  get leafStats(): { hits: number; misses: number; size: number } {
    return this.deps.minter.stats;
  }

  constructor(private readonly deps: ListenerDeps) {
    this.server = net.createServer((socket) => this.accept(socket));
  }

  get openConnections(): number {
    return this.sockets.size;
  }

  private track(socket: net.Socket): void {
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
  }

  private async accept(socket: net.Socket): Promise<void> {
    this.track(socket);
    socket.on('error', () => socket.destroy());
    // A client that connects and says nothing is closed after the idle timeout.
    socket.setTimeout(this.deps.timeouts.idleMs, () => socket.destroy());
    // The same port speaks TLS too, so the base-URL route can be https: clients then send exactly what they send
    // to the real origin (undici's fetch, for one, offers `br` only over https).
    const first = await firstByte(socket);
    if (first === null) return;
    socket.setTimeout(0);
    socket.removeAllListeners('timeout');
    let served: net.Socket = socket;
    if (first === 0x16) {
      const tlsSocket = await this.terminateTls(socket, this.deps.listenHost());
      if (!tlsSocket) return;
      served = tlsSocket;
    }
    const connection = new HttpConnection(served, { pool: this.deps.pool, log: this.deps.log, timeouts: this.deps.timeouts, dispatch: (head, client) => this.dispatch(head, client) });
    void connection.run();
  }

  /** TLS server side on a client socket, with a leaf for the SNI name (or `defaultHost` without SNI). */
  private async terminateTls(socket: net.Socket, defaultHost: string, onFailure?: (code: string, message: string) => void): Promise<tls.TLSSocket | null> {
    // A burst of new connections is let into the TLS handshake a few at a time: OpenSSL's work for each
    // handshake (key exchange, signature) runs on the event loop, and a hundred at once would stall every
    // stream in flight. The others wait with their ClientHello unread.
    const release = await this.handshakeSlots.acquire();
    try {
      return await this.handshake(socket, defaultHost, onFailure);
    } finally {
      release();
    }
  }

  private readonly handshakeSlots = new Slots(MAX_CONCURRENT_HANDSHAKES);

  private async handshake(socket: net.Socket, defaultHost: string, onFailure?: (code: string, message: string) => void): Promise<tls.TLSSocket | null> {
    if (socket.destroyed) return null;
    let context: tls.SecureContext;
    try {
      context = await this.deps.minter.secureContextFor(defaultHost);
    } catch (err) {
      onFailure?.('mint-failed', (err as Error).message);
      socket.destroy();
      return null;
    }
    const tlsSocket = new tls.TLSSocket(socket, {
      isServer: true,
      secureContext: context,
      ALPNProtocols: ['http/1.1'],
      SNICallback: (servername, done) => {
        this.deps.minter.secureContextFor(servername || defaultHost).then(
          (ctx) => this.oneHandshakePerTurn(() => done(null, ctx)),
          (err: Error) => done(err),
        );
      },
    });
    this.track(tlsSocket);
    let failure: { code: string; message: string } | null = null;
    tlsSocket.once('error', (err: Error & { code?: string }) => {
      failure ??= { code: err.code ?? 'tls-error', message: `TLS handshake with the client failed: ${err.message}` };
      socket.destroy();
    });
    return new Promise((resolve) => {
      // A client that never finishes its handshake must not hold a handshake slot forever.
      const timer = setTimeout(() => {
        failure ??= { code: 'tls-handshake-timeout', message: `the client did not finish the TLS handshake within ${HANDSHAKE_TIMEOUT_MS / 1000} s` };
        tlsSocket.destroy();
      }, HANDSHAKE_TIMEOUT_MS);
      const onClose = () => {
        clearTimeout(timer);
        // A handshake that never finished (an error, or the client closing midway) is reported, not dropped.
        const { code, message } = failure ?? { code: 'tls-handshake-incomplete', message: 'the client closed the connection before the TLS handshake completed' };
        onFailure?.(code, message);
        resolve(null);
      };
      tlsSocket.once('close', onClose);
      tlsSocket.once('secure', () => {
        clearTimeout(timer);
        tlsSocket.removeListener('close', onClose);
        resolve(tlsSocket);
      });
    });
  }

  private readonly handshakes: (() => void)[] = [];

  /**
   * Continuing a handshake signs with the leaf key (~0.5 ms) synchronously. A burst of new connections would
   * resolve together and run back to back in one turn, stalling every other connection; one per turn keeps
   * the event loop responsive.
   */
  private oneHandshakePerTurn(resume: () => void): void {
    this.handshakes.push(resume);
    if (this.handshakes.length > 1) return;
    const next = () => {
      try {
        this.handshakes.shift()!();
      } finally {
        if (this.handshakes.length > 0) setImmediate(next);
      }
    };
    setImmediate(next);
  }

  destroyAll(): void {
    for (const socket of this.sockets) socket.destroy();
  }

  /** A daemon reachable beyond loopback serves sessions only: anonymous traffic is refused. */
  private authorize(lookup: SessionLookup): SessionLookup {
    if (lookup.kind === 'anonymous' && this.deps.requireCredentials) {
      return { kind: 'rejected', reason: "this daemon listens beyond loopback (--allow-remote): every request needs session credentials (see 'mitm-replay env --trace NAME')" };
    }
    return lookup;
  }

  private async targetFor(lookup: SessionLookup): Promise<SessionTarget> {
    return lookup.kind === 'session' ? lookup.session.target : this.deps.anonymousTarget();
  }

  /** Intercepted hosts: the daemon's policy when recording, the trace's own policy when replaying. */
  private intercepts(target: SessionTarget, host: string): boolean {
    return isIntercepted(target.kind === 'record' ? this.deps.intercept : target.player.intercept, host);
  }

  /**
   * What a request to `origin` does under `target`: recorded and forwarded, forwarded unrecorded (not
   * intercepted), answered from the trace, or refused (replay egress to a host not allowed live).
   */
  private route(
    target: SessionTarget,
    head: RequestHead,
    socket: net.Socket,
    request: { origin: Origin; route: Route; target: string; requestLine?: string; replace?: Map<string, string>; clientTarget?: string },
    /** known already (a decrypted CONNECT tunnel is intercepted by construction) */
    intercepted = this.intercepts(target, request.origin.host),
  ): Dispatch {
    const { origin } = request;
    if (target.kind === 'record') {
      return { kind: 'forward', ...request, writer: intercepted ? target.writer : null };
    }
    if (intercepted) {
      return { kind: 'handler', handler: new ReplayHandler(socket, target.player, { ...request, head }) };
    }
    const allowed = isIntercepted(target.player.options.allowLive, origin.host);
    target.player.noteTunnel(origin.host, origin.port, allowed);
    if (allowed) return { kind: 'forward', ...request, writer: null };
    return refuse(403, `replay: egress to ${origin.host}:${origin.port} refused (not in the trace; allow it with --allow-live ${origin.host})`);
  }

  private async dispatch(head: RequestHead, socket: net.Socket): Promise<Dispatch> {
    if (head.method === 'CONNECT') return this.dispatchConnect(head);
    if (head.target.startsWith(CONTROL_PREFIX)) {
      const authorization = headerValue(head, 'authorization');
      // Check the token before reading any body: blob uploads (workspace files) may be large.
      if (!this.deps.controlAuthorized(authorization)) {
        return { kind: 'local', respond: () => ({ status: 401, headers: { 'content-type': 'application/json' }, body: '{"error":"the control API needs the token from the daemon state file"}\n', close: true }) };
      }
      return { kind: 'local', maxBody: 512 * 1024 * 1024, respond: (body) => this.deps.control(head.method, head.target.slice(CONTROL_PREFIX.length - 1), authorization, body) };
    }
    if (head.target.startsWith(BASE_ROUTE_PREFIX)) return this.dispatchBaseRoute(head, socket);
    const ui = this.deps.ui;
    if (ui && (head.target.startsWith(UI_PREFIX) || head.target === UI_PREFIX.slice(0, -1))) {
      const request: UiRequest = { method: head.method, target: head.target, header: (name) => headerValue(head, name), remoteAddress: socket.remoteAddress };
      return { kind: 'local', respond: () => ui(request) };
    }
    if (/^https?:\/\//i.test(head.target)) return this.dispatchAbsolute(head, socket);
    return refuse(400, `this is the mitm-replay proxy; send requests through it as a proxy (HTTPS_PROXY=http://${'127.0.0.1'}:PORT) or see 'mitm-replay env'`);
  }

  private async dispatchAbsolute(head: RequestHead, socket: net.Socket): Promise<Dispatch> {
    const lookup = this.authorize(this.deps.sessions.checkProxyAuthorization(headerValue(head, 'proxy-authorization')));
    if (lookup.kind === 'rejected') return { kind: 'local', respond: () => proxyAuthRequired(lookup.reason) };
    let url: URL;
    try {
      url = new URL(head.target);
    } catch {
      return refuse(400, `malformed request target '${head.target.slice(0, 200)}'`);
    }
    const scheme = url.protocol === 'https:' ? 'https' : 'http';
    const origin: Origin = { scheme, host: url.hostname.replace(/^\[(.*)\]$/, '$1').toLowerCase(), port: url.port ? Number(url.port) : defaultPort(scheme) };
    if (this.deps.isSelf(origin.host, origin.port)) return refuse(403, `refusing to proxy a request to the proxy itself (${origin.host}:${origin.port})`);
    const target = `${url.pathname}${url.search}`;
    return this.route(await this.targetFor(lookup), head, socket, {
      origin,
      route: 'proxy',
      target,
      requestLine: `${head.method} ${target} ${head.version}`,
      clientTarget: head.target,
    });
  }

  /**
   * `/__mitm-replay/b/<TRACE:TOKEN or ->/<scheme>/<host[:port]>/<path>`: a plain-HTTP route that forwards to the
   * real origin, for clients (Node 20's fetch, so the OpenAI and Anthropic SDKs) that ignore HTTPS_PROXY.
   * The stored request is what the origin receives: its path and Host, as if it came through CONNECT.
   */
  private async dispatchBaseRoute(head: RequestHead, socket: net.Socket): Promise<Dispatch> {
    const rest = head.target.slice(BASE_ROUTE_PREFIX.length);
    const match = /^([^/]+)\/(https?)\/([^/?#]+)(\/[^#]*)?$/.exec(rest);
    if (!match) return refuse(400, `malformed base-URL route (expected ${BASE_ROUTE_PREFIX}CREDENTIALS/https/HOST/PATH)`);
    const [, credentials, schemeText, authority, pathAndQuery] = match;
    let lookup: SessionLookup = { kind: 'anonymous' };
    if (credentials !== '-') {
      const colon = credentials!.indexOf(':');
      lookup = colon < 0 ? { kind: 'rejected', reason: 'malformed session in base-URL route' } : this.deps.sessions.check(safeDecode(credentials!.slice(0, colon)), safeDecode(credentials!.slice(colon + 1)));
    }
    lookup = this.authorize(lookup);
    if (lookup.kind === 'rejected') return { kind: 'local', respond: () => proxyAuthRequired(lookup.reason) };
    const scheme = schemeText as 'http' | 'https';
    const parsed = parseAuthority(authority!, defaultPort(scheme));
    if (!parsed) return refuse(400, `malformed host '${authority}' in base-URL route`);
    const origin: Origin = { scheme, ...parsed };
    if (this.deps.isSelf(origin.host, origin.port)) return refuse(403, 'refusing to route a request to the proxy itself');
    const target = pathAndQuery ?? '/';
    return this.route(await this.targetFor(lookup), head, socket, {
      origin,
      route: 'base-url',
      target,
      requestLine: `${head.method} ${target} ${head.version}`,
      replace: new Map([['host', hostHeaderFor(origin)]]),
      clientTarget: head.target.replace(/^(\/__mitm-replay\/b\/)[^/]+/, '$1…'),
    });
  }

  private async dispatchConnect(head: RequestHead): Promise<Dispatch> {
    const lookup = this.authorize(this.deps.sessions.checkProxyAuthorization(headerValue(head, 'proxy-authorization')));
    if (lookup.kind === 'rejected') return { kind: 'local', respond: () => proxyAuthRequired(lookup.reason) };
    const target = parseAuthority(head.target);
    if (!target) return refuse(400, `CONNECT target '${head.target.slice(0, 200)}' is not host:port`);
    if (this.deps.isSelf(target.host, target.port)) return refuse(403, `refusing to CONNECT to the proxy itself (${target.host}:${target.port})`);
    const session = await this.targetFor(lookup);
    if (this.intercepts(session, target.host)) {
      return { kind: 'handoff', take: (socket, leftover) => void this.intercept(socket, leftover, target, session) };
    }
    if (session.kind === 'replay') {
      const allowed = isIntercepted(session.player.options.allowLive, target.host);
      session.player.noteTunnel(target.host, target.port, allowed);
      if (!allowed) return refuse(403, `replay: egress to ${target.host}:${target.port} refused (not in the trace; allow it with --allow-live ${target.host})`);
      return { kind: 'handoff', take: (socket, leftover) => void this.tunnel(socket, leftover, target, null) };
    }
    return { kind: 'handoff', take: (socket, leftover) => void this.tunnel(socket, leftover, target, session.writer) };
  }

  private async intercept(socket: net.Socket, leftover: Buffer, target: { host: string; port: number }, session: SessionTarget): Promise<void> {
    const writer = session.kind === 'record' ? session.writer : null;
    const origin: Origin = { scheme: 'https', host: target.host, port: target.port };
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    if (leftover.length > 0) socket.unshift(leftover);
    const first = await firstByte(socket);
    if (first === null) {
      socket.destroy();
      return;
    }
    if (first !== 0x16) {
      // Not a TLS handshake: record the failure rather than guessing.
      if (writer) recordConnectionError(writer, origin, 'connect', { code: 'not-tls', message: `the client sent ${first === 0x47 || first === 0x50 ? 'plain HTTP' : 'bytes that are not a TLS ClientHello'} inside a CONNECT tunnel to ${target.host}:${target.port}`, phase: 'tls' });
      socket.destroy();
      return;
    }
    const tlsSocket = await this.terminateTls(socket, target.host, (code, message) => {
      if (writer) recordConnectionError(writer, origin, 'connect', { code, message, phase: 'tls' });
    });
    if (!tlsSocket) return;
    const connection = new HttpConnection(tlsSocket, {
      pool: this.deps.pool,
      log: this.deps.log,
      timeouts: this.deps.timeouts,
      dispatch: (head, client) => this.dispatchIntercepted(head, client, origin, session),
    });
    void connection.run();
  }

  private dispatchIntercepted(head: RequestHead, socket: net.Socket, origin: Origin, session: SessionTarget): Dispatch {
    let target = head.target;
    if (/^https?:\/\//i.test(target)) {
      try {
        const url = new URL(target);
        target = `${url.pathname}${url.search}`;
      } catch {
        return refuse(400, 'malformed request target');
      }
    }
    if (!target.startsWith('/') && !(head.method === 'OPTIONS' && target === '*')) return refuse(400, 'malformed request target');
    return this.route(
      session,
      head,
      socket,
      {
        origin,
        route: 'connect',
        target,
        requestLine: target === head.target ? undefined : `${head.method} ${target} ${head.version}`,
        clientTarget: target === head.target ? undefined : head.target,
      },
      true,
    );
  }

  /** A host outside the intercept policy: bytes pass untouched; the trace keeps host, port, sizes and timing. */
  private async tunnel(socket: net.Socket, leftover: Buffer, target: { host: string; port: number }, writer: TraceWriter | null): Promise<void> {
    const origin: Origin = { scheme: 'https', host: target.host, port: target.port };
    const startedAt = Date.now();
    const t0 = performance.now();
    let upstream: net.Socket;
    try {
      upstream = await this.deps.pool.dial(false, target.host, target.port);
    } catch (err) {
      const message = (err as Error).message;
      if (writer) recordTunnel(writer, origin, startedAt, { bytesUp: 0, bytesDown: 0, durationMs: performance.now() - t0 }, { code: (err as { code?: string }).code ?? 'EUPSTREAM', message, phase: 'connect' });
      socket.end(localResponseBytes({ status: 502, body: `mitm-replay: ${message}\n`, close: true }));
      return;
    }
    this.track(upstream);
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    let bytesUp = leftover.length;
    let bytesDown = 0;
    if (leftover.length > 0) upstream.write(leftover);
    socket.on('data', (d: Buffer) => (bytesUp += d.length));
    upstream.on('data', (d: Buffer) => (bytesDown += d.length));
    socket.pipe(upstream);
    upstream.pipe(socket);
    let recorded = false;
    const finish = () => {
      if (recorded) return;
      recorded = true;
      socket.destroy();
      upstream.destroy();
      if (writer) recordTunnel(writer, origin, startedAt, { bytesUp, bytesDown, durationMs: Math.round(performance.now() - t0) });
    };
    socket.once('close', finish);
    upstream.once('close', finish);
    socket.on('error', finish);
    upstream.on('error', finish);
  }
}


/** Waits for the first byte of a socket and puts it back; null if the socket closed first. */
function firstByte(socket: net.Socket): Promise<number | null> {
  return new Promise((resolve) => {
    const onReadable = () => {
      const chunk = socket.read() as Buffer | null;
      if (chunk === null) return;
      cleanup();
      socket.unshift(chunk);
      resolve(chunk[0]!);
    };
    const onClose = () => {
      cleanup();
      resolve(null);
    };
    const cleanup = () => {
      socket.removeListener('readable', onReadable);
      socket.removeListener('close', onClose);
      socket.removeListener('end', onClose);
    };
    socket.on('readable', onReadable);
    socket.once('close', onClose);
    socket.once('end', onClose);
    onReadable();
  });
}
