import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { TraceWriter } from '../capture/recorder.js';
import type { ReplayPlayer } from '../replay/player.js';

/** Where a session's traffic goes: recorded into a trace, or answered from one. */
export type SessionTarget = { kind: 'record'; writer: TraceWriter } | { kind: 'replay'; player: ReplayPlayer };

/**
 * A session ties proxy credentials (`ID:TOKEN`) to what its traffic does: record into a trace (the id is the
 * trace name) or replay one (the id is the run ID). Several agents can use one daemon at once.
 */
export interface Session {
  id: string;
  token: string;
  target: SessionTarget;
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
    this.sessions.set(session.id, session);
  }

  get(id: string): Session | undefined {
    return this.sessions.get(id);
  }

  remove(id: string): Session | undefined {
    const session = this.sessions.get(id);
    this.sessions.delete(id);
    return session;
  }

  all(): Session[] {
    return [...this.sessions.values()];
  }

  /** Checks `trace:token` credentials; never says which part was wrong beyond what the user can fix. */
  check(id: string, token: string): SessionLookup {
    const session = this.sessions.get(id);
    if (!session) return { kind: 'rejected', reason: `no live session named '${id}' (start one with 'mitm-replay env', 'mitm-replay record' or 'mitm-replay replay')` };
    if (!sameSecret(session.token, token)) return { kind: 'rejected', reason: `wrong token for session '${id}' (use the proxy URL printed by 'mitm-replay env')` };
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
    return this.check(safeDecode(decoded.slice(0, colon)), safeDecode(decoded.slice(colon + 1)));
  }
}

export function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}
