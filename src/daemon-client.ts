import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { DaemonState, SessionEnd, SessionInfo, SessionRequest, SessionResult } from './daemon.js';
import type { TraceMeta, WorkspaceMeta } from './trace/schema.js';

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

  async request<T>(method: string, path: string, body?: unknown, timeoutMs = 30_000): Promise<T> {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const raw = await this.requestRaw(method, path, payload, timeoutMs);
    try {
      return JSON.parse(raw.toString('utf8')) as T;
    } catch {
      throw new DaemonClientError(`the daemon at ${this.url} answered with something that is not JSON`, 502);
    }
  }

  /** One control request; resolves with the response body, rejects with the daemon's error message. */
  requestRaw(method: string, path: string, payload?: Buffer, timeoutMs = 30_000): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: this.state.host,
          port: this.state.port,
          method,
          path: `/__mitm-replay/api${path}`,
          headers: { authorization: `Bearer ${this.state.token}`, 'content-type': 'application/octet-stream', ...(payload ? { 'content-length': payload.length } : {}) },
          timeout: timeoutMs,
          agent: false,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const body = Buffer.concat(chunks);
            const status = res.statusCode ?? 500;
            if (status < 400) {
              resolve(body);
              return;
            }
            let message = `HTTP ${status}`;
            try {
              message = (JSON.parse(body.toString('utf8')) as { error?: string }).error ?? message;
            } catch {
              // keep the status
            }
            reject(new DaemonClientError(message, status));
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

  endSession(id: string, result: SessionResult): Promise<SessionEnd> {
    return this.request('POST', `/sessions/${encodeURIComponent(id)}/end`, result);
  }

  setWorkspace(id: string, workspace: WorkspaceMeta): Promise<unknown> {
    return this.request('POST', `/sessions/${encodeURIComponent(id)}/workspace`, workspace);
  }

  async getTrace(name: string): Promise<TraceMeta | undefined> {
    try {
      return await this.request<TraceMeta>('GET', `/traces/${encodeURIComponent(name)}`);
    } catch (err) {
      if (err instanceof DaemonClientError && err.status === 404) return undefined;
      throw err;
    }
  }

  async putBlob(content: Buffer): Promise<string> {
    const { hash } = JSON.parse((await this.requestRaw('PUT', '/blobs', content, 120_000)).toString('utf8')) as { hash: string };
    return hash;
  }

  async getBlob(hash: string): Promise<Buffer | undefined> {
    try {
      return await this.requestRaw('GET', `/blobs/${hash}`, undefined, 120_000);
    } catch (err) {
      if (err instanceof DaemonClientError && err.status === 404) return undefined;
      throw err;
    }
  }
}
