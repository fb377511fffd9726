/**
 * Plumbing shared by the benches (proxy-bench.mjs, replay-bench.mjs): child processes and temp dirs that are
 * killed / removed whatever happens, request/response over IPC, starting the upstream (upstream-child.mjs) and the
 * daemon (daemon-child.mjs), CPU and memory per process from /proc, and small statistics. Loopback only.
 */
import { execFileSync, fork } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { now } from './client.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const CHILD_STDIO = ['ignore', 'inherit', 'inherit', 'ipc'];

// ---------------------------------------------------------------------------------------------------------------
// Statistics and formatting
// ---------------------------------------------------------------------------------------------------------------

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

export const percentile = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};

export const fmt = (x, digits = 0) =>
  x === undefined || x === null || Number.isNaN(x) ? '—' : x.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });

// ---------------------------------------------------------------------------------------------------------------
// Child processes and temp dirs: tracked, and killed / removed whatever happens
// ---------------------------------------------------------------------------------------------------------------

/** Request/response over IPC with a forked child: resolves with the `${type}:done` answer. */
export function rpc(child, type, body = {}, timeoutMs = 30_000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.off('message', onMessage);
      reject(new Error(`${type}: no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    const onMessage = (message) => {
      if (message?.type !== `${type}:done`) return;
      clearTimeout(timer);
      child.off('message', onMessage);
      if (message.error) reject(new Error(`${type}: ${message.error}`));
      else resolve(message);
    };
    child.on('message', onMessage);
    child.send({ type, ...body });
  });
}

/**
 * One bench run's child processes and temp dirs. Children are SIGKILLed and temp dirs removed on exit, on
 * SIGINT/SIGTERM/SIGHUP and by cleanup(). `tag` prefixes messages ('[bench]'); set `shuttingDown` before stopping
 * children on purpose, so their exits are not reported as early.
 */
export class BenchProcesses {
  #children = new Set();
  #tempDirs = [];

  constructor(tag) {
    this.tag = tag;
    this.shuttingDown = false;
    process.on('exit', () => this.cleanup());
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
      process.on(signal, () => {
        console.error(`\n${signal}: stopping`);
        this.shuttingDown = true;
        this.cleanup();
        process.exit(130);
      });
    }
  }

  cleanup() {
    for (const child of this.#children) {
      if (child.exitCode === null && child.signalCode === null) {
        try {
          child.kill('SIGKILL');
        } catch {
          // already gone
        }
      }
    }
    this.#children.clear();
    for (const dir of this.#tempDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  }

  track(child, name) {
    this.#children.add(child);
    child.once('exit', (code, signal) => {
      this.#children.delete(child);
      if (!this.shuttingDown && (code !== 0 || signal)) console.error(`${this.tag} ${name} exited early (code ${code}, signal ${signal})`);
    });
    return child;
  }

  /** A fresh temp dir, removed at cleanup unless `keep`. */
  tempDir(prefix, keep = false) {
    const dir = mkdtempSync(join(tmpdir(), prefix));
    if (!keep) this.#tempDirs.push(dir);
    return dir;
  }

  /** The bench upstream (upstream-child.mjs) with the given server certificate; streamGapMs: its SSE chat pause. */
  async startUpstream({ certPem, keyPem, streamGapMs }) {
    const child = this.track(fork(join(here, 'upstream-child.mjs'), [], { stdio: CHILD_STDIO }), 'upstream');
    const ready = new Promise((resolve, reject) => {
      child.once('message', resolve);
      child.once('exit', () => reject(new Error('upstream exited before it was ready')));
    });
    child.send({ type: 'start', certPem, keyPem, streamGapMs });
    const { port } = await ready;
    return { child, port };
  }

  /**
   * The daemon under test (daemon-child.mjs, Daemon from dist/) in `home`, sending every intercepted origin to the
   * upstream on 127.0.0.1:upstreamPort. Resolves { child, port, token, caPem }.
   */
  async startDaemon({ home, upstreamPort, upstreamCaPem, intercept, logLevel, leafCacheSize, execArgv = [] }) {
    if (!existsSync(join(here, '..', 'dist', 'daemon.js'))) throw new Error('dist/ is missing: run `npm run build` first');
    const child = this.track(fork(join(here, 'daemon-child.mjs'), [], { execArgv, stdio: CHILD_STDIO }), 'mitm-replay daemon');
    const { port, token, caPem } = await rpc(child, 'start', { home, upstreamPort, upstreamCaPem, intercept, logLevel, leafCacheSize });
    return { child, port, token, caPem };
  }
}

// ---------------------------------------------------------------------------------------------------------------
// CPU and memory per process (/proc), to show where the cycles go on a 2-core machine
// ---------------------------------------------------------------------------------------------------------------

let clockTicks = 100;
try {
  clockTicks = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;
} catch {
  // keep 100
}

/** CPU seconds (utime + stime, all threads) used by process `pid` so far. */
export function cpuSeconds(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / clockTicks; // utime + stime
  } catch {
    return NaN;
  }
}

/** CPU seconds used by the whole machine (all processes, all cores), from /proc/stat. */
export function machineBusySeconds() {
  try {
    const fields = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0].trim().split(/\s+/).slice(1).map(Number);
    const [user, nice, system, , , irq, softirq, steal] = fields;
    return (user + nice + system + irq + softirq + (steal ?? 0)) / clockTicks;
  } catch {
    return NaN;
  }
}

export function rssMb(pid) {
  try {
    return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) / 1024;
  } catch {
    return NaN;
  }
}

/** pids: { name: pid }; CPU seconds of each, and of the machine, at one moment. */
export const cpuSnapshot = (pids) => ({ at: now(), machine: machineBusySeconds(), cpu: Object.fromEntries(Object.entries(pids).map(([name, pid]) => [name, cpuSeconds(pid)])) });

/** % of one core per process between two snapshots, plus `other`: what the rest of the machine used meanwhile. */
export function cpuPercent(start, end) {
  const wall = (end.at - start.at) / 1000;
  const ours = Object.fromEntries(Object.keys(start.cpu).map((name) => [name, (100 * (end.cpu[name] - start.cpu[name])) / wall]));
  const machine = (100 * (end.machine - start.machine)) / wall;
  return { ...ours, other: Math.max(0, machine - Object.values(ours).reduce((a, b) => a + b, 0)) };
}
