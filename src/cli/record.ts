import { spawn } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { UsageError, flag, has, parseArgs } from './args.js';
import { DAEMON_FLAGS, DAEMON_FLAGS_HELP, daemonOptionsFrom } from './daemon-options.js';
import { Daemon, DaemonError, type SessionEnd, type SessionInfo, type SessionRequest } from '../daemon.js';
import { DaemonClient, DaemonClientError } from '../daemon-client.js';
import { homePaths } from '../home.js';
import { childEnvironment } from '../launch/child-env.js';
import { createLogger } from '../log.js';
import { StoreLockedError } from '../trace/store.js';
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

interface Backend {
  session: SessionInfo;
  end(result: { exitCode?: number; signal?: string }): Promise<SessionEnd>;
  /** for an in-process daemon: wait until other records' sessions end, then stop */
  close(): Promise<void>;
  note?: string;
}

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

async function connectBackend(args: ReturnType<typeof parseArgs>, request: SessionRequest): Promise<Backend> {
  const options = daemonOptionsFrom(args, 'record', 0);
  const paths = homePaths(options.home);
  for (let attempt = 0; attempt < 50; attempt++) {
    const client = await DaemonClient.find(paths.stateFile);
    if (client) {
      const session = await client.createSession(request);
      const ignored = ['listen', 'intercept', 'connect-to', 'upstream-ca', 'redact-rules'].filter((name) => args.flags.has(name));
      return {
        session,
        end: (result) => client.endSession(session.trace, result),
        close: async () => undefined,
        note:
          `using the daemon already running for ${options.home} (pid ${client.state.pid})` +
          (ignored.length > 0 ? `; its own settings apply, so ${ignored.map((n) => `--${n}`).join(', ')} ${ignored.length === 1 ? 'is' : 'are'} ignored` : ''),
      };
    }
    let daemon: Daemon;
    try {
      daemon = await Daemon.start({ ...options, trace: undefined, ephemeral: true, logger: createLogger({ level: process.env.MITM_REPLAY_LOG_LEVEL ?? 'warn' }) });
    } catch (err) {
      // Another `record` started a daemon on this home a moment ago: wait for its state file and use it.
      if (err instanceof StoreLockedError) {
        await sleep(100);
        continue;
      }
      throw err;
    }
    const session = await daemon.registerSession(request).catch(async (err: unknown) => {
      await daemon.stop();
      throw err;
    });
    return {
      session,
      end: (result) => daemon.endSession(session.trace, result),
      close: async () => {
        await daemon.whenIdle();
        await daemon.stop();
      },
    };
  }
  throw new UsageError(`record: the trace store for ${options.home} is locked by another process that runs no daemon; retry when it finishes`);
}

function runChild(command: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command[0]!, command.slice(1), { stdio: 'inherit', env });
    const forward = (signal: NodeJS.Signals) => () => child.kill(signal);
    const onInt = forward('SIGINT');
    const onTerm = forward('SIGTERM');
    process.on('SIGINT', onInt);
    process.on('SIGTERM', onTerm);
    const cleanup = () => {
      process.removeListener('SIGINT', onInt);
      process.removeListener('SIGTERM', onTerm);
    };
    child.once('error', (err) => {
      cleanup();
      reject(err);
    });
    child.once('exit', (code, signal) => {
      cleanup();
      resolve({ code, signal });
    });
  });
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
    backend = await connectBackend(args, {
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
  const signalNumber = exit.signal ? (osConstants.signals[exit.signal] ?? 0) : 0;
  const exitCode = exit.signal ? 128 + signalNumber : (exit.code ?? 1);
  const ended = await backend.end({ exitCode, signal: exit.signal ?? undefined });
  process.stderr.write(`${summaryLine(ended.trace, ended.summary, ended.writeErrors)}\n`);
  await backend.close();
  return exitCode;
}
