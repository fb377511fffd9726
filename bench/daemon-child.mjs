/**
 * The daemon under test, in a process of its own (forked by proxy-bench.mjs, replay-bench.mjs and
 * repro-paused-upstream.mjs over IPC), started from dist/ exactly as code would use it. Sessions go through its HTTP
 * control API (as the CLI does); IPC is only for life-cycle and measurements. Messages, each answered with
 * { type: `${type}:done`, ... }:
 *   { type: 'start', home, upstreamPort, upstreamCaPem, intercept?, logLevel?, leafCacheSize? } → { port, token, caPem }
 *     intercept defaults to ['*']; logLevel to $BENCH_DAEMON_LOG_LEVEL, else 'warn'
 *   { type: 'eld-start' } / { type: 'eld-stop' }          → event-loop delay of THIS process (monitorEventLoopDelay, 1 ms)
 *   { type: 'profile-start', intervalUs? } / { type: 'profile-stop', file } → V8 CPU profile of THIS process
 *     (node:inspector, sampling every intervalUs µs, default 500; the .cpuprofile format `node --cpu-prof` writes)
 *   { type: 'memory' } → heap after a forced GC (when forked with --expose-gc), RSS, live sessions
 *   { type: 'counts', exchanges? } → open fds (by kind), connection listeners, open client connections, leaf cache
 *     stats, RSS; with exchanges: true also the exchanges stored (reads every record)
 *   { type: 'stop' }                                        → stops the daemon and exits
 * Exits on its own when the parent goes away.
 */
import { readFileSync, readdirSync, readlinkSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Daemon } from '../dist/daemon.js';
import { createLogger } from '../dist/log.js';
import { parseConnectTo } from '../dist/proxy/connect-to.js';

if (!process.send) {
  console.error('daemon-child.mjs is started by the benches (proxy-bench.mjs, replay-bench.mjs)');
  process.exit(2);
}

let daemon = null;
let histogram = null;
let inspector = null;

const post = (session, method, params = {}) =>
  new Promise((resolve, reject) => session.post(method, params, (err, result) => (err ? reject(err) : resolve(result))));

async function countExchanges() {
  let exchanges = 0;
  for (const meta of await daemon.store.listTraces()) exchanges += (await daemon.store.summarize(meta.name)).exchanges;
  return exchanges;
}

const handlers = {
  async start({ home, upstreamPort, upstreamCaPem, intercept = ['*'], logLevel, leafCacheSize }) {
    daemon = await Daemon.start({
      home,
      port: 0,
      intercept,
      leafCacheSize,
      connectTo: [parseConnectTo(`::127.0.0.1:${upstreamPort}`)],
      upstreamCAs: [upstreamCaPem],
      logger: createLogger({ level: logLevel ?? process.env.BENCH_DAEMON_LOG_LEVEL ?? 'warn' }),
    });
    return { port: daemon.port, token: daemon.token, caPem: readFileSync(join(home, 'certs', 'ca.pem'), 'utf8') };
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
  async 'profile-start'({ intervalUs = 500 }) {
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
  async counts({ exchanges = false }) {
    // what the descriptors are: sockets, pipes, files (by directory), for a leak's first clue
    const kinds = {};
    for (const fd of readdirSync('/proc/self/fd')) {
      let target = 'gone';
      try {
        target = readlinkSync(`/proc/self/fd/${fd}`).replace(/:\[\d+\]$/, '').replace(/\/[^/]*$/, '/');
      } catch {
        // closed meanwhile
      }
      kinds[target] = (kinds[target] ?? 0) + 1;
    }
    return {
      fdKinds: kinds,
      fds: readdirSync('/proc/self/fd').length,
      connectionListeners: daemon.listener.server.listenerCount('connection'),
      openConnections: daemon.listener.openConnections,
      leaf: daemon.listener.leafStats,
      // reading every record is heavy: only when asked (before and after a run, not while sampling)
      exchanges: exchanges ? await countExchanges() : undefined,
      rssMb: Math.round(process.memoryUsage().rss / 1048576),
    };
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
