import { UsageError, flag, has, parseArgs } from './args.js';
import { summaryLine } from './record.js';
import { DaemonClient, DaemonClientError } from '../daemon-client.js';
import { homePaths, resolveHome } from '../home.js';
import { formatReport, replayExitCode } from '../replay/verdict.js';
import type { SessionEnd } from '../daemon.js';

export const END_HELP = `usage: mitm-replay end ID [--home DIR] [--json]

Ends a session opened with 'mitm-replay env' on the running daemon: a replay (ID = the run ID that
'env --replay' printed) prints its verdict and exits like 'replay' (0 PASS, 1 FAIL or DIAGNOSTIC with
anything off); a recording (ID = the trace name) closes the trace and prints its summary.

options:
  --home DIR    the daemon's home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --json        print the full replay report as JSON
  --help        this text`;

export async function runEnd(argv: string[]): Promise<number> {
  const args = parseArgs('end', argv, { home: { value: true }, json: {}, help: {} });
  if (has(args, 'help')) {
    console.log(END_HELP);
    return 0;
  }
  const [id, extra] = args.positionals;
  if (!id || extra !== undefined) throw new UsageError("end: give exactly one session ID (see 'mitm-replay end --help')");
  const home = resolveHome(flag(args, 'home'));
  const client = await DaemonClient.find(homePaths(home).stateFile);
  if (!client) throw new UsageError(`end: no daemon is running for ${home}`);
  let ended: SessionEnd;
  try {
    ended = await client.endSession(id, {});
  } catch (err) {
    if (err instanceof DaemonClientError) throw new UsageError(`end: ${err.message}`);
    throw err;
  }
  if (ended.mode === 'record') {
    process.stderr.write(`${summaryLine(ended.trace, ended.summary, ended.writeErrors)}\n`);
    return 0;
  }
  if (has(args, 'json')) console.log(JSON.stringify(ended.report, null, 2));
  else process.stderr.write(`${formatReport(ended.report)}\n`);
  return replayExitCode(ended.report.verdict);
}
