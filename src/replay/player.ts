import { randomBytes } from 'node:crypto';
import { Redactor } from '../capture/redact.js';
import type { Origin, Route, StoredExchange, TraceMeta } from '../trace/schema.js';
import type { TraceStore } from '../trace/store.js';
import { bodyText, decodedBody, type BodyText } from '../trace/inspect.js';
import { explainDivergence, type Divergence } from './divergence.js';
import { Matcher, endpointOf, requestHash, type Recording } from './matcher.js';
import { DEFAULT_STRUCTURAL, type StructuralOptions } from '../trace/structural.js';
import { buildReport, type CompareTag, type ReplayOutcome, type ReplayReport } from './verdict.js';

export interface ReplayOptions {
  diagnostic: boolean;
  pace: 'fast' | 'recorded';
  /** tunnelled (not intercepted) hosts that may go live; everything else is refused */
  allowLive: string[];
  /** the replayed agent's working directory, for labelling absolute-path divergences */
  cwd?: string;
}

export class ReplayError extends Error {
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message);
  }
}

export interface RequestOutcome {
  index: number;
  endpoint: string;
  position: number;
  route: Route;
  requestHash: string;
  outcome: 'exact' | 'diverged' | 'missing';
  reordered: boolean;
  /** the recording served, or compared against */
  recordedSeq: number | null;
  recordedPosition: number | null;
  recordedHash: string | null;
  served: boolean;
  divergenceId: string | null;
  divergence: Divergence | null;
  /** diverged and missing requests: what the agent sent (redacted stored form, body decoded), for side-by-side views */
  replayedRequest?: ReplayedRequest;
}

/** A replayed request as the report keeps it: redacted head, decoded body (at most MAX_REPORTED_BODY bytes). */
export interface ReplayedRequest {
  head: string;
  body: BodyText;
}

/** Per diverged or missing request; a report is JSON in the store, so whole 10 MB conversations stay out of it. */
export const MAX_REPORTED_BODY = 256 * 1024;

function replayedRequestOf(head: Buffer, body: Buffer): ReplayedRequest {
  return { head: head.toString('latin1'), body: bodyText(decodedBody(head, body), MAX_REPORTED_BODY) };
}

export interface TunnelOutcome {
  host: string;
  port: number;
  allowed: boolean;
}

export type ReplayDecision =
  | { kind: 'serve'; exchange: StoredExchange; outcome: RequestOutcome; divergenceId: string | null }
  | { kind: 'refuse'; outcome: RequestOutcome; reason: string };

export function newRunId(now = new Date()): string {
  const iso = now.toISOString();
  return `r-${iso.slice(0, 10).replaceAll('-', '')}-${iso.slice(11, 19).replaceAll(':', '')}-${randomBytes(2).toString('hex')}`;
}

/**
 * One replay run of a trace: matches each request to a recording and decides what to serve, keeping the
 * numbers for the verdict. Uses the redaction rules and intercept policy stored in the trace, so a trace
 * gives the same verdict on any machine.
 */
export class ReplayPlayer {
  readonly redactor: Redactor;
  readonly matcher: Matcher;
  readonly outcomes: RequestOutcome[] = [];
  readonly tunnels: TunnelOutcome[] = [];
  readonly startedAt = Date.now();
  private nextDivergence = 1;

  private constructor(
    readonly runId: string,
    readonly meta: TraceMeta,
    exchanges: StoredExchange[],
    readonly options: ReplayOptions,
  ) {
    this.redactor = new Redactor(meta.redaction);
    this.matcher = new Matcher(exchanges);
  }

  static async load(store: TraceStore, trace: string, options: ReplayOptions, runId = newRunId()): Promise<ReplayPlayer> {
    const meta = await store.getTrace(trace);
    if (!meta) throw new ReplayError(`no trace named '${trace}' (see the traces with 'mitm-replay ls', or record one with 'mitm-replay record')`, 404);
    const exchanges: StoredExchange[] = [];
    for await (const exchange of store.exchanges(trace)) exchanges.push(exchange);
    return new ReplayPlayer(runId, meta, exchanges, options);
  }

  get trace(): string {
    return this.meta.name;
  }

  get intercept(): string[] {
    return this.meta.intercept;
  }

  /** For a structural trace: how to reduce a replayed request to its shape before matching. */
  get structural(): StructuralOptions | null {
    return this.meta.tier === 'structural' ? (this.meta.structural ?? DEFAULT_STRUCTURAL) : null;
  }

  /** Decides what a replayed request gets. `head`/`body` are its canonical, redacted stored form. */
  decide(request: { origin: Origin; route: Route; method: string; target: string; head: Buffer; body: Buffer }): ReplayDecision {
    const endpoint = endpointOf(request.method, request.origin, request.target);
    const position = this.matcher.nextPosition(endpoint);
    // The common case, the same request at the same position, is a byte comparison; hash only otherwise.
    const same = this.matcher.samePosition(endpoint, position, request.head, request.body);
    const hash = same ? same.hash : requestHash(request.head, request.body);
    const index = this.outcomes.length;
    const match: ReturnType<Matcher['match']> = same ? { kind: 'exact', recording: same, reordered: false } : this.matcher.match(endpoint, position, hash);
    const outcome: RequestOutcome = {
      index,
      endpoint,
      position,
      route: request.route,
      requestHash: hash,
      outcome: match.kind,
      reordered: match.kind === 'exact' && match.reordered,
      recordedSeq: null,
      recordedPosition: null,
      recordedHash: null,
      served: false,
      divergenceId: null,
      divergence: null,
    };
    this.outcomes.push(outcome);
    const describe = (r: Recording) => {
      outcome.recordedSeq = r.seq;
      outcome.recordedPosition = r.position;
      outcome.recordedHash = r.hash;
    };
    if (match.kind === 'exact') {
      describe(match.recording);
      this.matcher.consume(match.recording, index);
      outcome.served = true;
      return { kind: 'serve', exchange: match.recording.exchange, outcome, divergenceId: null };
    }
    const ordinal = `request ${position + 1} to ${endpoint}`;
    outcome.replayedRequest = replayedRequestOf(request.head, request.body);
    if (match.kind === 'missing') {
      return { kind: 'refuse', outcome, reason: `mitm-replay: trace '${this.trace}' has no unused recording for ${ordinal} (the agent asked more than was recorded)` };
    }
    const counterpart = match.counterpart;
    describe(counterpart);
    outcome.divergenceId = `d${this.nextDivergence++}`;
    outcome.divergence = explainDivergence(
      { head: counterpart.exchange.requestHead, body: counterpart.exchange.requestBody },
      { head: request.head, body: request.body },
      { recordedCwd: this.meta.cwd, replayedCwd: this.options.cwd ?? process.cwd() },
    );
    if (this.options.diagnostic) {
      this.matcher.consume(counterpart, index);
      outcome.served = true;
      return { kind: 'serve', exchange: counterpart.exchange, outcome, divergenceId: outcome.divergenceId };
    }
    return {
      kind: 'refuse',
      outcome,
      reason: `mitm-replay: ${ordinal} diverged from trace '${this.trace}' (recorded #${counterpart.seq}, divergence ${outcome.divergenceId}): ${outcome.divergence.summary}`,
    };
  }

  noteTunnel(host: string, port: number, allowed: boolean): void {
    this.tunnels.push({ host, port, allowed });
  }

  report(child: { exitCode?: number; signal?: string; outcome?: ReplayOutcome; compare?: CompareTag } = {}): ReplayReport {
    return buildReport(this, child);
  }
}
