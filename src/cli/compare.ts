import { writeFileSync } from 'node:fs';
import { UsageError, flag, has, parseArgs } from './args.js';
import { REPLAY_FLAGS, REPLAY_HELP, replayOnce, withReplayContext } from './replay.js';
import { formatComparison, readComparison } from '../replay/compare.js';
import { repeatCount } from '../replay/tally.js';
import type { ReplayReport } from '../replay/verdict.js';
import { newRunId } from '../replay/player.js';

export const COMPARE_HELP = `usage: mitm-replay compare [NAME|last] [--repeat N] --control 'UNPATCHED CMD' [replay options] -- PATCHED CMD [ARGS...]

Answers "did my patch fix it, or does the failure simply no longer reproduce?". Replays trace NAME
(default: last) with both arms, N times each (default 1), alternating, each run in its own sandbox, then
prints a two-row table (arm, traffic verdicts, outcome distribution) and one reading:
  1. the failure does not reproduce on this recording (the control does not end as recorded)
  2. patched diverges from the recording at exchange K (it asked something the recording cannot answer)
  3. the fix is exercised by this trajectory (control reproduces N/N, patched ends differently, asking
     nothing unrecorded)
  4. the patch does not change the outcome on this recording
Mixed tallies (3/5) are reported as such. Exits 0 only for reading 3; 1 otherwise; 2 for its own errors.
The control command runs through 'sh -c'. Each run's report is kept ('mitm-replay report NAME --run ID').

options:
  --control CMD            the unpatched command (one shell string)
  --repeat N               runs per arm (default 1)
  --json FILE              write both arms' reports and the reading as JSON
  (and every option of 'mitm-replay replay'; see below)

${REPLAY_HELP.split('\n').slice(REPLAY_HELP.split('\n').findIndex((l) => l.startsWith('options:')) + 1).join('\n')}`;

export async function runCompare(argv: string[]): Promise<number> {
  const args = parseArgs('compare', argv, { ...REPLAY_FLAGS, repeat: { value: true }, control: { value: true } });
  if (has(args, 'help')) {
    console.log(COMPARE_HELP);
    return 0;
  }
  const control = flag(args, 'control');
  if (!control) throw new UsageError("compare: --control 'UNPATCHED CMD' is required (see 'mitm-replay compare --help')");
  if (!args.rest || args.rest.length === 0) throw new UsageError("compare: no patched command given; usage: mitm-replay compare NAME --control 'CMD' -- PATCHED CMD");
  if (args.positionals.length > 1) throw new UsageError(`compare: unexpected argument '${args.positionals[1]}'`);
  const repeat = repeatCount('compare', args);
  const patched = args.rest;
  const jsonFile = flag(args, 'json');
  return withReplayContext('compare', args, args.positionals[0], async (ctx) => {
    // Every run's report carries this invocation's id and its arm, so the trace viewer can rebuild the table.
    const compareId = newRunId().replace(/^r-/, 'c-');
    const controlRuns: ReplayReport[] = [];
    const patchedRuns: ReplayReport[] = [];
    for (let i = 0; i < repeat; i++) {
      // alternate the arms, so drift over time affects both alike
      for (const [arm, command, runs] of [
        ['control', ['sh', '-c', control], controlRuns],
        ['patched', patched, patchedRuns],
      ] as const) {
        const report = await replayOnce(ctx, [...command], { id: compareId, arm });
        process.stderr.write(`mitm-replay: ${arm} run ${report.runId}: ${report.line}\n`);
        runs.push(report);
      }
    }
    const result = readComparison(controlRuns, patchedRuns);
    process.stderr.write(`${formatComparison(result)}\n`);
    if (jsonFile) writeFileSync(jsonFile, `${JSON.stringify({ control: controlRuns, patched: patchedRuns, result }, null, 2)}\n`);
    return result.reading === 3 ? 0 : 1;
  });
}
