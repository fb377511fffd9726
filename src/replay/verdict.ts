import type { ReplayPlayer, RequestOutcome, TunnelOutcome } from './player.js';

/** The JSON report's schema id; documented in docs/replay-report.md. Bump on incompatible changes. */
export const REPORT_SCHEMA = 'mitm-replay/replay-report@1';

export interface Verdict {
  recorded: number;
  requests: number;
  reused: number;
  exact: number;
  reordered: number;
  diverged: number;
  missing: number;
  unused: number;
  /** `blocked`, or `live:N` when --allow-live let N tunnels through */
  egress: string;
  refusedTunnels: number;
  /** the trace's tier; a structural replay matched shapes, not content */
  tier: 'full' | 'structural';
  ending: 'PASS' | 'FAIL' | 'DIAGNOSTIC';
}

export interface UnusedRecording {
  seq: number;
  endpoint: string;
  position: number;
  requestHash: string;
}

export interface FileDifference {
  path: string;
  /** what the recorded run did to the file: added, removed, modified, or unchanged */
  recorded: string;
  replayed: string;
  /** recorded result vs replayed result, for text files */
  unifiedDiff?: string;
}

/** How the replayed run ended, compared with the recorded one. Does not change `replay`'s exit code. */
export interface ReplayOutcome {
  childExit: number | null;
  recordedExit: number | null;
  /** `same`, `different:N`, or `none` when the trace has no workspace snapshot to compare with */
  files: string;
  workspace: 'sandbox' | 'in-place' | 'none';
  /** the sandbox directory, when kept (--keep) */
  sandbox?: string;
  differences: FileDifference[];
}

/** Which `compare` run and arm a report belongs to (absent for plain replays). */
export interface CompareTag {
  /** shared by every run of one `compare` invocation */
  id: string;
  arm: 'control' | 'patched';
}

export interface ReplayReport {
  schema: typeof REPORT_SCHEMA;
  runId: string;
  trace: string;
  mode: 'strict' | 'diagnostic';
  pace: 'fast' | 'recorded';
  startedAt: number;
  finishedAt: number;
  verdict: Verdict;
  /** the one-line verdict, as printed */
  line: string;
  child: { exitCode: number | null; signal: string | null; recordedExitCode: number | null };
  outcome: ReplayOutcome | null;
  requests: RequestOutcome[];
  unused: UnusedRecording[];
  tunnels: TunnelOutcome[];
  /** set by `compare`: the trace viewer groups its runs into the control/patched table */
  compare?: CompareTag;
}

export function computeVerdict(player: ReplayPlayer): Verdict {
  const outcomes = player.outcomes;
  const recorded = player.matcher.recordings.length;
  const reused = player.matcher.recordings.filter((r) => r.usedBy !== null).length;
  const exact = outcomes.filter((o) => o.outcome === 'exact').length;
  const live = player.tunnels.filter((t) => t.allowed).length;
  const verdict: Verdict = {
    recorded,
    requests: outcomes.length,
    reused,
    exact,
    reordered: outcomes.filter((o) => o.reordered).length,
    diverged: outcomes.filter((o) => o.outcome === 'diverged').length,
    missing: outcomes.filter((o) => o.outcome === 'missing').length,
    unused: recorded - reused,
    egress: live > 0 ? `live:${live}` : 'blocked',
    refusedTunnels: player.tunnels.filter((t) => !t.allowed).length,
    tier: player.meta.tier ?? 'full',
    ending: 'FAIL',
  };
  if (player.options.diagnostic) verdict.ending = 'DIAGNOSTIC';
  else if (exact === recorded && exact === verdict.requests) verdict.ending = 'PASS';
  return verdict;
}

/** `verdict: recorded=6 requests=6 ... egress=blocked -> PASS`: one key=value list, so later parts fit. */
export function verdictLine(v: Verdict, outcome: ReplayOutcome | null = null): string {
  const parts = [
    `recorded=${v.recorded}`,
    `requests=${v.requests}`,
    `reused=${v.reused}`,
    `exact=${v.exact}`,
    `reordered=${v.reordered}`,
    `diverged=${v.diverged}`,
    `missing=${v.missing}`,
    `unused=${v.unused}`,
    `egress=${v.egress}`,
  ];
  if (v.refusedTunnels > 0) parts.push(`refused-tunnels=${v.refusedTunnels}`);
  if (v.tier === 'structural') parts.push('tier=structural');
  if (outcome) {
    parts.push(`child-exit=${outcome.childExit ?? '-'}`, `recorded-exit=${outcome.recordedExit ?? '-'}`);
    if (outcome.files !== 'none') parts.push(`files=${outcome.files}`);
  }
  return `verdict: ${parts.join(' ')} -> ${v.ending}`;
}

export function buildReport(player: ReplayPlayer, child: { exitCode?: number; signal?: string; outcome?: ReplayOutcome; compare?: CompareTag }): ReplayReport {
  const verdict = computeVerdict(player);
  const outcome = child.outcome ?? null;
  return {
    schema: REPORT_SCHEMA,
    runId: player.runId,
    trace: player.trace,
    mode: player.options.diagnostic ? 'diagnostic' : 'strict',
    pace: player.options.pace,
    startedAt: player.startedAt,
    finishedAt: Date.now(),
    verdict,
    line: verdictLine(verdict, outcome),
    child: { exitCode: child.exitCode ?? null, signal: child.signal ?? null, recordedExitCode: player.meta.exitCode ?? null },
    outcome,
    requests: player.outcomes,
    unused: player.matcher.unused.map((r) => ({ seq: r.seq, endpoint: r.endpoint, position: r.position, requestHash: r.hash })),
    tunnels: player.tunnels,
    ...(child.compare ? { compare: child.compare } : {}),
  };
}

/** `replay`'s exit code: 0 on PASS; 1 on FAIL, or DIAGNOSTIC with anything diverged, missing or unused. */
export function replayExitCode(v: Verdict): number {
  if (v.ending === 'PASS') return 0;
  if (v.ending === 'DIAGNOSTIC' && v.diverged === 0 && v.missing === 0 && v.unused === 0) return 0;
  return 1;
}

/** A terminal summary: the verdict, each divergence in one line, each unused recording. */
export function formatReport(report: ReplayReport): string {
  const lines = [`run ${report.runId} of trace ${report.trace} (${report.mode}, pace ${report.pace})`, report.line];
  const { exitCode, recordedExitCode } = report.child;
  if (exitCode !== null || recordedExitCode !== null) lines.push(`child exit ${exitCode ?? '-'} (recorded ${recordedExitCode ?? '-'})`);
  for (const r of report.requests) {
    if (r.outcome === 'exact' && !r.reordered) continue;
    if (r.outcome === 'exact') lines.push(`  #${r.index} ${r.endpoint} [${r.position}]: exact, reordered (recorded position ${r.recordedPosition}, #${r.recordedSeq})`);
    else if (r.outcome === 'missing') lines.push(`  #${r.index} ${r.endpoint} [${r.position}]: missing (no unused recording left for this endpoint)`);
    else lines.push(`  #${r.index} ${r.endpoint} [${r.position}]: diverged ${r.divergenceId} from recorded #${r.recordedSeq}${r.served ? ' (served in diagnostic mode)' : ''}: ${r.divergence?.summary ?? ''}`);
  }
  for (const u of report.unused) lines.push(`  unused: recorded #${u.seq} ${u.endpoint} [${u.position}]`);
  for (const t of report.tunnels) lines.push(`  tunnel ${t.host}:${t.port} ${t.allowed ? 'let through live (--allow-live)' : 'refused'}`);
  for (const d of report.outcome?.differences ?? []) {
    lines.push(`  file ${d.path}: recorded ${d.recorded}, replayed ${d.replayed}`);
    if (d.unifiedDiff) lines.push(...d.unifiedDiff.trimEnd().split('\n').map((l) => `    ${l}`));
  }
  if (report.outcome?.sandbox) lines.push(`  sandbox kept at ${report.outcome.sandbox}`);
  return lines.join('\n');
}
