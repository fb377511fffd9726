import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { TraceWriter } from '../capture/recorder.js';

/**
 * A session ties proxy credentials (`TRACE:TOKEN`) to the trace its traffic is recorded into.
 * Several sessions (agents) can record through one daemon at once, each into its own trace.
 */
export interface Session {
  trace: string;
  token: string;
  writer: TraceWriter;
  createdAt: number;
  /** process that owns the session (a `record` command); the session ends if that process dies */
  ownerPid?: number;
  /** a `record` session keeps an in-process daemon alive until it ends */
  keepsDaemonAlive: boolean;
}

export type SessionLookup =
  | { kind: 'anonymous' }
  | { kind: 'session'; session: Session }
  | { kind: 'rejected'; reason: string };

function sameSecret(a: string, b: string): boolean {
  const left = Buffer.from(a);
  const right = Buffer.from(b);
  return left.length === right.length && timingSafeEqual(left, right);
}

export class SessionRegistry {
  private readonly sessions = new Map<string, Session>();

  static newToken(): string {
    return randomBytes(18).toString('base64url');
  }

  add(session: Session): void {
    this.sessions.set(session.trace, session);
  }

  get(trace: string): Session | undefined {
    return this.sessions.get(trace);
  }

  remove(trace: string): Session | undefined {
    const session = this.sessions.get(trace);
    this.sessions.delete(trace);
    return session;
  }

  all(): Session[] {
    return [...this.sessions.values()];
  }

  /** Checks `trace:token` credentials; never says which part was wrong beyond what the user can fix. */
  check(trace: string, token: string): SessionLookup {
    const session = this.sessions.get(trace);
    if (!session) return { kind: 'rejected', reason: `no live session named '${trace}' (start one with 'mitm-replay env --trace ${trace}' or 'mitm-replay record')` };
    if (!sameSecret(session.token, token)) return { kind: 'rejected', reason: `wrong token for session '${trace}' (use the proxy URL printed by 'mitm-replay env')` };
    return { kind: 'session', session };
  }

  /** Parses a `Proxy-Authorization` header value (Basic only). */
  checkProxyAuthorization(value: string | undefined): SessionLookup {
    if (value === undefined) return { kind: 'anonymous' };
    const match = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(value);
    if (!match) return { kind: 'rejected', reason: 'unsupported Proxy-Authorization (use http://TRACE:TOKEN@host:port as the proxy URL)' };
    const decoded = Buffer.from(match[1]!, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 0) return { kind: 'rejected', reason: 'malformed proxy credentials (expected TRACE:TOKEN)' };
    return this.check(decodeURIComponent(decoded.slice(0, colon)), decodeURIComponent(decoded.slice(colon + 1)));
  }
}
