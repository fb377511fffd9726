import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { DaemonState, SessionEnd, SessionInfo, SessionRequest } from './daemon.js';

export class DaemonClientError extends Error {
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message);
  }
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as { code?: string }).code === 'EPERM';
  }
}

/** Talks to a running daemon's control API, found through the home's state file. */
export class DaemonClient {
  constructor(readonly state: DaemonState) {}

  get url(): string {
    return `http://${this.state.host.includes(':') ? `[${this.state.host}]` : this.state.host}:${this.state.port}`;
  }

  /** The daemon for this home, if one is running and answers; null otherwise (a stale state file is ignored). */
  static async find(stateFile: string): Promise<DaemonClient | null> {
    let state: DaemonState;
    try {
      state = JSON.parse(readFileSync(stateFile, 'utf8')) as DaemonState;
    } catch {
      return null;
    }
    if (!processAlive(state.pid)) return null;
    const client = new DaemonClient(state);
    try {
      await client.request('GET', '/health', undefined, 2000);
      return client;
    } catch {
      return null;
    }
  }

  request<T>(method: string, path: string, body?: unknown, timeoutMs = 30_000): Promise<T> {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: this.state.host,
          port: this.state.port,
          method,
          path: `/__mitm-replay/api${path}`,
          headers: { authorization: `Bearer ${this.state.token}`, 'content-type': 'application/json', ...(payload ? { 'content-length': payload.length } : {}) },
          timeout: timeoutMs,
          agent: false,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            let parsed: unknown;
            try {
              parsed = JSON.parse(Buffer.concat(chunks).toString('utf8'));
            } catch {
              reject(new DaemonClientError(`the daemon at ${this.url} answered ${res.statusCode} with something that is not JSON`, res.statusCode ?? 500));
              return;
            }
            if ((res.statusCode ?? 500) >= 400) reject(new DaemonClientError((parsed as { error?: string }).error ?? `HTTP ${res.statusCode}`, res.statusCode ?? 500));
            else resolve(parsed as T);
          });
        },
      );
      req.on('timeout', () => req.destroy(new Error(`the daemon at ${this.url} did not answer within ${timeoutMs} ms`)));
      req.on('error', (err) => reject(new DaemonClientError(`cannot reach the daemon at ${this.url}: ${err.message}`, 503)));
      req.end(payload);
    });
  }

  createSession(request: SessionRequest): Promise<SessionInfo> {
    return this.request('POST', '/sessions', request);
  }

  endSession(trace: string, result: { exitCode?: number; signal?: string }): Promise<SessionEnd> {
    return this.request('POST', `/sessions/${encodeURIComponent(trace)}/end`, result);
  }
}
