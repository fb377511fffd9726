import { UsageError, flag, has, parseArgs } from './args.js';
import { DAEMON_FLAGS, DAEMON_FLAGS_HELP, daemonOptionsFrom } from './daemon-options.js';
import { connectDaemon, exitCodeOf, runChild, sessionEnvironment, type Backend, type DaemonAccess } from './launch.js';
import { Redactor } from '../capture/redact.js';
import { RECORD_WORKSPACE_FLAGS, RECORD_WORKSPACE_HELP, captureWorkspace, recordWorkspaceOptions, workspaceChanges, type RecordWorkspace } from '../launch/run-workspace.js';
import { WorkspaceTooLargeError } from '../launch/workspace.js';
import { StoreFormatError } from '../trace/store.js';
import { DaemonError } from '../daemon.js';
import { DaemonClientError } from '../daemon-client.js';
import type { TraceSummary } from '../trace/store.js';

export const RECORD_HELP = `usage: mitm-replay record [--trace NAME] [--force] [--no-base-url] [daemon options] -- CMD [ARGS...]

Runs CMD with its environment pointed at mitm-replay (for that process only) and records its traffic into
a trace. Uses the daemon running for the home if there is one; otherwise runs one in-process on an
ephemeral loopback port for the duration. Prints the trace name and a one-line summary on stderr and
exits with CMD's exit code (128+N if signal N killed it); 125 if mitm-replay failed before CMD started.

options:
  --force                  replace an existing trace of the same name
  --tier full|structural   full keeps every payload (default; expires after 72 h); structural keeps only the
                           run's shape (no customer data; expires after 90 days)
  --no-base-url            do not set OPENAI_BASE_URL / ANTHROPIC_BASE_URL
${RECORD_WORKSPACE_HELP}
${DAEMON_FLAGS_HELP}
  --help                   this text`;

/** Exit code for record's own failures before the child starts (as `env`, `timeout` and `git bisect run` use). */
export const RECORD_SETUP_FAILURE = 125;

function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

export function summaryLine(trace: string, summary: TraceSummary, writeErrors: number): string {
  const parts = [
    `${summary.exchanges} exchange${summary.exchanges === 1 ? '' : 's'}`,
    `${formatBytes(summary.bytesUp)} up`,
    `${formatBytes(summary.bytesDown)} down`,
  ];
  if (summary.errors > 0) parts.push(`${summary.errors} error${summary.errors === 1 ? '' : 's'}`);
  if (summary.incomplete > 0) parts.push(`${summary.incomplete} incomplete`);
  let line = `mitm-replay: trace ${trace}: ${parts.join(', ')}`;
  if (summary.tunnelledHosts.length > 0) {
    const hosts = summary.tunnelledHosts;
    line += `; tunnelled without decryption: ${hosts.join(', ')} (to capture: --intercept ${hosts.map((h) => `+${h}`).join(',')})`;
  }
  if (writeErrors > 0) line += `; WARNING: ${writeErrors} store write(s) failed, the trace is incomplete`;
  return line;
}

export async function runRecord(argv: string[]): Promise<number> {
  let args;
  try {
    args = parseArgs('record', argv, { ...DAEMON_FLAGS, ...RECORD_WORKSPACE_FLAGS, force: {}, 'no-base-url': {}, tier: { value: true } });
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`mitm-replay: ${err.message}\n`);
      return RECORD_SETUP_FAILURE;
    }
    throw err;
  }
  if (has(args, 'help')) {
    console.log(RECORD_HELP);
    return 0;
  }
  let access: DaemonAccess | null = null;
  let backend: Backend | null = null;
  let workspace: RecordWorkspace | null = null;
  let options: ReturnType<typeof daemonOptionsFrom>;
  try {
    options = daemonOptionsFrom(args, 'record', 0);
    if (args.positionals.length > 0) throw new UsageError(`record: unexpected argument '${args.positionals[0]}': put the command after '--' (mitm-replay record -- CMD ARGS)`);
    if (!args.rest || args.rest.length === 0) throw new UsageError(`record: no command given; usage: mitm-replay record [options] -- CMD [ARGS...]`);
    // the workspace flags are checked before anything starts; the redactor comes with the trace, below
    const workspaceOptions = recordWorkspaceOptions(args, options.home);
    const tier = flag(args, 'tier') ?? 'full';
    if (tier !== 'full' && tier !== 'structural') throw new UsageError(`record: --tier must be full or structural, not '${tier}'`);
    access = await connectDaemon(args, 'record');
    if (access.note) process.stderr.write(`mitm-replay: ${access.note}\n`);
    backend = await access.openSession({
      trace: flag(args, 'trace'),
      force: has(args, 'force'),
      source: 'record',
      tier,
      command: args.rest,
      cwd: process.cwd(),
      ownerPid: process.pid,
      keepsDaemonAlive: true,
    });
    const meta = await access.getTrace(backend.session.trace);
    // The snapshot goes through the trace's own redaction rules, the same as its traffic.
    // A structural trace holds no payloads, so it takes no workspace snapshot (file contents are payloads).
    const snapshotOptions = tier === 'structural' || !workspaceOptions ? undefined : { ...workspaceOptions, redactor: new Redactor(meta!.redaction) };
    if (snapshotOptions) {
      workspace = await captureWorkspace(snapshotOptions, access.blobs);
      await backend.setWorkspace(workspace.meta);
      if (workspace.meta.redactedFiles.length > 0) {
        process.stderr.write(`mitm-replay: workspace: secrets redacted before storing in ${workspace.meta.redactedFiles.join(', ')}\n`);
      }
    }
  } catch (err) {
    await backend?.abort().catch(() => undefined);
    await access?.close().catch(() => undefined);
    if (err instanceof UsageError || err instanceof DaemonError || err instanceof DaemonClientError || err instanceof WorkspaceTooLargeError || err instanceof StoreFormatError) {
      process.stderr.write(`mitm-replay: ${err instanceof WorkspaceTooLargeError ? 'record: ' : ''}${err.message}\n`);
      return RECORD_SETUP_FAILURE;
    }
    throw err;
  }
  const env = sessionEnvironment(backend.session, options.home, !has(args, 'no-base-url'));
  let exit: { code: number | null; signal: NodeJS.Signals | null };
  try {
    exit = await runChild(args.rest!, env);
  } catch (err) {
    await backend.abort().catch(() => undefined);
    await access.close();
    process.stderr.write(`mitm-replay: record: cannot start '${args.rest![0]}': ${(err as Error).message}\n`);
    return RECORD_SETUP_FAILURE;
  }
  const exitCode = exitCodeOf(exit);
  const workspaceDiff = workspace ? await workspaceChanges(workspace.options, workspace.before, access.blobs) : undefined;
  const ended = await backend.end({ exitCode, signal: exit.signal ?? undefined, workspaceDiff });
  if (ended.mode === 'record') {
    let line = summaryLine(ended.trace, ended.summary, ended.writeErrors);
    if (workspaceDiff) line += `; workspace: ${workspace!.meta.files} files snapshotted, ${workspaceDiff.length} changed by the run`;
    process.stderr.write(`${line}\n`);
  }
  await access.close();
  return exitCode;
}
