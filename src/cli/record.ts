import { UsageError, flag, has, parseArgs } from './args.js';
import { DAEMON_FLAGS, DAEMON_FLAGS_HELP, daemonOptionsFrom } from './daemon-options.js';
import { connectBackend, exitCodeOf, runChild, type Backend } from './launch.js';
import { DaemonError } from '../daemon.js';
import { DaemonClientError } from '../daemon-client.js';
import { homePaths } from '../home.js';
import { childEnvironment } from '../launch/child-env.js';
import type { TraceSummary } from '../trace/store.js';

export const RECORD_HELP = `usage: mitm-replay record [--trace NAME] [--force] [--no-base-url] [daemon options] -- CMD [ARGS...]

Runs CMD with its environment pointed at mitm-replay (for that process only) and records its traffic into
a trace. Uses the daemon running for the home if there is one; otherwise runs one in-process on an
ephemeral loopback port for the duration. Prints the trace name and a one-line summary on stderr and
exits with CMD's exit code (128+N if signal N killed it); 125 if mitm-replay failed before CMD started.

options:
  --force                  replace an existing trace of the same name
  --no-base-url            do not set OPENAI_BASE_URL / ANTHROPIC_BASE_URL
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
    args = parseArgs('record', argv, { ...DAEMON_FLAGS, force: {}, 'no-base-url': {} });
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
  let backend: Backend;
  try {
    if (args.positionals.length > 0) throw new UsageError(`record: unexpected argument '${args.positionals[0]}': put the command after '--' (mitm-replay record -- CMD ARGS)`);
    if (!args.rest || args.rest.length === 0) throw new UsageError(`record: no command given; usage: mitm-replay record [options] -- CMD [ARGS...]`);
    backend = await connectBackend(args, 'record', {
      trace: flag(args, 'trace'),
      force: has(args, 'force'),
      source: 'record',
      command: args.rest,
      cwd: process.cwd(),
      ownerPid: process.pid,
      keepsDaemonAlive: true,
    });
  } catch (err) {
    if (err instanceof UsageError || err instanceof DaemonError || err instanceof DaemonClientError) {
      process.stderr.write(`mitm-replay: ${err.message.replace(/^record: /, 'record: ')}\n`);
      return RECORD_SETUP_FAILURE;
    }
    throw err;
  }
  if (backend.note) process.stderr.write(`mitm-replay: ${backend.note}\n`);
  const options = daemonOptionsFrom(args, 'record', 0);
  const env = {
    ...process.env,
    ...childEnvironment({
      proxyUrl: backend.session.proxyUrl,
      baseUrlPrefix: has(args, 'no-base-url') ? null : backend.session.baseUrlPrefix,
      paths: homePaths(options.home),
    }),
  };
  let exit: { code: number | null; signal: NodeJS.Signals | null };
  try {
    exit = await runChild(args.rest!, env);
  } catch (err) {
    await backend.end({ exitCode: RECORD_SETUP_FAILURE }).catch(() => undefined);
    await backend.close();
    process.stderr.write(`mitm-replay: record: cannot start '${args.rest![0]}': ${(err as Error).message}\n`);
    return RECORD_SETUP_FAILURE;
  }
  const exitCode = exitCodeOf(exit);
  const ended = await backend.end({ exitCode, signal: exit.signal ?? undefined });
  if (ended.mode === 'record') process.stderr.write(`${summaryLine(ended.trace, ended.summary, ended.writeErrors)}\n`);
  await backend.close();
  return exitCode;
}
