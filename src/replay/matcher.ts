import { createHash } from 'node:crypto';
import type { Origin, StoredExchange } from '../trace/schema.js';

/** `POST https://api.openai.com:443/v1/chat/completions`: method + origin + path without query. */
export function endpointOf(method: string, origin: Origin, target: string): string {
  const path = target.split('?', 1)[0]!;
  return `${method.toUpperCase()} ${origin.scheme}://${origin.host}:${origin.port}${path}`;
}

/** SHA-256 of a request's canonical (redacted, stored-form) bytes: head and body, length-delimited. */
export function requestHash(head: Buffer, body: Buffer): string {
  const length = Buffer.alloc(8);
  length.writeBigUInt64BE(BigInt(head.length));
  return createHash('sha256').update(length).update(head).update(body).digest('hex');
}

export interface Recording {
  seq: number;
  endpoint: string;
  /** how many recordings of the same endpoint came before this one */
  position: number;
  hash: string;
  exchange: StoredExchange;
  /** index of the replayed request that consumed it */
  usedBy: number | null;
}

export type Match =
  | { kind: 'exact'; recording: Recording; reordered: boolean }
  /** no exact match, but an unconsumed recording of the endpoint exists: this is its counterpart */
  | { kind: 'diverged'; counterpart: Recording }
  | { kind: 'missing' };

/**
 * Matches replayed requests to recordings: by endpoint and position first, then (for requests that
 * arrive in another order, as parallel calls do) by hash among the endpoint's unconsumed recordings.
 * Never calls a recording with another hash exact.
 */
export class Matcher {
  private readonly byEndpoint = new Map<string, Recording[]>();
  private readonly asked = new Map<string, number>();
  readonly recordings: Recording[];

  constructor(exchanges: StoredExchange[]) {
    this.recordings = [];
    for (const exchange of exchanges) {
      const { record } = exchange;
      if (record.kind !== 'http' || !record.request) continue;
      const endpoint = endpointOf(record.request.method, record.origin, record.request.target);
      const list = this.byEndpoint.get(endpoint) ?? [];
      const recording: Recording = {
        seq: record.seq,
        endpoint,
        position: list.length,
        hash: record.request.hash ?? requestHash(exchange.requestHead, exchange.requestBody),
        exchange,
        usedBy: null,
      };
      list.push(recording);
      this.byEndpoint.set(endpoint, list);
      this.recordings.push(recording);
    }
  }

  /** The position this request has among replayed requests to its endpoint (counts every call). */
  nextPosition(endpoint: string): number {
    const position = this.asked.get(endpoint) ?? 0;
    this.asked.set(endpoint, position + 1);
    return position;
  }

  /** The recording expected at this position, when its stored bytes equal the request's (no hashing needed). */
  samePosition(endpoint: string, position: number, head: Buffer, body: Buffer): Recording | null {
    const r = this.byEndpoint.get(endpoint)?.[position];
    return r && r.usedBy === null && r.exchange.requestHead.equals(head) && r.exchange.requestBody.equals(body) ? r : null;
  }

  match(endpoint: string, position: number, hash: string): Match {
    const list = this.byEndpoint.get(endpoint) ?? [];
    const atPosition = list[position];
    if (atPosition && atPosition.usedBy === null && atPosition.hash === hash) return { kind: 'exact', recording: atPosition, reordered: false };
    const elsewhere = list.find((r) => r.usedBy === null && r.hash === hash);
    if (elsewhere) return { kind: 'exact', recording: elsewhere, reordered: true };
    const counterpart = atPosition && atPosition.usedBy === null ? atPosition : list.find((r) => r.usedBy === null);
    return counterpart ? { kind: 'diverged', counterpart } : { kind: 'missing' };
  }

  consume(recording: Recording, requestIndex: number): void {
    recording.usedBy = requestIndex;
  }

  get unused(): Recording[] {
    return this.recordings.filter((r) => r.usedBy === null);
  }
}
