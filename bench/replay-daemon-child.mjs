/**
 * The daemon under test for the replay bench, in a process of its own (forked by replay-bench.mjs over IPC),
 * started from dist/ as code would use it, with a silent logger. Sessions go through its HTTP control API
 * (as the CLI does); IPC is only for life-cycle and profiling. Messages, each answered with `${type}:done`:
 *   { type: 'start', home, intercept, upstreamPort, upstreamCaPem } → { port, token, caPem }
 *   { type: 'profile-start', intervalUs } / { type: 'profile-stop', file } → V8 CPU profile of THIS process
 *     (node:inspector; the same .cpuprofile format `node --cpu-prof` writes, limited to one phase)
 *   { type: 'memory' } → heap after a forced GC (the child is forked with --expose-gc), RSS, live sessions
 *   { type: 'stop' } → stops the daemon and exits
 * Exits on its own when the parent goes away.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { join } from 'node:path';
import { Daemon } from '../dist/daemon.js';
import { createLogger } from '../dist/log.js';
import { parseConnectTo } from '../dist/proxy/connect-to.js';

if (!process.send) {
  console.error('replay-daemon-child.mjs is started by replay-bench.mjs');
  process.exit(2);
}

let daemon = null;
let inspector = null;

const post = (session, method, params = {}) =>
  new Promise((resolve, reject) => session.post(method, params, (err, result) => (err ? reject(err) : resolve(result))));

const handlers = {
  async start({ home, intercept, upstreamPort, upstreamCaPem }) {
    daemon = await Daemon.start({
      home,
      port: 0,
      intercept,
      connectTo: [parseConnectTo(`::127.0.0.1:${upstreamPort}`)],
      upstreamCAs: [upstreamCaPem],
      logger: createLogger({ level: 'silent' }),
    });
    const state = JSON.parse(readFileSync(join(home, 'daemon.json'), 'utf8'));
    return { port: daemon.port, token: state.token, caPem: readFileSync(join(home, 'certs', 'ca.pem'), 'utf8') };
  },
  async 'profile-start'({ intervalUs = 200 }) {
    inspector = new Session();
    inspector.connect();
    await post(inspector, 'Profiler.enable');
    await post(inspector, 'Profiler.setSamplingInterval', { interval: intervalUs });
    await post(inspector, 'Profiler.start');
    return {};
  },
  async 'profile-stop'({ file }) {
    const { profile } = await post(inspector, 'Profiler.stop');
    inspector.disconnect();
    inspector = null;
    writeFileSync(file, JSON.stringify(profile));
    return {};
  },
  async memory() {
    globalThis.gc?.(); // forked with --expose-gc: only this message collects, so the measured phases are untouched
    const m = process.memoryUsage();
    const mb = (x) => Math.round(x / 1048576);
    return { gc: typeof globalThis.gc === 'function', heapUsedMb: mb(m.heapUsed), rssMb: mb(m.rss), externalMb: mb(m.external + m.arrayBuffers), sessions: daemon?.sessions.all().length ?? 0 };
  },
  async stop() {
    if (daemon) await daemon.stop();
    daemon = null;
    setImmediate(() => process.exit(0));
    return {};
  },
};

process.on('message', (message) => {
  const handler = handlers[message.type];
  const reply = (body) => process.send?.({ type: `${message.type}:done`, ...body });
  if (!handler) return reply({ error: `unknown message ${message.type}` });
  handler(message).then(reply, (err) => reply({ error: err?.stack ?? String(err) }));
});

process.on('disconnect', () => process.exit(0));
