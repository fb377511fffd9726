import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export const ROOT = resolve(import.meta.dirname, '..', '..');
export const BIN = join(ROOT, 'bin', 'mitm-replay');

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs any command asynchronously. (spawnSync would block this process's event loop, and with it the test
 * upstream that the command is talking to.)
 */
export function run(command: string, args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number } = {}): Promise<CliResult> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(command, args, { cwd: options.cwd, env: options.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 60_000);
    child.once('error', reject);
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      resolvePromise({ code, signal, stdout, stderr });
    });
  });
}

/** Runs the real `bin/mitm-replay` (the compiled CLI) as a child process. */
export function runCli(args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number } = {}): Promise<CliResult> {
  return run(process.execPath, [BIN, ...args], { ...options, cwd: options.cwd ?? ROOT, env: { ...process.env, MITM_REPLAY_LOG_LEVEL: 'warn', ...options.env } });
}

/** Starts `mitm-replay daemon` in the background; resolves once its state file names a live port. */
export async function startCliDaemon(args: string[], home: string): Promise<{ child: ChildProcess; port: number; stderr: () => string }> {
  const child = spawn(process.execPath, [BIN, 'daemon', '--home', home, '--listen', '127.0.0.1:0', ...args], {
    env: { ...process.env, MITM_REPLAY_LOG_LEVEL: process.env.TEST_DAEMON_LOG_LEVEL ?? 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  child.stdout!.resume();
  const stateFile = join(home, 'daemon.json');
  for (let i = 0; i < 200; i++) {
    if (existsSync(stateFile)) {
      const state = JSON.parse(readFileSync(stateFile, 'utf8')) as { pid: number; port: number };
      if (state.pid === child.pid) return { child, port: state.port, stderr: () => stderr };
    }
    if (child.exitCode !== null) throw new Error(`daemon exited early: ${stderr}`);
    await sleep(50);
  }
  child.kill('SIGKILL');
  throw new Error(`daemon did not start: ${stderr}`);
}

/** Finds a tool or fails (under CI=true a missing tool is a failure, not a skip). */
export function haveTool(command: string, probe: string[] = ['--version']): boolean {
  const result = spawnSync(command, probe, { stdio: 'ignore' });
  const ok = result.status === 0;
  if (!ok && process.env.CI === 'true') throw new Error(`${command} is required under CI=true but is not installed (see .ci/run)`);
  return ok;
}

/** A Python that has httpx (Debian's python3-httpx lives in /usr/bin/python3's dist-packages). */
export function pythonWithHttpx(): string | null {
  for (const python of ['/usr/bin/python3', 'python3']) {
    const result = spawnSync(python, ['-c', 'import httpx'], { stdio: 'ignore' });
    if (result.status === 0) return python;
  }
  if (process.env.CI === 'true') throw new Error('python3-httpx is required under CI=true but is not installed (see .ci/run)');
  return null;
}

/** Debian's chromium (driven by playwright-core, which downloads no browser); under CI=true its absence fails. */
export const CHROMIUM = '/usr/bin/chromium';
export function haveChromium(): boolean {
  if (existsSync(CHROMIUM)) return true;
  if (process.env.CI === 'true') throw new Error('chromium is required under CI=true but is not installed (see .ci/run)');
  return false;
}
