import { spawn } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { UsageError, type ParsedArgs } from './args.js';
import { daemonOptionsFrom } from './daemon-options.js';
import { Daemon, type SessionEnd, type SessionInfo, type SessionRequest } from '../daemon.js';
import { DaemonClient } from '../daemon-client.js';
import { homePaths } from '../home.js';
import { createLogger } from '../log.js';
import { StoreLockedError } from '../trace/store.js';

/** Shared by `record` and `replay`: a session on the home's daemon (running, or started in-process), and the child. */
export interface Backend {
  session: SessionInfo;
  end(result: { exitCode?: number; signal?: string }): Promise<SessionEnd>;
  /** for an in-process daemon: wait until other records' sessions end, then stop */
  close(): Promise<void>;
  note?: string;
}

/**
 * Opens a session on the daemon running for the home, or on one started in-process (ephemeral loopback port)
 * that stays up until the last session that keeps it alive ends.
 */
export async function connectBackend(args: ParsedArgs, command: string, request: SessionRequest): Promise<Backend> {
  const options = daemonOptionsFrom(args, command, 0);
  const paths = homePaths(options.home);
  for (let attempt = 0; attempt < 50; attempt++) {
    const client = await DaemonClient.find(paths.stateFile);
    if (client) {
      const session = await client.createSession(request);
      const ignored = ['listen', 'intercept', 'connect-to', 'upstream-ca', 'redact-rules'].filter((name) => args.flags.has(name));
      return {
        session,
        end: (result) => client.endSession(session.id, result),
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
      end: (result) => daemon.endSession(session.id, result),
      close: async () => {
        await daemon.whenIdle();
        await daemon.stop();
      },
    };
  }
  throw new UsageError(`${command}: the trace store for ${options.home} is locked by another process that runs no daemon; retry when it finishes`);
}

export function runChild(command: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
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


/** The child's exit code as a shell reports it: 128+N when signal N killed it. */
export function exitCodeOf(exit: { code: number | null; signal: NodeJS.Signals | null }): number {
  return exit.signal ? 128 + (osConstants.signals[exit.signal] ?? 0) : (exit.code ?? 1);
}
