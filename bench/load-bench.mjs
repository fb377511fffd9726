#!/usr/bin/env node
/**
 * Load and memory, the long versions of test/load.test.ts and test/leaf-cache.test.ts, through a recording daemon
 * (daemon-child.mjs) in front of the bench upstream (upstream-child.mjs), the client here. Loopback only.
 *
 *   npm run build && node bench/load-bench.mjs            (about 4 minutes)
 *   node bench/load-bench.mjs --quick                       (a smoke run, < 1 minute)
 *
 * Phases:
 *   1. streams: 200 concurrent SSE streams (10 frames, 100 ms apart), three rounds
 *   2. knee: keep-alive requests, closed loop, 1 to 64 connections, 3 s each: requests/s and latency per level;
 *      the knee is the level after which requests/s grows by less than 10 % while p99 latency keeps rising
 *   3. sustained: an open-loop rate of 1,000 requests/s (or 80 % of the knee's rate if lower) for 30 s; RSS
 *      sampled every second
 *   4. memory: 10,000 sequential connections (a new CONNECT and TLS handshake each) to 500 distinct hosts, with the
 *      leaf cache capped at 100; RSS every 1,000 connections
 * Every phase counts errors and checks the daemon stored one exchange per request; before and after, the daemon's
 * open file descriptors, 'connection' listeners and open connections are compared.
 */
import { createSecureContext } from 'node:tls';
import { createBenchCa } from './ca.mjs';
import { Conn, now, openTls } from './client.mjs';
import { BenchProcesses, fmt, percentile, rpc, sleep } from './harness.mjs';

const QUICK = process.argv.includes('--quick');
const CONFIG = {
  streamRounds: QUICK ? 1 : 3,
  streams: 200,
  levels: QUICK ? [1, 8, 32] : [1, 2, 4, 8, 16, 32, 64],
  levelMs: QUICK ? 1000 : 3000,
  sustainedMs: QUICK ? 5000 : 30_000,
  sustainedTarget: 1000,
  memoryConnections: QUICK ? 1000 : 10_000,
  memoryHosts: QUICK ? 100 : 500,
  leafCap: QUICK ? 20 : 100,
};
const procs = new BenchProcesses('[load-bench]');
const mb = (x) => `${fmt(x)} MiB`;

async function connect(daemon, secureContext, host) {
  return new Conn(await openTls({ proxyPort: daemon.port, host, port: 443, servername: host, secureContext }));
}

/** Reads an SSE response to its end over one new connection; resolves with the number of frames. */
async function stream(daemon, secureContext) {
  const conn = await connect(daemon, secureContext, 'api.load.test');
  try {
    const res = await conn.request('/sse-timed?frames=10&gap=100', { host: 'api.load.test', timeoutMs: 30_000 });
    if (res.status !== 200) throw new Error(`status ${res.status}`);
    return res.bytes;
  } finally {
    conn.close();
  }
}

async function streamsPhase(daemon, secureContext) {
  const rows = [];
  for (let round = 0; round < CONFIG.streamRounds; round++) {
    const start = now();
    const results = await Promise.allSettled(Array.from({ length: CONFIG.streams }, () => stream(daemon, secureContext)));
    const errors = results.filter((r) => r.status === 'rejected');
    const sizes = new Set(results.filter((r) => r.status === 'fulfilled').map((r) => r.value));
    rows.push({ round, ms: now() - start, errors: errors.length, firstError: errors[0]?.reason?.message, sameSize: sizes.size === 1, rss: (await rpc(daemon.child, 'counts')).rssMb });
  }
  return rows;
}

/** Closed loop: `connections` keep-alive connections, each sending its next request when the last one ended. */
async function closedLoop(daemon, secureContext, connections, ms) {
  const conns = await Promise.all(Array.from({ length: connections }, () => connect(daemon, secureContext, 'api.load.test')));
  const latencies = [];
  let errors = 0;
  const deadline = now() + ms;
  await Promise.all(
    conns.map(async (conn) => {
      while (now() < deadline) {
        try {
          const res = await conn.request('/echo', { host: 'api.load.test' });
          if (res.status !== 200) errors++;
          latencies.push(res.end - res.start);
        } catch {
          errors++;
          return;
        }
      }
    }),
  );
  conns.forEach((c) => c.close());
  return { connections, requests: latencies.length, rps: latencies.length / (ms / 1000), p50: percentile(latencies, 50), p99: percentile(latencies, 99), errors };
}

/** Open loop: requests are started on a fixed schedule over `connections` connections (queued if one is busy). */
async function openLoop(daemon, secureContext, rate, ms, connections = 16) {
  const conns = await Promise.all(Array.from({ length: connections }, () => connect(daemon, secureContext, 'api.load.test')));
  const queues = conns.map(() => Promise.resolve());
  const latencies = [];
  const rss = [];
  let errors = 0;
  let sent = 0;
  const start = now();
  const sampler = setInterval(() => void rpc(daemon.child, 'counts').then((c) => rss.push(c.rssMb)), 1000);
  while (now() - start < ms) {
    const due = Math.floor(((now() - start) / 1000) * rate);
    for (; sent < due; sent++) {
      const i = sent % connections;
      const scheduled = now();
      queues[i] = queues[i].then(() =>
        conns[i].request('/echo', { host: 'api.load.test' }).then(
          (res) => {
            if (res.status !== 200) errors++;
            latencies.push(res.end - scheduled);
          },
          () => errors++,
        ),
      );
    }
    await sleep(2);
  }
  await Promise.all(queues);
  clearInterval(sampler);
  const elapsed = (now() - start) / 1000;
  conns.forEach((c) => c.close());
  return { rate, sent, achieved: latencies.length / elapsed, p50: percentile(latencies, 50), p99: percentile(latencies, 99), errors, rss };
}

async function memoryPhase(daemon, secureContext) {
  const samples = [];
  let errors = 0;
  const start = now();
  for (let i = 0; i < CONFIG.memoryConnections; i++) {
    const host = `h${i % CONFIG.memoryHosts}.load.test`;
    try {
      const conn = await connect(daemon, secureContext, host);
      const res = await conn.request('/echo', { host, close: true });
      if (res.status !== 200) errors++;
      conn.close();
    } catch {
      errors++;
    }
    if ((i + 1) % (CONFIG.memoryConnections / 10) === 0) {
      const counts = await rpc(daemon.child, 'counts');
      samples.push({ connections: i + 1, rss: counts.rssMb, leaf: counts.leaf.size, misses: counts.leaf.misses });
    }
  }
  return { samples, errors, seconds: (now() - start) / 1000 };
}

try {
  const ca = createBenchCa(['127.0.0.1', '*.load.test']);
  const upstream = await procs.startUpstream({ certPem: ca.certPem, keyPem: ca.keyPem });
  const daemon = await procs.startDaemon({ home: procs.tempDir('mitm-replay-load-home-'), upstreamPort: upstream.port, upstreamCaPem: ca.caCertPem, leafCacheSize: CONFIG.leafCap, execArgv: ['--expose-gc'] });
  const secureContext = createSecureContext({ ca: daemon.caPem });
  // warm: the leaf for api.load.test, the trace, the upstream pool
  await closedLoop(daemon, secureContext, 1, 300);
  await sleep(5000); // the upstream pool's idle connections (4 s) go, so the counts below are a resting daemon's
  const before = await rpc(daemon.child, 'counts', { exchanges: true }, 120_000);
  const heapBefore = await rpc(daemon.child, 'memory');
  let expected = before.exchanges;
  console.error(`[load-bench] resting daemon: ${before.fds} fds, ${before.connectionListeners} connection listeners, RSS ${mb(before.rssMb)}`);

  // after each phase, once idle connections had their time to go: descriptors per phase, to place a leak
  const phaseFds = [];
  // (the upstream pool keeps an idle connection per origin for 4 s: after the memory phase that is up to one per
  // host, so wait until they are gone, up to 15 s, and say how long it took)
  const settle = async (phase) => {
    const start = now();
    let counts;
    do {
      await sleep(1000);
      counts = await rpc(daemon.child, 'counts');
    } while (counts.fds > before.fds && now() - start < 15_000);
    phaseFds.push({ phase, fds: counts.fds, sockets: counts.fdKinds.socket ?? 0, seconds: (now() - start) / 1000 });
  };
  console.error('[load-bench] streams…');
  const streams = await streamsPhase(daemon, secureContext);
  await settle('streams');
  expected += CONFIG.streamRounds * CONFIG.streams;

  console.error('[load-bench] knee…');
  const levels = [];
  for (const connections of CONFIG.levels) {
    const level = await closedLoop(daemon, secureContext, connections, CONFIG.levelMs);
    levels.push(level);
    expected += level.requests + level.errors;
  }
  let knee = levels[0];
  for (let i = 1; i < levels.length; i++) {
    if (levels[i].rps < levels[i - 1].rps * 1.1) break;
    knee = levels[i];
  }
  const best = levels.reduce((a, b) => (b.rps > a.rps ? b : a));
  await settle('knee');

  const rate = Math.min(CONFIG.sustainedTarget, Math.floor(best.rps * 0.8));
  console.error(`[load-bench] sustained ${rate} req/s…`);
  const sustained = await openLoop(daemon, secureContext, rate, CONFIG.sustainedMs);
  expected += sustained.sent;
  await settle('sustained');

  console.error(`[load-bench] memory: ${CONFIG.memoryConnections} connections to ${CONFIG.memoryHosts} hosts…`);
  const memory = await memoryPhase(daemon, secureContext);
  expected += CONFIG.memoryConnections;

  await settle('memory');
  const after = await rpc(daemon.child, 'counts', { exchanges: true }, 120_000);
  // RSS keeps what V8 and the allocator grew to; the heap after a forced GC is what is really held
  const heapAfter = await rpc(daemon.child, 'memory');
  await rpc(daemon.child, 'stop', {}, 15_000).catch(() => undefined);

  console.log(`\n## Load (${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC${QUICK ? ', --quick' : ''})\n`);
  console.log('Streams: 200 concurrent SSE streams, 10 frames 100 ms apart, each on its own connection');
  console.log('| round | wall time | errors | every stream complete and equal | daemon RSS after |');
  console.log('|---:|---:|---:|:---|---:|');
  for (const r of streams) console.log(`| ${r.round + 1} | ${fmt(r.ms)} ms | ${r.errors}${r.firstError ? ` (${r.firstError})` : ''} | ${r.sameSize && !r.errors ? 'yes' : 'NO'} | ${mb(r.rss)} |`);
  console.log('\nKnee: keep-alive GET /echo, closed loop');
  console.log('| connections | requests/s | p50 | p99 | errors |');
  console.log('|---:|---:|---:|---:|---:|');
  for (const l of levels) console.log(`| ${l.connections}${l === knee ? ' (knee)' : ''} | ${fmt(l.rps)} | ${fmt(l.p50, 2)} ms | ${fmt(l.p99, 2)} ms | ${l.errors} |`);
  console.log(`\nSustained: ${rate} requests/s offered (open loop, 16 connections) for ${CONFIG.sustainedMs / 1000} s: ${fmt(sustained.achieved)} achieved, p50 ${fmt(sustained.p50, 2)} ms, p99 ${fmt(sustained.p99, 2)} ms (from the scheduled time), ${sustained.errors} errors; daemon RSS per second (MiB): min ${Math.min(...sustained.rss)}, max ${Math.max(...sustained.rss)}, last ${sustained.rss.at(-1)}`);
  console.log(`\nMemory: ${CONFIG.memoryConnections} sequential connections to ${CONFIG.memoryHosts} hosts, leaf cache capped at ${CONFIG.leafCap}, ${fmt(memory.seconds)} s, ${memory.errors} errors`);
  console.log('| connections | daemon RSS | leaf cache size | leaf misses |');
  console.log('|---:|---:|---:|---:|');
  for (const s of memory.samples) console.log(`| ${fmt(s.connections)} | ${mb(s.rss)} | ${s.leaf} | ${fmt(s.misses)} |`);
  const stored = after.exchanges - before.exchanges;
  const sent = expected - before.exchanges;
  console.log(`\nStored: ${fmt(stored)} exchanges for ${fmt(sent)} requests (${stored === sent ? 'all' : 'MISMATCH'}).`);
  console.log(`Descriptors after each phase: ${phaseFds.map((p) => `${p.phase} ${p.fds} (${p.sockets} sockets) after ${fmt(p.seconds)} s`).join(', ')}.`);
  console.error(`[load-bench] descriptors before ${JSON.stringify(before.fdKinds)}, after ${JSON.stringify(after.fdKinds)}`);
  console.log(`Resting daemon before → after: fds ${before.fds} → ${after.fds}, connection listeners ${before.connectionListeners} → ${after.connectionListeners}, open connections ${before.openConnections} → ${after.openConnections}, RSS ${mb(before.rssMb)} → ${mb(after.rssMb)}, JS heap after a forced GC ${mb(heapBefore.heapUsedMb)} → ${mb(heapAfter.heapUsedMb)} (external ${mb(heapBefore.externalMb)} → ${mb(heapAfter.externalMb)}).`);
  const ok = stored === sent && after.fds <= before.fds && after.connectionListeners === before.connectionListeners && after.openConnections === 0 && memory.errors === 0 && sustained.errors === 0 && streams.every((r) => !r.errors);
  console.log(ok ? '\nall checks passed' : '\nSOME CHECKS FAILED');
  process.exitCode = ok ? 0 : 1;
} finally {
  procs.shuttingDown = true;
  procs.cleanup();
}
