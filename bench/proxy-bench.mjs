#!/usr/bin/env node
/**
 * Side-by-side proxy benchmark: the same local HTTPS upstream reached directly, through mitm-replay (recording),
 * and through mitmdump (if installed). See bench/README.md for what each figure means.
 *
 *   npm run build && npm run bench              full run (3 rounds, < 3 minutes)
 *   npm run bench -- --profile                  + CPU profiles of the daemon per phase (bench/profiles/)
 *   npm run bench -- --quick                    1 round, short phases (smoke test)
 *   npm run bench -- --no-mitmdump              skip mitmdump
 *
 * Processes: the upstream and the daemon each run in a child process of their own, mitmdump in its own, and
 * the load generator here, so no proxy shares an event loop with the client. Loopback only.
 * Files: ca.mjs (throwaway upstream CA), client.mjs (raw HTTP/1.1 client, direct or via CONNECT),
 * upstream-child.mjs, daemon-child.mjs (Daemon from dist/ + event-loop delay / CPU profile over IPC),
 * harness.mjs (child processes, IPC, CPU from /proc, statistics; shared with replay-bench.mjs),
 * profile-summary.mjs (top frames of a .cpuprofile), repro-paused-upstream.mjs (a hang the bench found).
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import { cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { createSecureContext } from 'node:tls';
import { fileURLToPath } from 'node:url';
import { createBenchCa } from './ca.mjs';
import { Conn, now, openTls } from './client.mjs';
import { BenchProcesses, cpuPercent, cpuSnapshot, fmt, median, percentile, rpc, sleep } from './harness.mjs';
import { formatSummary, summarizeProfile } from './profile-summary.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const argv = new Set(process.argv.slice(2));
const QUICK = argv.has('--quick');
const PROFILE = argv.has('--profile');
const MITMDUMP = argv.has('--no-mitmdump') ? null : ['/usr/bin/mitmdump', ...(process.env.PATH ?? '').split(':').map((d) => join(d, 'mitmdump'))].find((p) => existsSync(p)) ?? null;

const CONFIG = {
  rounds: QUICK ? 1 : 3,
  connections: 8,
  warmMs: QUICK ? 200 : 500,
  measureMs: QUICK ? 1000 : 3000,
  sseQuery: 'frames=3&gap=20',
  sseSamples: QUICK ? 30 : 200, // in total per mode, spread over the rounds
  largeMb: 20,
  largeReps: 2, // per round and mode
  mintHosts: 100,
  deadlineMs: 175_000, // hard stop for the whole run
};

const MIB = 1024 * 1024;

// ---------------------------------------------------------------------------------------------------------------
// Child processes: tracked, and killed whatever happens (harness.mjs)
// ---------------------------------------------------------------------------------------------------------------

const procs = new BenchProcesses('[bench]');

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function canConnect(port) {
  return new Promise((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

async function startMitmdump(binary) {
  const confdir = procs.tempDir('mitm-replay-bench-mitmdump-');
  const port = await freePort();
  const stderr = [];
  const child = procs.track(
    spawn(binary, ['--listen-host', '127.0.0.1', '--listen-port', String(port), '--set', 'ssl_insecure=true', '--set', `confdir=${confdir}`, '-q'], {
      stdio: ['ignore', 'ignore', 'pipe'],
    }),
    'mitmdump',
  );
  child.stderr.on('data', (d) => stderr.push(d));
  const caFile = join(confdir, 'mitmproxy-ca-cert.pem');
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`mitmdump exited: ${Buffer.concat(stderr).toString()}`);
    if (existsSync(caFile) && (await canConnect(port))) return { child, port, caPem: readFileSync(caFile, 'utf8') };
    await sleep(100);
  }
  throw new Error('mitmdump did not start within 30 s');
}

// ---------------------------------------------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------------------------------------------

/** N workers doing GET /echo for warmMs + measureMs; fresh: a new (CONNECT +) TLS connection per request. */
async function loadPhase(mode, fresh) {
  const statsBefore = await rpc(upstreamChild, 'stats');
  const warmEnd = now() + CONFIG.warmMs;
  const end = warmEnd + CONFIG.measureMs;
  let count = 0;
  let errors = 0;
  let lastError = '';
  let cpuStart = null;
  let cpuEnd = null;
  const pids = { bench: process.pid, upstream: upstreamPid, ...(mode.pid ? { proxy: mode.pid } : {}) };
  const t1 = setTimeout(() => (cpuStart = cpuSnapshot(pids)), CONFIG.warmMs);
  const t2 = setTimeout(() => (cpuEnd = cpuSnapshot(pids)), CONFIG.warmMs + CONFIG.measureMs);
  const worker = async () => {
    let conn = null;
    let onConn = 0;
    while (now() < end) {
      try {
        if (!conn || conn.closed) {
          conn = new Conn(await mode.open());
          onConn = 0;
        }
        onConn++;
        // 5 s: a request the proxy never answers costs the phase little, and shows up as an error
        const r = await conn.request('/echo', { host: upstreamHost, close: fresh, timeoutMs: 5_000 });
        if (r.status !== 200) {
          errors++;
          lastError = `status ${r.status}`;
        } else if (r.end >= warmEnd && r.end <= end) count++;
        if (fresh) {
          conn.close();
          conn = null;
        }
      } catch (err) {
        errors++;
        lastError = `${err.message} (request ${onConn} on its connection)`;
        conn?.close();
        conn = null;
        await sleep(5);
      }
    }
    conn?.close();
  };
  await Promise.all(Array.from({ length: CONFIG.connections }, worker));
  clearTimeout(t1);
  clearTimeout(t2);
  const statsAfter = await rpc(upstreamChild, 'stats');
  const upstream = {
    connections: statsAfter.connections - statsBefore.connections,
    resumed: statsAfter.resumed - statsBefore.resumed,
    requests: statsAfter.requests - statsBefore.requests,
  };
  const cpu = cpuStart && cpuEnd ? cpuPercent(cpuStart, cpuEnd) : {};
  const rate = count / (CONFIG.measureMs / 1000);
  return { rate, errors, lastError, cpu, upstream, proxyCpuUsPerReq: cpu.proxy !== undefined && count > 0 ? (cpu.proxy / 100) * (CONFIG.measureMs * 1000) / count : undefined };
}

/** Time to the first entity byte of a timed SSE response, on one already-open keep-alive connection. */
async function ssePhase(mode, samples) {
  const conn = new Conn(await mode.open());
  const path = `/sse-timed?${CONFIG.sseQuery}`;
  try {
    for (let i = 0; i < 3; i++) await conn.request(path, { host: upstreamHost }); // warm-up, not counted
    const ttfb = [];
    for (let i = 0; i < samples; i++) {
      const r = await conn.request(path, { host: upstreamHost });
      if (r.status !== 200 || r.bytes === 0) throw new Error(`SSE answered ${r.status} with ${r.bytes} bytes`);
      ttfb.push(r.firstByte - r.start);
    }
    return ttfb;
  } finally {
    conn.close();
  }
}

/** MiB/s of GET /large?mb=N, request start to last byte, on one keep-alive connection. */
async function largePhase(mode) {
  const conn = new Conn(await mode.open());
  try {
    const rates = [];
    for (let i = 0; i < CONFIG.largeReps; i++) {
      const r = await conn.request(`/large?mb=${CONFIG.largeMb}`, { host: upstreamHost, timeoutMs: 60_000 });
      if (r.status !== 200 || r.bytes !== CONFIG.largeMb * MIB) throw new Error(`large body: status ${r.status}, ${r.bytes} bytes`);
      rates.push(CONFIG.largeMb / ((r.end - r.start) / 1000));
    }
    return rates;
  } finally {
    conn.close();
  }
}

/**
 * 100 CONNECTs to 100 host names, all at once (or one every gapMs), while the daemon measures its own event-loop
 * delay. withRequest: each connection also sends GET /echo (so the daemon dials the upstream too); without it,
 * connections stay open until every handshake is done (closing at once would cut the server's side short).
 */
async function mintPhase(names, { withRequest = false, gapMs = 0 } = {}) {
  await rpc(daemon.child, 'eld-start');
  const t0 = now();
  const open = [];
  const results = await Promise.allSettled(
    names.map(async (name, i) => {
      if (gapMs > 0) await sleep(i * gapMs);
      const start = now();
      const socket = await openTls({ proxyPort: daemon.port, host: name, port: 443, servername: name, secureContext: daemonContext, timeoutMs: 30_000 });
      const handshakeMs = now() - start;
      if (!withRequest) {
        open.push(socket);
        return handshakeMs;
      }
      try {
        const r = await new Conn(socket).request('/echo', { host: name });
        if (r.status !== 200) throw new Error(`status ${r.status}`);
      } finally {
        socket.destroy();
      }
      return handshakeMs;
    }),
  );
  const wallMs = now() - t0;
  const eld = await rpc(daemon.child, 'eld-stop');
  for (const socket of open) socket.destroy();
  const ok = results.filter((r) => r.status === 'fulfilled').map((r) => r.value);
  const failed = results.filter((r) => r.status === 'rejected');
  return { eldP50: eld.p50, eldP99: eld.p99, eldMax: eld.max, eldCount: eld.count, wallMs, handshakeP50: median(ok), handshakeMax: Math.max(...ok), failures: failed.length, firstFailure: failed[0]?.reason?.message };
}

/**
 * Reference only: keep-alive req/s with node:https (an https.Agent, keep-alive, 8 sockets) as the client instead of
 * the raw client. A heavier client shrinks the direct figure, so ratios to direct depend on the client; this shows
 * by how much.
 */
class TunnelAgent extends https.Agent {
  constructor(proxyPort, secureContext) {
    super({ keepAlive: true, maxSockets: CONFIG.connections });
    this.proxyPort = proxyPort;
    this.tunnelContext = secureContext;
  }

  createConnection(options, callback) {
    openTls({ proxyPort: this.proxyPort, host: options.host, port: options.port, secureContext: this.tunnelContext }).then(
      (socket) => callback(null, socket),
      (err) => callback(err),
    );
    return undefined;
  }
}

async function nodeClientPhase(mode) {
  const agent = mode.proxyPort ? new TunnelAgent(mode.proxyPort, mode.secureContext) : new https.Agent({ keepAlive: true, maxSockets: CONFIG.connections, secureContext: mode.secureContext });
  const warmEnd = now() + CONFIG.warmMs;
  const end = warmEnd + CONFIG.measureMs;
  let count = 0;
  let errors = 0;
  const get = () =>
    new Promise((resolve, reject) => {
      const req = https.get({ host: '127.0.0.1', port: upstreamPort, path: '/echo', agent, timeout: 5_000 }, (res) => {
        res.on('data', () => {});
        res.on('end', () => resolve(res.statusCode));
        res.on('error', reject);
      });
      req.on('timeout', () => req.destroy(new Error('timed out')));
      req.on('error', reject);
    });
  const worker = async () => {
    while (now() < end) {
      try {
        const status = await get();
        const t = now();
        if (status === 200 && t >= warmEnd && t <= end) count++;
      } catch {
        errors++;
        await sleep(5);
      }
    }
  };
  await Promise.all(Array.from({ length: CONFIG.connections }, worker));
  agent.destroy();
  return { rate: count / (CONFIG.measureMs / 1000), errors };
}

// ---------------------------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------------------------

let loadBefore = [0, 0, 0];
let upstreamPid = 0;
let upstreamPort = 0;
let upstreamChild = null;
let upstreamHost = '';
let daemon = null;
let daemonContext = null;

async function main() {
  const started = now();
  loadBefore = loadavg();
  const hardStop = setTimeout(() => {
    console.error(`[bench] hard deadline of ${CONFIG.deadlineMs / 1000} s reached: giving up`);
    procs.shuttingDown = true;
    procs.cleanup();
    process.exit(3);
  }, CONFIG.deadlineMs + (PROFILE ? 60_000 : 0));

  console.log(`# mitm-replay proxy bench — ${new Date().toISOString()}`);
  console.log(`node ${process.version}, ${cpus().length} CPUs (${cpus()[0]?.model ?? '?'}), rounds ${CONFIG.rounds}${QUICK ? ' (quick)' : ''}`);

  const ca = createBenchCa(['127.0.0.1', 'localhost', '*.bench.test']);
  const upstream = await procs.startUpstream({ certPem: ca.certPem, keyPem: ca.keyPem });
  upstreamPid = upstream.child.pid;
  upstreamChild = upstream.child;
  upstreamHost = `127.0.0.1:${upstream.port}`;
  upstreamPort = upstream.port;
  daemon = await procs.startDaemon({ home: procs.tempDir('mitm-replay-bench-home-'), upstreamPort: upstream.port, upstreamCaPem: ca.caCertPem });
  daemonContext = createSecureContext({ ca: daemon.caPem });
  let mitm = null;
  if (MITMDUMP) {
    try {
      mitm = await startMitmdump(MITMDUMP);
    } catch (err) {
      console.error(`[bench] mitmdump unavailable: ${err.message}`);
    }
  }
  console.log(`upstream :${upstream.port} (pid ${upstream.child.pid}), mitm-replay :${daemon.port} (pid ${daemon.child.pid})${mitm ? `, mitmdump :${mitm.port} (pid ${mitm.child.pid}, ${MITMDUMP})` : ', no mitmdump'}`);

  const target = { host: '127.0.0.1', port: upstream.port };
  const upstreamContext = createSecureContext({ ca: ca.caCertPem });
  const modes = [
    { name: 'direct', secureContext: upstreamContext, open: () => openTls({ proxyPort: null, ...target, secureContext: upstreamContext }) },
    { name: 'mitm-replay', pid: daemon.child.pid, proxyPort: daemon.port, secureContext: daemonContext, open: () => openTls({ proxyPort: daemon.port, ...target, secureContext: daemonContext }) },
  ];
  if (mitm) {
    const mitmContext = createSecureContext({ ca: mitm.caPem });
    modes.push({ name: 'mitmdump', pid: mitm.child.pid, proxyPort: mitm.port, secureContext: mitmContext, open: () => openTls({ proxyPort: mitm.port, ...target, secureContext: mitmContext }) });
  }

  // Sanity + warm-up: one request each way (mints 127.0.0.1's leaf in the proxies, fills pools).
  for (const mode of modes) {
    const conn = new Conn(await mode.open());
    const r = await conn.request('/echo', { host: upstreamHost });
    conn.close();
    if (r.status !== 200) throw new Error(`${mode.name}: GET /echo answered ${r.status}`);
  }

  await rpc(daemon.child, 'eld-start');
  await sleep(1000);
  const idleEld = await rpc(daemon.child, 'eld-stop');

  const results = Object.fromEntries(modes.map((m) => [m.name, { keepAlive: [], fresh: [], sse: [], large: [], cpuKeepAlive: [], cpuFresh: [], upstreamKeepAlive: [], upstreamFresh: [], usPerReqKeepAlive: [], usPerReqFresh: [], errors: [] }]));
  const mint = { pure: [], cached: [], paced: [], withRequest: [] };
  const ssePerRound = (round) => Math.floor(CONFIG.sseSamples / CONFIG.rounds) + (round < CONFIG.sseSamples % CONFIG.rounds ? 1 : 0);

  for (let round = 0; round < CONFIG.rounds; round++) {
    const order = modes.map((_, i) => modes[(i + round) % modes.length]); // rotate, so no mode always goes first
    const log = (s) => process.stdout.write(s);
    log(`\nround ${round + 1}/${CONFIG.rounds} (${order.map((m) => m.name).join(', ')})\n`);
    for (const [label, fresh] of [
      ['keep-alive req/s', false],
      ['new conn/s', true],
    ]) {
      log(`  ${label.padEnd(18)}`);
      for (const mode of order) {
        const r = await loadPhase(mode, fresh);
        const bucket = results[mode.name];
        (fresh ? bucket.fresh : bucket.keepAlive).push(r.rate);
        (fresh ? bucket.cpuFresh : bucket.cpuKeepAlive).push(r.cpu);
        (fresh ? bucket.upstreamFresh : bucket.upstreamKeepAlive).push(r.upstream);
        (fresh ? bucket.usPerReqFresh : bucket.usPerReqKeepAlive).push(r.proxyCpuUsPerReq);
        if (r.errors) bucket.errors.push(`${label}: ${r.errors} errors (${r.lastError})`);
        log(`  ${mode.name} ${fmt(r.rate)}${r.errors ? ` (${r.errors} err)` : ''}`);
      }
      log('\n');
    }
    log(`  ${'SSE TTFB p50 ms'.padEnd(18)}`);
    for (const mode of order) {
      const samples = await ssePhase(mode, ssePerRound(round));
      results[mode.name].sse.push(...samples);
      log(`  ${mode.name} ${fmt(median(samples), 2)}`);
    }
    log(`\n  ${'large MiB/s'.padEnd(18)}`);
    for (const mode of order) {
      const rates = await largePhase(mode);
      results[mode.name].large.push(...rates);
      log(`  ${mode.name} ${rates.map((r) => fmt(r)).join('/')}`);
    }
    const suffix = round === 0 ? '' : `-r${round + 1}`;
    const hosts = (prefix) => Array.from({ length: CONFIG.mintHosts }, (_, i) => `${prefix}${i + 1}${suffix}.bench.test`);
    const mintNames = hosts('h');
    const pure = await mintPhase(mintNames);
    const cached = await mintPhase(mintNames); // the same 100 hosts again: handshakes without minting
    const paced = await mintPhase(hosts('s'), { gapMs: 5 });
    const withRequest = await mintPhase(hosts('g'), { withRequest: true });
    mint.pure.push(pure);
    mint.cached.push(cached);
    mint.paced.push(paced);
    mint.withRequest.push(withRequest);
    const mintLine = (label, m) =>
      `\n  ${label.padEnd(34)} ELD p99 ${fmt(m.eldP99, 2)} ms, max ${fmt(m.eldMax, 2)} ms, ${fmt(m.wallMs)} ms wall${m.failures ? `, ${m.failures} FAILED (${m.firstFailure})` : ''}`;
    log(mintLine('100 new hosts at once', pure));
    log(mintLine('same 100 hosts again (cached)', cached));
    log(mintLine('100 new hosts, one per 5 ms', paced));
    log(`${mintLine('100 new hosts at once + GET each', withRequest)}\n`);
  }

  // ---- reference: the same keep-alive load with node:https as the client (one round)
  const nodeClient = {};
  process.stdout.write(`\nreference, keep-alive req/s with node:https as the client:`);
  for (const mode of modes) {
    nodeClient[mode.name] = await nodeClientPhase(mode);
    process.stdout.write(`  ${mode.name} ${fmt(nodeClient[mode.name].rate)}${nodeClient[mode.name].errors ? ` (${nodeClient[mode.name].errors} err)` : ''}`);
  }
  process.stdout.write('\n');

  // ---- profiles (optional): the daemon only, one phase at a time
  const profiles = [];
  if (PROFILE) {
    const dir = join(here, 'profiles');
    mkdirSync(dir, { recursive: true });
    const mode = modes.find((m) => m.name === 'mitm-replay');
    const phases = [
      ['keep-alive', () => loadPhase(mode, false)],
      ['new-connections', () => loadPhase(mode, true)],
      ['sse', () => ssePhase(mode, 50)],
      ['large', () => largePhase(mode)],
      ['mint', () => mintPhase(Array.from({ length: CONFIG.mintHosts }, (_, i) => `p${i + 1}.bench.test`))],
      ['handshakes-cached', () => mintPhase(Array.from({ length: CONFIG.mintHosts }, (_, i) => `p${i + 1}.bench.test`))],
      ['mint-and-get', () => mintPhase(Array.from({ length: CONFIG.mintHosts }, (_, i) => `q${i + 1}.bench.test`), { withRequest: true })],
    ];
    for (const [name, run] of phases) {
      const file = join(dir, `${name}.cpuprofile`);
      await rpc(daemon.child, 'profile-start');
      const t0 = now();
      const outcome = await run();
      const ms = now() - t0;
      await rpc(daemon.child, 'profile-stop', { file });
      const detail = outcome?.rate !== undefined ? `${fmt(outcome.rate)}/s${outcome.errors ? `, ${outcome.errors} errors (${outcome.lastError})` : ''}` : '';
      console.log(`  profiled ${name}: ${fmt(ms)} ms ${detail}`);
      profiles.push({ name, file, summary: summarizeProfile(JSON.parse(readFileSync(file, 'utf8')), 15) });
    }
  }

  // ---- report
  const direct = results.direct;
  const rows = [];
  const ratio = (a, b) => (b > 0 ? a / b : NaN);
  const line = (metric, pick, digits, target) => {
    const d = pick(direct);
    const cells = [metric, fmt(d, digits)];
    for (const name of ['mitm-replay', 'mitmdump']) {
      if (!results[name]) {
        cells.push('—', '—');
        continue;
      }
      const v = pick(results[name]);
      cells.push(fmt(v, digits), `${fmt(ratio(v, d), 2)}×`);
    }
    cells.push(target ?? '');
    rows.push(cells);
  };
  line('keep-alive GET /echo, req/s (8 conns)', (r) => median(r.keepAlive), 0, '≥ 0.5× direct');
  {
    const d = nodeClient.direct?.rate;
    const cells = ['… same with node:https as the client (reference, 1 round)', fmt(d)];
    for (const name of ['mitm-replay', 'mitmdump']) {
      const v = nodeClient[name]?.rate;
      cells.push(fmt(v), v === undefined ? '—' : `${fmt(ratio(v, d), 2)}×`);
    }
    cells.push('');
    rows.push(cells);
  }
  line('new CONNECT+TLS conns/s (8 concurrent)', (r) => median(r.fresh), 0, '≥ 0.5× direct');
  line('large body GET /large?mb=20, MiB/s', (r) => median(r.large), 0, '');
  const sse = (name, p) => (results[name] ? percentile(results[name].sse, p) : NaN);
  const sseRow = (p) => {
    const d = sse('direct', p);
    const cells = [`SSE time to first byte p${p}, ms`, fmt(d, 2)];
    for (const name of ['mitm-replay', 'mitmdump']) {
      const v = sse(name, p);
      cells.push(fmt(v, 2), results[name] ? `+${fmt(v - d, 2)} ms` : '—');
    }
    cells.push(p === 50 ? 'overhead ≤ 1 ms' : '');
    rows.push(cells);
  };
  sseRow(50);
  sseRow(99);
  const eldOf = (list) => ({ p99: median(list.map((m) => m.eldP99)), max: Math.max(...list.map((m) => m.eldMax)) });
  const mintRow = (label, list, target) => {
    const e = eldOf(list);
    rows.push([label, '—', `${fmt(e.p99, 2)} / ${fmt(e.max, 2)}`, '', '—', '', target]);
    return e;
  };
  const mintPure = mintRow('daemon event-loop delay p99 / max ms: 100 new hosts, CONNECT+TLS all at once', mint.pure, 'p99 ≤ 5 ms');
  mintRow('… the same 100 hosts again (leaves cached: handshakes only)', mint.cached, '');
  mintRow('… 100 new hosts, one every 5 ms', mint.paced, '');
  mintRow('… 100 new hosts at once + one GET each (upstream dials)', mint.withRequest, '');
  const mintP99 = mintPure.p99;
  rows.push(['daemon event-loop delay idle, p99 / max ms', '—', `${fmt(idleEld.p99, 2)} / ${fmt(idleEld.max, 2)}`, '', '—', '', '']);

  const header = ['metric', 'direct', 'mitm-replay', 'ratio', 'mitmdump', 'ratio', 'target'];
  const table = [`| ${header.join(' | ')} |`, `|${header.map((_, i) => (i === 0 ? ':---' : '---:')).join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');

  const mr = results['mitm-replay'];
  const sseOverhead = sse('mitm-replay', 50) - sse('direct', 50);
  const targets = [
    ['keep-alive req/s ≥ 0.5× direct', ratio(median(mr.keepAlive), median(direct.keepAlive)) >= 0.5, `${fmt(ratio(median(mr.keepAlive), median(direct.keepAlive)), 2)}×`],
    ['new connections/s ≥ 0.5× direct', ratio(median(mr.fresh), median(direct.fresh)) >= 0.5, `${fmt(ratio(median(mr.fresh), median(direct.fresh)), 2)}×`],
    ['SSE TTFB p50 overhead ≤ 1 ms', sseOverhead <= 1, `+${fmt(sseOverhead, 2)} ms`],
    ['event-loop delay p99 ≤ 5 ms while minting 100 hosts', mintP99 <= 5, `${fmt(mintP99, 2)} ms`],
  ];

  const upstreamLine = (list) => {
    const c = list.reduce((n, u) => n + u.connections, 0);
    const q = list.reduce((n, u) => n + u.requests, 0);
    const resumed = list.reduce((n, u) => n + u.resumed, 0);
    return `upstream TLS conns ${fmt(c)} for ${fmt(q)} requests (${fmt(resumed)} resumed)`;
  };
  const cpuLine = (name, key, usKey) => {
    const r = results[name];
    if (!r) return null;
    const procs = ['bench', 'upstream', 'proxy', 'other'];
    const parts = procs
      .filter((p) => r[key][0]?.[p] !== undefined)
      .map((p) => `${p === 'proxy' ? name : p === 'other' ? 'rest of machine' : p} ${fmt(median(r[key].map((c) => c[p])))}%`);
    const us = median(r[usKey].filter((x) => x !== undefined));
    const upstreamKey = key === 'cpuKeepAlive' ? 'upstreamKeepAlive' : 'upstreamFresh';
    return `  ${name.padEnd(12)} ${parts.join(', ')}${Number.isFinite(us) ? `; proxy CPU ${fmt(us)} µs/request` : ''}; ${upstreamLine(r[upstreamKey])}`;
  };

  console.log(`\n## Results (median of ${CONFIG.rounds} round${CONFIG.rounds > 1 ? 's' : ''}; SSE: ${CONFIG.sseSamples} samples pooled; large: ${CONFIG.rounds * CONFIG.largeReps} fetches)\n`);
  console.log(table);
  console.log('\n## Targets (mitm-replay while recording)\n');
  for (const [what, met, value] of targets) console.log(`- ${met ? 'MET   ' : 'MISSED'} ${what}: ${value}`);
  const foreign = Math.max(...modes.flatMap((m) => [...results[m.name].cpuKeepAlive, ...results[m.name].cpuFresh].map((c) => c.other ?? 0)));
  const loadNote = `CPU used by processes outside the bench during the load phases: up to ${fmt(foreign)}% of a core`;
  console.log(`\n${foreign > 15 ? `WARNING: the machine was busy with other work (${loadNote}): figures are noisy; rerun on a quiet machine.` : `Quiet machine: ${loadNote}.`}`);
  console.log('\n## CPU use per process during the load phases (% of one core; 2 cores = 200%)\n');
  console.log('keep-alive:');
  for (const m of modes) console.log(cpuLine(m.name, 'cpuKeepAlive', 'usPerReqKeepAlive'));
  console.log('new connections:');
  for (const m of modes) console.log(cpuLine(m.name, 'cpuFresh', 'usPerReqFresh'));
  console.log('\n## Per round\n');
  for (const m of modes) {
    const r = results[m.name];
    console.log(`  ${m.name.padEnd(12)} keep-alive ${r.keepAlive.map((x) => fmt(x)).join(' / ')}; new conns ${r.fresh.map((x) => fmt(x)).join(' / ')}; large ${r.large.map((x) => fmt(x)).join(' / ')} MiB/s${r.errors.length ? `; errors: ${r.errors.join('; ')}` : ''}`);
  }
  const mintDetail = (label, list) =>
    console.log(`  ${label.padEnd(24)} ELD p99 ${list.map((m) => fmt(m.eldP99, 2)).join(' / ')} ms, max ${list.map((m) => fmt(m.eldMax, 2)).join(' / ')} ms, wall ${list.map((m) => fmt(m.wallMs)).join(' / ')} ms, handshake p50 ${list.map((m) => fmt(m.handshakeP50)).join(' / ')} ms`);
  mintDetail('mint, all at once', mint.pure);
  mintDetail('same hosts (cached)', mint.cached);
  mintDetail('mint, one per 5 ms', mint.paced);
  mintDetail('mint at once + GET', mint.withRequest);
  const failures = [...mint.pure, ...mint.cached, ...mint.paced, ...mint.withRequest].reduce((n, m) => n + m.failures, 0);
  if (failures) console.log(`  mint failures: ${failures}`);

  for (const p of profiles) console.log(`\n${formatSummary(`daemon profile, ${p.name} (${p.file.replace(`${here}/`, 'bench/')})`, p.summary)}`);

  const json = {
    date: new Date().toISOString(),
    node: process.version,
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model,
    config: CONFIG,
    mitmdump: mitm ? MITMDUMP : null,
    results,
    nodeClient,
    mint,
    idleEld,
    loadBefore,
    foreignCpuMax: foreign,
    targets: targets.map(([what, met, value]) => ({ what, met, value })),
    profiles: profiles.map((p) => ({ name: p.name, file: p.file, summary: p.summary })),
  };
  writeFileSync(join(here, QUICK ? 'latest-quick.json' : 'latest.json'), `${JSON.stringify(json, null, 2)}\n`);
  console.log(`\ntotal ${fmt((now() - started) / 1000, 1)} s; raw figures in bench/${QUICK ? 'latest-quick.json' : 'latest.json'}`);

  // ---- shutdown
  procs.shuttingDown = true;
  await rpc(daemon.child, 'stop', {}, 15_000).catch(() => undefined);
  if (mitm) mitm.child.kill('SIGTERM');
  upstream.child.disconnect();
  await sleep(200);
  clearTimeout(hardStop);
  procs.cleanup();
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(`[bench] failed: ${err.stack ?? err}`);
    procs.shuttingDown = true;
    procs.cleanup();
    process.exit(1);
  },
);
