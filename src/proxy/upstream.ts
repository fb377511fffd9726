import net from 'node:net';
import tls from 'node:tls';
import { resolveConnectTo, type ConnectToRule } from './connect-to.js';
import type { Origin } from '../trace/schema.js';

export interface UpstreamOptions {
  connectTo: ConnectToRule[];
  /** extra CAs trusted for upstream TLS, on top of the default roots */
  extraCAs: string[];
  /** refuse to dial these host:port pairs (the daemon's own address) */
  isSelf: (host: string, port: number) => boolean;
  idleTimeoutMs?: number;
  connectTimeoutMs?: number;
}

export class UpstreamError extends Error {
  constructor(
    message: string,
    readonly code: string,
    readonly phase: 'connect' | 'tls' | 'response',
  ) {
    super(message);
  }
}

export interface UpstreamConnection {
  socket: net.Socket;
  key: string;
  reused: boolean;
}

export function originKey(origin: Origin): string {
  return `${origin.scheme}://${origin.host}:${origin.port}`;
}

/** Names under `.invalid` never resolve (RFC 6761); refuse them without dialing. */
function isReservedInvalid(host: string): boolean {
  return host === 'invalid' || host.endsWith('.invalid');
}

/**
 * Dials origins (honouring --connect-to) and keeps idle keep-alive connections for reuse, with TLS sessions
 * cached per origin so a new connection can resume instead of doing a full handshake.
 */
export class UpstreamPool {
  private readonly idle = new Map<string, net.Socket[]>();
  private readonly tlsSessions = new Map<string, Buffer>();
  /** built once: passing `ca` to every tls.connect would parse ~150 root certificates per dial */
  private readonly secureContext: tls.SecureContext | undefined;
  private readonly idleTimeoutMs: number;
  private readonly connectTimeoutMs: number;
  private closed = false;

  constructor(private readonly options: UpstreamOptions) {
    this.secureContext = options.extraCAs.length > 0 ? tls.createSecureContext({ ca: [...tls.rootCertificates, ...options.extraCAs] }) : undefined;
    this.idleTimeoutMs = options.idleTimeoutMs ?? 4_000;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 15_000;
  }

  async acquire(origin: Origin): Promise<UpstreamConnection> {
    const key = originKey(origin);
    const pool = this.idle.get(key);
    while (pool && pool.length > 0) {
      const socket = pool.pop()!;
      if (socket.destroyed || !socket.writable) continue;
      socket.setTimeout(0);
      socket.removeAllListeners('timeout');
      socket.removeAllListeners('close');
      return { socket, key, reused: true };
    }
    const socket = await this.dial(origin.scheme === 'https', origin.host, origin.port);
    return { socket, key, reused: false };
  }

  /** Returns a connection whose last response ended cleanly, for reuse by the next request to that origin. */
  release(connection: UpstreamConnection): void {
    const { socket, key } = connection;
    socket.removeAllListeners('data');
    socket.removeAllListeners('end');
    socket.removeAllListeners('error');
    if (this.closed || socket.destroyed) {
      socket.destroy();
      return;
    }
    socket.on('error', () => socket.destroy());
    socket.on('end', () => socket.destroy());
    const list = this.idle.get(key) ?? [];
    list.push(socket);
    this.idle.set(key, list);
    const forget = () => {
      const current = this.idle.get(key);
      const at = current?.indexOf(socket) ?? -1;
      if (current && at >= 0) current.splice(at, 1);
    };
    socket.setTimeout(this.idleTimeoutMs);
    socket.once('timeout', () => {
      forget();
      socket.destroy();
    });
    socket.once('close', forget);
  }

  /** Opens a raw connection (TLS or not) to an origin, for requests or for a tunnel. */
  dial(useTls: boolean, host: string, port: number): Promise<net.Socket> {
    if (isReservedInvalid(host)) {
      return Promise.reject(new UpstreamError(`${host} is a reserved .invalid name and cannot be reached`, 'ENOTFOUND', 'connect'));
    }
    const target = resolveConnectTo(this.options.connectTo, host, port);
    if (this.options.isSelf(target.host, target.port)) {
      return Promise.reject(new UpstreamError(`refusing to connect to the proxy's own address ${target.host}:${target.port} (a loop)`, 'ELOOP', 'connect'));
    }
    return new Promise((resolve, reject) => {
      let socket: net.Socket;
      const fail = (err: Error & { code?: string }) => {
        socket.destroy();
        const tlsProblem = useTls && (err.code?.startsWith('ERR_TLS') || /certificate|self.signed|SSL|TLS/i.test(err.message));
        reject(new UpstreamError(`${tlsProblem ? 'TLS' : 'connection'} to ${host}:${port} failed: ${err.message}`, err.code ?? 'EUPSTREAM', tlsProblem ? 'tls' : 'connect'));
      };
      if (useTls) {
        const key = `${host}:${port}`;
        const servername = net.isIP(host) ? undefined : host;
        socket = tls.connect({
          host: target.host,
          port: target.port,
          servername,
          secureContext: this.secureContext,
          ALPNProtocols: ['http/1.1'],
          session: this.tlsSessions.get(key),
          // Verify the certificate against the name the client asked for, not the --connect-to target.
          checkServerIdentity: (_name, cert) => tls.checkServerIdentity(host, cert),
        });
        socket.on('session', (session: Buffer) => this.tlsSessions.set(key, session));
        socket.once('secureConnect', () => {
          socket.removeListener('error', fail);
          socket.setTimeout(0);
          resolve(socket);
        });
      } else {
        socket = net.connect({ host: target.host, port: target.port });
        socket.once('connect', () => {
          socket.removeListener('error', fail);
          socket.setTimeout(0);
          resolve(socket);
        });
      }
      socket.setNoDelay(true);
      socket.once('error', fail);
      socket.setTimeout(this.connectTimeoutMs, () => fail(Object.assign(new Error(`timed out after ${this.connectTimeoutMs} ms`), { code: 'ETIMEDOUT' })));
    });
  }

  close(): void {
    this.closed = true;
    for (const list of this.idle.values()) for (const socket of list) socket.destroy();
    this.idle.clear();
  }
}
