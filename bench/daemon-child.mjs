/**
 * The recording daemon under test, in a process of its own (forked by proxy-bench.mjs over IPC), started from
 * dist/ exactly as code would use it. IPC messages, each answered with { type: `${type}:done`, ... }:
 *   { type: 'start', home, upstreamPort, upstreamCaPem }  → { port, caPem }
 *   { type: 'eld-start' } / { type: 'eld-stop' }          → event-loop delay of THIS process (monitorEventLoopDelay, 1 ms)
 *   { type: 'profile-start' } / { type: 'profile-stop', file } → CPU profile (node:inspector) written to file
 *   { type: 'stop' }                                        → stops the daemon and exits
 * Exits on its own when the parent goes away.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Daemon } from '../dist/daemon.js';
import { createLogger } from '../dist/log.js';
import { parseConnectTo } from '../dist/proxy/connect-to.js';

if (!process.send) {
  console.error('daemon-child.mjs is started by proxy-bench.mjs');
  process.exit(2);
}

let daemon = null;
let histogram = null;
let inspector = null;

const post = (session, method, params = {}) =>
  new Promise((resolve, reject) => session.post(method, params, (err, result) => (err ? reject(err) : resolve(result))));

const handlers = {
  async start({ home, upstreamPort, upstreamCaPem }) {
    daemon = await Daemon.start({
      home,
      port: 0,
      intercept: ['*'],
      connectTo: [parseConnectTo(`::127.0.0.1:${upstreamPort}`)],
      upstreamCAs: [upstreamCaPem],
      logger: createLogger({ level: process.env.BENCH_DAEMON_LOG_LEVEL ?? 'warn' }),
    });
    return { port: daemon.port, caPem: readFileSync(join(home, 'certs', 'ca.pem'), 'utf8') };
  },
  async 'eld-start'() {
    histogram = monitorEventLoopDelay({ resolution: 1 });
    histogram.enable();
    return {};
  },
  async 'eld-stop'() {
    histogram.disable();
    const ms = (ns) => ns / 1e6;
    const result = { p50: ms(histogram.percentile(50)), p99: ms(histogram.percentile(99)), max: ms(histogram.max), count: histogram.count };
    histogram = null;
    return result;
  },
  async 'profile-start'() {
    inspector = new Session();
    inspector.connect();
    await post(inspector, 'Profiler.enable');
    await post(inspector, 'Profiler.setSamplingInterval', { interval: 500 });
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
