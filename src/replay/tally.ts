import { UsageError, flag, type ParsedArgs } from '../cli/args.js';
import type { ReplayReport } from './verdict.js';

/** `--repeat N`: 1 to 1000 (default 1). */
export function repeatCount(command: string, args: ParsedArgs): number {
  const text = flag(args, 'repeat') ?? '1';
  const n = Number(text);
  if (!/^\d+$/.test(text) || n < 1 || n > 1000) throw new UsageError(`${command}: --repeat must be a whole number from 1 to 1000, not '${text}'`);
  return n;
}

/** `child-exit=1 files=same`: how one run ended, as a key for counting. */
export function outcomeKey(report: ReplayReport): string {
  const exit = report.outcome?.childExit ?? report.child.exitCode;
  const files = report.outcome?.files ?? 'none';
  return files === 'none' ? `child-exit=${exit ?? '-'}` : `child-exit=${exit ?? '-'} files=${files}`;
}

/** True when a run ended as the recording did: same exit code, and the same files where there is a snapshot. */
export function reproducesRecording(report: ReplayReport): boolean {
  const exit = report.outcome?.childExit ?? report.child.exitCode;
  const files = report.outcome?.files ?? 'none';
  return exit === report.child.recordedExitCode && (files === 'same' || files === 'none');
}

export interface Tally {
  runs: number;
  /** runs whose traffic matched strictly (PASS) */
  passed: number;
  /** runs that asked something unrecorded (diverged or missing) */
  askedUnrecorded: number;
  /** runs that ended as the recording did */
  reproduced: number;
  /** outcome key → count, most frequent first */
  outcomes: [string, number][];
}

export function tally(reports: ReplayReport[]): Tally {
  const counts = new Map<string, number>();
  for (const r of reports) counts.set(outcomeKey(r), (counts.get(outcomeKey(r)) ?? 0) + 1);
  return {
    runs: reports.length,
    passed: reports.filter((r) => r.verdict.ending === 'PASS').length,
    askedUnrecorded: reports.filter((r) => r.verdict.diverged + r.verdict.missing > 0).length,
    reproduced: reports.filter(reproducesRecording).length,
    outcomes: [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])),
  };
}

export function formatOutcomes(t: Tally): string {
  return t.outcomes.map(([key, n]) => `${n}/${t.runs} ${key}`).join(', ');
}

/** `tally: runs=4 pass=4/4 reproduced=2/4 outcomes: 2/4 child-exit=0 files=same, 2/4 child-exit=1 files=different:1` */
export function tallyLine(t: Tally): string {
  return `tally: runs=${t.runs} pass=${t.passed}/${t.runs} reproduced=${t.reproduced}/${t.runs} outcomes: ${formatOutcomes(t)}`;
}
