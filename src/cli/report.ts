import { UsageError, flag, has, parseArgs } from './args.js';
import { findReport, DaemonError } from '../daemon.js';
import { DaemonClient, DaemonClientError } from '../daemon-client.js';
import { homePaths, resolveHome } from '../home.js';
import { formatReport, type ReplayReport } from '../replay/verdict.js';
import { isValidTraceName } from '../trace/schema.js';
import { TraceStore } from '../trace/store.js';

export const REPORT_HELP = `usage: mitm-replay report [NAME|last] [--run ID] [--json] [--home DIR]

Shows a replay's verdict and divergences again: the latest replay of trace NAME (default: last), or run ID.
--json prints the full report (schema in docs/replay-report.md).

options:
  --run ID      a specific replay run (the ID 'replay' printed)
  --json        the full JSON report instead of the terminal summary
  --home DIR    the home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --help        this text`;

/** Reads a report through the running daemon (which holds the store), or from the store directly. */
export async function loadReport(home: string, trace: string, runId?: string): Promise<ReplayReport> {
  const paths = homePaths(home);
  const client = await DaemonClient.find(paths.stateFile);
  if (client) {
    const query = new URLSearchParams({ trace, ...(runId ? { run: runId } : {}) });
    return client.request<ReplayReport>('GET', `/reports?${query.toString()}`);
  }
  const store = await TraceStore.open(paths.store);
  try {
    let name = trace;
    if (name === 'last') {
      const latest = await store.latestTraceName();
      if (!latest) throw new DaemonError(`there is no trace yet in ${home}`, 404);
      name = latest;
    }
    return await findReport(store, name, runId);
  } finally {
    await store.close();
  }
}

export async function runReport(argv: string[]): Promise<number> {
  const args = parseArgs('report', argv, { run: { value: true }, json: {}, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(REPORT_HELP);
    return 0;
  }
  if (args.positionals.length > 1) throw new UsageError(`report: unexpected argument '${args.positionals[1]}' (see 'mitm-replay report --help')`);
  const trace = args.positionals[0] ?? 'last';
  if (trace !== 'last' && !isValidTraceName(trace)) throw new UsageError(`report: invalid trace name '${trace}'`);
  let report: ReplayReport;
  try {
    report = await loadReport(resolveHome(flag(args, 'home')), trace, flag(args, 'run'));
  } catch (err) {
    if (err instanceof DaemonError || err instanceof DaemonClientError) throw new UsageError(`report: ${err.message}`);
    throw err;
  }
  console.log(has(args, 'json') ? JSON.stringify(report, null, 2) : formatReport(report));
  return 0;
}
