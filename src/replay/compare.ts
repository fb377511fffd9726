import type { ReplayReport } from './verdict.js';
import { formatOutcomes, tally, type Tally } from './tally.js';

export interface CompareResult {
  control: Tally;
  patched: Tally;
  /** 1-4 as in the issue, or null for a mixed tally that supports no reading */
  reading: 1 | 2 | 3 | 4 | null;
  sentence: string;
}

/** The first exchange (1-based, in request order) at which any patched run asked something unrecorded. */
function firstUnrecordedExchange(reports: ReplayReport[]): number | null {
  let first: number | null = null;
  for (const report of reports) {
    const at = report.requests.findIndex((r) => r.outcome !== 'exact');
    if (at >= 0 && (first === null || at + 1 < first)) first = at + 1;
  }
  return first;
}

/**
 * Reads a control arm (unpatched) against a patched arm on one recording, in the issue's order of
 * precedence. Mixed tallies are reported as such, never rounded to a reading.
 */
export function readComparison(controlRuns: ReplayReport[], patchedRuns: ReplayReport[]): CompareResult {
  const control = tally(controlRuns);
  const patched = tally(patchedRuns);
  const n = control.runs;
  const result = (reading: CompareResult['reading'], sentence: string): CompareResult => ({ control, patched, reading, sentence });
  if (control.reproduced === 0) {
    return result(1, 'the failure does not reproduce on this recording; a green patched run says nothing about the fix');
  }
  if (control.reproduced < n) {
    return result(null, `mixed: the control reproduces the recorded outcome in ${control.reproduced}/${n} runs (${formatOutcomes(control)}); no reading`);
  }
  if (patched.askedUnrecorded > 0) {
    const k = firstUnrecordedExchange(patchedRuns);
    return result(2, `patched diverges from the recording at exchange ${k}; this recording cannot judge it beyond that point (patched outcome: ${formatOutcomes(patched)})`);
  }
  if (patched.reproduced === 0) return result(3, 'the fix is exercised by this trajectory');
  if (patched.reproduced === patched.runs) return result(4, 'the patch does not change the outcome on this recording');
  return result(null, `mixed: the patched arm reproduces the recorded outcome in ${patched.reproduced}/${patched.runs} runs (${formatOutcomes(patched)}); no reading`);
}

/** A two-row table: arm, traffic verdicts, outcome distribution. */
export function formatComparison(result: CompareResult): string {
  const row = (arm: string, t: Tally) =>
    `${arm.padEnd(8)} pass=${t.passed}/${t.runs} unrecorded=${t.askedUnrecorded}/${t.runs} reproduced=${t.reproduced}/${t.runs}  ${formatOutcomes(t)}`;
  return [
    `${'arm'.padEnd(8)} traffic and outcome`,
    row('control', result.control),
    row('patched', result.patched),
    `reading${result.reading === null ? '' : ` ${result.reading}`}: ${result.sentence}`,
  ].join('\n');
}
