import { spawn } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { UsageError, type ParsedArgs } from './args.js';
import { daemonOptionsFrom } from './daemon-options.js';
import { Daemon, type SessionEnd, type SessionInfo, type SessionRequest, type SessionResult } from '../daemon.js';
import type { BlobStore } from '../launch/workspace.js';
import type { TraceMeta, WorkspaceMeta } from '../trace/schema.js';
import { DaemonClient } from '../daemon-client.js';
import { homePaths } from '../home.js';
import { childEnvironment } from '../launch/child-env.js';
import { createLogger } from '../log.js';
import { StoreLockedError } from '../trace/store.js';

/** Shared by `record` and `replay`: the home's daemon (running, or started in-process), sessions on it, the child. */
export interface DaemonAccess {
  /** content-addressed blobs in the trace store (workspace files and snapshots) */
  blobs: BlobStore;
  /** a trace's metadata (`last` resolved), or undefined */
  getTrace(name: string): Promise<TraceMeta | undefined>;
  openSession(request: SessionRequest): Promise<Backend>;
  /** for an in-process daemon: wait until other commands' sessions end, then stop */
  close(): Promise<void>;
  note?: string;
}

export interface Backend {
  session: SessionInfo;
  setWorkspace(workspace: WorkspaceMeta): Promise<void>;
  end(result: SessionResult): Promise<SessionEnd>;
  /** ends the session and deletes what it recorded (a failure before the command started) */
  abort(): Promise<void>;
}

/**
 * Finds the daemon running for the home, or starts one in-process (ephemeral loopback port) that stays up
 * until the last session that keeps it alive ends.
 */
export async function connectDaemon(args: ParsedArgs, command: string): Promise<DaemonAccess> {
  const options = daemonOptionsFrom(args, command, 0);
  const paths = homePaths(options.home);
  for (let attempt = 0; attempt < 50; attempt++) {
    const client = await DaemonClient.find(paths.stateFile);
    if (client) {
      const ignored = ['listen', 'intercept', 'connect-to', 'upstream-ca', 'redact-rules', 'header-timeout', 'idle-timeout'].filter((name) => args.flags.has(name));
      return {
        blobs: { put: (content) => client.putBlob(content), get: (hash) => client.getBlob(hash) },
        getTrace: (name) => client.getTrace(name),
        openSession: async (request) => {
          const session = await client.createSession(request);
          return {
            session,
            setWorkspace: async (workspace) => void (await client.setWorkspace(session.id, workspace)),
            end: (result) => client.endSession(session.id, result),
            abort: async () => void (await client.request('DELETE', `/sessions/${encodeURIComponent(session.id)}`)),
          };
        },
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
      // Another command started a daemon on this home a moment ago: wait for its state file and use it.
      if (err instanceof StoreLockedError) {
        await sleep(100);
        continue;
      }
      throw err;
    }
    return {
      blobs: { put: (content) => daemon.store.putBlob(content), get: (hash) => daemon.store.getBlob(hash) },
      getTrace: async (name) => (name === 'last' ? daemon.store.getTrace((await daemon.store.latestTraceName()) ?? '') : daemon.store.getTrace(name)),
      openSession: async (request) => {
        const session = await daemon.registerSession(request);
        return {
          session,
          setWorkspace: (workspace) => daemon.setSessionWorkspace(session.id, workspace),
          end: (result) => daemon.endSession(session.id, result),
          abort: () => daemon.abortSession(session.id),
        };
      },
      close: async () => {
        await daemon.whenIdle();
        await daemon.stop();
      },
    };
  }
  throw new UsageError(`${command}: the trace store for ${options.home} is locked by another process that runs no daemon; retry when it finishes`);
}

export function runChild(command: string[], env: NodeJS.ProcessEnv, cwd?: string): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command[0]!, command.slice(1), { stdio: 'inherit', env, cwd });
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


/** The child's environment: the parent's, pointed at the session (proxy, CA trust, base URLs unless --no-base-url). */
export function sessionEnvironment(session: SessionInfo, home: string, baseUrls: boolean): NodeJS.ProcessEnv {
  return {
    ...process.env,
    ...childEnvironment({ proxyUrl: session.proxyUrl, baseUrlPrefix: baseUrls ? session.baseUrlPrefix : null, paths: homePaths(home) }),
  };
}

/** The child's exit code as a shell reports it: 128+N when signal N killed it. */
export function exitCodeOf(exit: { code: number | null; signal: NodeJS.Signals | null }): number {
  return exit.signal ? 128 + (osConstants.signals[exit.signal] ?? 0) : (exit.code ?? 1);
}
