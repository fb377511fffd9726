/**
 * Test helpers around a real, in-process recording daemon: a temp home, a catch-all --connect-to to the local
 * test upstream (so nothing is ever dialed but loopback), and clients that go through it the way agents do.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { Writable } from 'node:stream';
import { Daemon, type DaemonOptions } from '../../src/daemon.js';
import { createLogger } from '../../src/log.js';
import { parseConnectTo } from '../../src/proxy/connect-to.js';
import { DEFAULT_INTERCEPT } from '../../src/proxy/intercept.js';
import type { StoredExchange } from '../../src/trace/schema.js';
import { createTestCa, type TestCa } from './test-ca.js';
import { startTestUpstream, type TestUpstream } from './upstream.js';

export interface Harness {
  home: string;
  daemon: Daemon;
  upstream: TestUpstream;
  upstreamCa: TestCa;
  /** PEM of the daemon's CA, for clients */
  caPem: string;
  logs: string[];
  exchanges(trace?: string): Promise<StoredExchange[]>;
  close(): Promise<void>;
}

export function tempHome(prefix = 'mitm-replay-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** A pino destination that keeps every log line, so tests can scan logs for secrets. */
export function captureLogs(lines: string[]): Writable {
  return new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      done();
    },
  });
}

export async function startHarness(options: Partial<DaemonOptions> & { upstreamPlain?: boolean; interceptExtra?: string[]; upstreamNames?: string[] } = {}): Promise<Harness> {
  const upstreamCa = await createTestCa(options.upstreamNames);
  const upstream = await startTestUpstream({ tls: options.upstreamPlain ? null : { certPem: upstreamCa.certPem, keyPem: upstreamCa.keyPem } });
  const home = options.home ?? tempHome();
  const logs: string[] = [];
  const daemon = await Daemon.start({
    home,
    port: 0,
    intercept: [...DEFAULT_INTERCEPT, 'tools.example.test', ...(options.interceptExtra ?? [])],
    connectTo: [parseConnectTo(`::127.0.0.1:${upstream.port}`)],
    upstreamCAs: [upstreamCa.caCertPem],
    logger: createLogger({ level: 'debug', destination: captureLogs(logs) }),
    ...options,
  });
  const caPem = readFileSync(join(home, 'certs', 'ca.pem'), 'utf8');
  return {
    home,
    daemon,
    upstream,
    upstreamCa,
    caPem,
    logs,
    async exchanges(trace = daemon.anonymousTraceName) {
      await (await daemon.anonymousWriter()).flush(false);
      for (const session of daemon.sessions.all()) await session.writer.flush(false);
      const out: StoredExchange[] = [];
      for await (const ex of daemon.store.exchanges(trace)) out.push(ex);
      return out;
    },
    async close() {
      await daemon.stop();
      await upstream.close();
      await upstreamCa.cleanup();
      if (!options.home) rmSync(home, { recursive: true, force: true });
    },
  };
}

/** Opens a CONNECT tunnel through the proxy and returns the raw socket (after the 200). */
export function connectTunnel(proxyPort: number, target: string, proxyAuthorization?: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1',
      port: proxyPort,
      method: 'CONNECT',
      path: target,
      headers: { host: target, ...(proxyAuthorization ? { 'proxy-authorization': proxyAuthorization } : {}) },
      agent: false,
    });
    req.once('connect', (res, socket, head) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        reject(Object.assign(new Error(`CONNECT answered ${res.statusCode}`), { statusCode: res.statusCode }));
        return;
      }
      if (head.length > 0) socket.unshift(head);
      resolve(socket);
    });
    req.once('error', reject);
    req.end();
  });
}

/** An https.Agent that reaches every origin through a CONNECT tunnel, with keep-alive: Node's https over a proxy. */
export class TunnelAgent extends https.Agent {
  constructor(
    private readonly proxyPort: number,
    private readonly proxyAuthorization?: string,
    options: https.AgentOptions = {},
  ) {
    super({ keepAlive: true, maxSockets: 1, ...options });
  }

  override createConnection(options: tls.ConnectionOptions & { host?: string; port?: number }, callback: (err: Error | null, socket?: net.Socket) => void): undefined {
    const target = `${options.host}:${options.port}`;
    connectTunnel(this.proxyPort, target, this.proxyAuthorization).then(
      (socket) => {
        const secure = tls.connect({ ...options, socket, servername: options.servername ?? (net.isIP(options.host ?? '') ? undefined : options.host) });
        callback(null, secure);
      },
      (err: Error) => callback(err),
    );
    return undefined;
  }
}

export interface ClientResponse {
  status: number;
  rawHeaders: string[];
  body: Buffer;
  /** time (performance.now) each data chunk arrived */
  chunkTimes: number[];
}

export function request(
  url: string,
  options: { agent: http.Agent; method?: string; headers?: Record<string, string>; body?: Buffer | string; ca?: string },
): Promise<ClientResponse> {
  return new Promise((resolve, reject) => {
    const client = url.startsWith('https:') ? https : http;
    const req = client.request(url, { method: options.method ?? 'GET', headers: options.headers, agent: options.agent, ca: options.ca }, (res) => {
      const chunks: Buffer[] = [];
      const chunkTimes: number[] = [];
      res.on('data', (c: Buffer) => {
        chunks.push(c);
        chunkTimes.push(performance.now());
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, rawHeaders: res.rawHeaders, body: Buffer.concat(chunks), chunkTimes }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(options.body);
  });
}

export function basicAuth(trace: string, token: string): string {
  return `Basic ${Buffer.from(`${trace}:${token}`).toString('base64')}`;
}

/** The entity body inside stored wire bytes: de-chunks when the stored head says chunked. */
export function entityBody(head: Buffer, body: Buffer): Buffer {
  if (!/\r\ntransfer-encoding:[^\r]*chunked/i.test(head.toString('latin1'))) return body;
  const parts: Buffer[] = [];
  let pos = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', pos);
    const size = parseInt(body.toString('latin1', pos, eol).split(';')[0]!, 16);
    pos = eol + 2;
    if (size === 0) break;
    parts.push(body.subarray(pos, pos + size));
    pos += size + 2;
  }
  return Buffer.concat(parts);
}
