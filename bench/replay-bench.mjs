#!/usr/bin/env node
/**
 * Replay serve speed, side by side with the upstream reached directly and with recording, in one run.
 *
 *   npm run build && node bench/replay-bench.mjs             full run (3 rounds, < 3 minutes)
 *   node bench/replay-bench.mjs --quick                        1 short round, 20 replays (smoke test)
 *   node bench/replay-bench.mjs --profile                      always profile the daemon (default: only when a
 *                                                              target is missed); --no-profile never
 *   node bench/replay-bench.mjs --json FILE                    also write the raw figures to FILE
 *
 * Part 1, keep-alive: GET /echo over 8 concurrent keep-alive connections (CONNECT + TLS through the daemon, or
 * TLS straight to the upstream), warm-up then a timed window; requests/s and per-request latency. Replay serves
 * a trace recorded beforehand in bulk (identical requests are served in recorded order, each recording once),
 * and each worker takes a ticket per request so replay never asks more than was recorded: no refusal is
 * measured, and every status is counted. Latency is also measured unloaded (1 connection, one request at a
 * time): "added at p50" is replay p50 − direct p50 there.
 * Part 2, agent runs: a 6-exchange agent-like run (bench/replay-agent.mjs: SSE chat completion, tool GETs,
 * JSON completion, embeddings) recorded once, then replayed 100 times, each time: open a replay session over
 * the control API, run the 6 requests with a fresh client (new CONNECT tunnels + TLS), end the session and
 * check the verdict line ends with PASS and the bodies equal the recorded ones. Compared with live (recording)
 * runs and direct runs of the same 6 requests, and with replays driven by a spawned `node` script per run.
 *
 * Processes: upstream and daemon each in a child of their own, the load generator here (2-core machines:
 * nothing shares an event loop with the client). Loopback only; every loop is bounded in count and time.
 * CPU of every other process on the machine is measured per window (/proc/stat minus ours): before a window the
 * run waits for quiet (≤ 50 s in total), a disturbed window is measured once more, and what stays disturbed is
 * flagged in the output. On a shared machine (another benchmark or test suite running) the ratios mean little.
 */
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import { createSecureContext } from 'node:tls';
import { fileURLToPath } from 'node:url';
import { createBenchCa } from './ca.mjs';
import { Conn, basicAuth, now, openTls } from './client.mjs';
import { ControlClient } from './control-client.mjs';
import { BenchProcesses, cpuPercent, cpuSnapshot, fmt, median, percentile, rpc, rssMb, sleep } from './harness.mjs';
import { formatSummary, summarizeProfile } from './profile-summary.mjs';
import { AGENT_STEPS, runAgent } from './replay-agent.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const QUICK = args.includes('--quick');
const PROFILE = args.includes('--profile') ? 'always' : args.includes('--no-profile') ? 'never' : 'on-miss';
const JSON_FILE = args.includes('--json') ? args[args.indexOf('--json') + 1] : null;

const CONFIG = {
  rounds: QUICK ? 1 : 3,
  connections: 8,
  warmMs: QUICK ? 200 : 500,
  measureMs: QUICK ? 1000 : 2000,
  bulkTarget: QUICK ? 20_000 : 90_000, // recordings of GET /echo for the keep-alive replay phases
  bulkMaxMs: QUICK ? 6_000 : 20_000,
  bulkConnections: 16,
  serialWarm: 100,
  serialCount: QUICK ? 300 : 1000,
  replays: QUICK ? 20 : 100,
  warmReplays: 3,
  liveRuns: QUICK ? 5 : 20,
  directRuns: QUICK ? 5 : 20,
  spawnRuns: QUICK ? 3 : 10,
  streamGapMs: 5, // upstream pause between SSE frames (live runs only; replay --pace fast ignores it)
  deadlineMs: 175_000,
};

const KA_HOST = 'api.bench.test';
const INTERCEPT = [KA_HOST, 'api.openai.com', 'tools.example.test'];
const KA_REQUEST = Buffer.from(`GET /echo HTTP/1.1\r\nHost: ${KA_HOST}\r\nUser-Agent: mitm-replay-replay-bench\r\nAccept: */*\r\n\r\n`, 'latin1');

const log = (s) => process.stdout.write(s);

// Child processes and temp dirs: killed / removed whatever happens (harness.mjs)
const procs = new BenchProcesses('[replay-bench]');

/** Other processes above this share of one core during a window make its figures suspect. */
const OTHER_LIMIT = 20;
/** How long the whole run may wait, in total, for other processes to go quiet before a window. */
const QUIET_BUDGET_MS = QUICK ? 10_000 : 50_000;
let quietBudgetMs = QUIET_BUDGET_MS;

/** Waits (within the run's budget) until other processes use < OTHER_LIMIT % of a core over 300 ms. */
async function waitQuiet(pids) {
  let announced = false;
  while (quietBudgetMs > 0) {
    const a = cpuSnapshot(pids);
    await sleep(300);
    const b = cpuSnapshot(pids);
    const ours = Object.keys(pids).reduce((n, k) => n + (b.cpu[k] - a.cpu[k]), 0);
    const other = (100 * (b.machine - a.machine - ours)) / ((b.at - a.at) / 1000);
    if (!(other > OTHER_LIMIT)) return;
    quietBudgetMs -= b.at - a.at;
    if (!announced) log(`  (waiting for other processes to go quiet: ${fmt(other)}% of a core)\n`);
    announced = true;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Keep-alive phases
// ---------------------------------------------------------------------------------------------------------------

/**
 * `connections` workers send GET /echo on keep-alive connections for warmMs + measureMs, or until `budget`
 * requests were issued (replay: never more than recorded). Rate and latency count 200s that ended in the window;
 * the window ends early when the budget runs out.
 */
async function loadPhase(open, { budget = Infinity, connections = CONFIG.connections, warmMs = CONFIG.warmMs, measureMs = CONFIG.measureMs, pids = {} } = {}) {
  const t0 = now();
  const warmEnd = t0 + warmMs;
  const end = warmEnd + measureMs;
  let issued = 0;
  let exhaustedAt = null;
  let lastEnd = 0;
  let count = 0;
  const latencies = [];
  const statuses = {};
  let errors = 0;
  let lastError = '';
  let cpuStart = null;
  const timer = setTimeout(() => (cpuStart = cpuSnapshot(pids)), Math.max(0, warmMs));
  const worker = async () => {
    let conn = null;
    while (now() < end) {
      if (issued >= budget) {
        exhaustedAt ??= now();
        break;
      }
      issued++;
      try {
        if (!conn || conn.closed) conn = new Conn(await open());
        const r = await conn.send(KA_REQUEST);
        statuses[r.status] = (statuses[r.status] ?? 0) + 1;
        if (r.end > lastEnd) lastEnd = r.end;
        if (r.status === 200 && r.end >= warmEnd && r.end <= end) {
          count++;
          latencies.push(r.end - r.start);
        }
        if (r.closes) {
          conn.close();
          conn = null;
        }
      } catch (err) {
        errors++;
        lastError = err.message;
        conn?.close();
        conn = null;
        await sleep(5);
      }
    }
    conn?.close();
  };
  await Promise.all(Array.from({ length: connections }, worker));
  clearTimeout(timer);
  const cpuEnd = cpuSnapshot(pids);
  const windowEnd = exhaustedAt !== null ? Math.min(end, lastEnd) : end;
  const windowMs = windowEnd - warmEnd;
  const cpuUs = {};
  if (cpuStart) for (const k of Object.keys(pids)) cpuUs[k] = count > 0 ? ((cpuEnd.cpu[k] - cpuStart.cpu[k]) * 1e6) / count : NaN;
  // other: everything else on the machine (another benchmark, a build): should be near 0 for clean figures
  const cpuPct = cpuStart ? cpuPercent(cpuStart, cpuEnd) : {};
  return {
    rate: windowMs > 0 ? count / (windowMs / 1000) : NaN,
    count,
    issued,
    windowMs,
    exhausted: exhaustedAt !== null && exhaustedAt < end,
    p50: percentile(latencies, 50),
    p90: percentile(latencies, 90),
    p99: percentile(latencies, 99),
    statuses,
    errors,
    lastError,
    cpuUs,
    cpuPct,
    daemonRssMb: pids.daemon ? rssMb(pids.daemon) : NaN,
  };
}

/** One connection, one request at a time: unloaded latency. */
function serialPhase(open, budget = Infinity) {
  const total = Math.min(budget, CONFIG.serialWarm + CONFIG.serialCount);
  return (async () => {
    const conn = new Conn(await open());
    const latencies = [];
    const statuses = {};
    const deadline = now() + 15_000;
    try {
      for (let i = 0; i < total && now() < deadline; i++) {
        const r = await conn.send(KA_REQUEST);
        statuses[r.status] = (statuses[r.status] ?? 0) + 1;
        if (i >= CONFIG.serialWarm && r.status === 200) latencies.push(r.end - r.start);
      }
    } finally {
      conn.close();
    }
    return { p50: percentile(latencies, 50), p90: percentile(latencies, 90), p99: percentile(latencies, 99), count: latencies.length, statuses };
  })();
}

const statusText = (statuses) =>
  Object.entries(statuses)
    .map(([s, n]) => `${s}×${n}`)
    .join(' ');

// ---------------------------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------------------------

async function main() {
  const started = now();
  const hardStop = setTimeout(() => {
    console.error(`[replay-bench] hard deadline of ${CONFIG.deadlineMs / 1000} s reached: giving up`);
    procs.shuttingDown = true;
    procs.cleanup();
    process.exit(3);
  }, CONFIG.deadlineMs);

  console.log(`# mitm-replay replay bench — ${new Date().toISOString()}`);
  console.log(`node ${process.version}, ${cpus().length} CPUs (${cpus()[0]?.model ?? '?'}), rounds ${CONFIG.rounds}${QUICK ? ' (quick)' : ''}`);

  // ---- processes
  const ca = createBenchCa([...INTERCEPT, '127.0.0.1']);
  const { child: upstreamChild, port: upstreamPort } = await procs.startUpstream({ certPem: ca.certPem, keyPem: ca.keyPem, streamGapMs: CONFIG.streamGapMs });
  const home = procs.tempDir('mitm-replay-replay-bench-home-');
  // --expose-gc: for the 'memory' message only (heap after a forced GC)
  const daemon = await procs.startDaemon({ home, intercept: INTERCEPT, upstreamPort, upstreamCaPem: ca.caCertPem, logLevel: 'silent', execArgv: ['--expose-gc'] });
  const daemonChild = daemon.child;
  const control = new ControlClient(daemon.port, daemon.token);
  const pids = { bench: process.pid, upstream: upstreamChild.pid, daemon: daemonChild.pid };
  console.log(`upstream 127.0.0.1:${upstreamPort} (pid ${upstreamChild.pid}), daemon 127.0.0.1:${daemon.port} (pid ${daemonChild.pid}), home ${home}`);

  const upstreamCtx = createSecureContext({ ca: ca.caCertPem });
  const daemonCtx = createSecureContext({ ca: daemon.caPem });
  const origin = { host: KA_HOST, port: 443, servername: KA_HOST };
  const directOpen = () => openTls({ ...origin, directPort: upstreamPort, secureContext: upstreamCtx });
  const proxyOpen = (session) => {
    const proxyAuthorization = basicAuth(session.id, session.token);
    return () => openTls({ ...origin, proxyPort: daemon.port, secureContext: daemonCtx, proxyAuthorization });
  };

  // ---- bulk recordings for the replay phases (not measured)
  log(`\nrecording the keep-alive traces (≤ ${fmt(CONFIG.bulkTarget)} requests or ${CONFIG.bulkMaxMs / 1000} s) … `);
  await waitQuiet(pids);
  let t = now();
  const bulkSession = await control.createSession({ trace: 'ka-bulk' });
  const bulk = await loadPhase(proxyOpen(bulkSession), { budget: CONFIG.bulkTarget, connections: CONFIG.bulkConnections, warmMs: 0, measureMs: CONFIG.bulkMaxMs });
  const bulkEnd = await control.endSession(bulkSession.id);
  const bulkRecorded = bulkEnd.summary.complete;
  if (bulk.statuses[200] !== bulk.issued || bulkRecorded !== bulk.issued) throw new Error(`bulk recording: issued ${bulk.issued}, statuses ${statusText(bulk.statuses)}, stored complete ${bulkRecorded}, ${bulk.errors} errors (${bulk.lastError})`);
  const latSession = await control.createSession({ trace: 'lat-bulk' });
  const latBulk = await serialPhase(proxyOpen(latSession));
  const latEnd = await control.endSession(latSession.id);
  const latRecorded = latEnd.summary.complete;
  log(`${fmt(bulkRecorded)} + ${fmt(latRecorded)} exchanges in ${fmt((now() - t) / 1000, 1)} s (${fmt(bulk.rate)} req/s while recording)\n`);
  if (latRecorded < CONFIG.serialWarm + CONFIG.serialCount) throw new Error(`serial trace has only ${latRecorded} recordings (${statusText(latBulk.statuses)})`);

  const memoryBefore = await rpc(daemonChild, 'memory');
  // ---- part 1: keep-alive rounds
  /** One mode's keep-alive window and serial latency, with its own sessions (record: new traces; replay: the bulk ones). */
  const measureMode = async (mode, round, attempt) => {
    let open = directOpen;
    let session = null;
    let budget = Infinity;
    let serialSession = null;
    const suffix = `r${round + 1}${attempt > 1 ? `-a${attempt}` : ''}`;
    if (mode === 'record') {
      session = await control.createSession({ trace: `ka-rec-${suffix}` });
      serialSession = await control.createSession({ trace: `lat-rec-${suffix}` });
    } else if (mode === 'replay') {
      const t0 = now();
      session = await control.createSession({ mode: 'replay', trace: 'ka-bulk', pace: 'fast' });
      sessionLoadMs.push(now() - t0);
      serialSession = await control.createSession({ mode: 'replay', trace: 'lat-bulk', pace: 'fast' });
      budget = bulkRecorded;
    }
    if (session) open = proxyOpen(session);
    await waitQuiet(pids);
    const load = await loadPhase(open, { budget, pids });
    const serial = await serialPhase(serialSession ? proxyOpen(serialSession) : directOpen, mode === 'replay' ? latRecorded : Infinity);
    for (const s of [session, serialSession]) {
      if (!s) continue;
      const ended = await control.endSession(s.id);
      if (ended.mode === 'replay') {
        const v = ended.report.verdict;
        // these runs leave recordings unused on purpose (FAIL for unused); none may be refused
        if (v.missing || v.diverged || v.exact !== v.requests) problems.push(`round ${round + 1} replay ${s.trace}: ${ended.report.line}`);
      }
    }
    const non200 = Object.entries(load.statuses).filter(([s]) => s !== '200');
    if (non200.length || load.errors) problems.push(`round ${round + 1} ${mode}: statuses ${statusText(load.statuses)}, ${load.errors} errors ${load.lastError}`);
    if (mode === 'replay' && load.exhausted) problems.push(`round ${round + 1} replay: the ${fmt(bulkRecorded)} recordings ran out after ${fmt(load.windowMs)} ms of the ${CONFIG.measureMs} ms window (rate measured over that shorter window)`);
    return { load, serial };
  };
  const modes = ['direct', 'record', 'replay'];
  const ka = Object.fromEntries(modes.map((m) => [m, { load: [], serial: [] }]));
  const sessionLoadMs = [];
  const problems = [];
  for (let round = 0; round < CONFIG.rounds; round++) {
    const order = modes.map((_, i) => modes[(i + round) % modes.length]);
    log(`\nround ${round + 1}/${CONFIG.rounds} (${order.join(', ')})\n`);
    for (const mode of order) {
      let attempt = 1;
      let result = await measureMode(mode, round, attempt);
      // A window disturbed by other processes (another benchmark, a build) is measured again once, after waiting
      // for the machine to be quiet, while the run's waiting budget lasts; what is kept is flagged either way.
      while (result.load.cpuPct.other > OTHER_LIMIT && attempt < 2 && quietBudgetMs > 0) {
        log(`  ${mode.padEnd(7)} disturbed (other processes ${fmt(result.load.cpuPct.other)}% CPU): measuring again\n`);
        attempt++;
        result = await measureMode(mode, round, attempt);
      }
      const { load, serial } = result;
      ka[mode].load.push(load);
      ka[mode].serial.push(serial);
      if (load.cpuPct.other > OTHER_LIMIT) problems.push(`round ${round + 1} ${mode}: other processes used ${fmt(load.cpuPct.other)}% CPU during the window (figures disturbed)`);
      log(`  ${mode.padEnd(7)} ${fmt(load.rate).padStart(7)} req/s  load p50 ${fmt(load.p50, 2)} ms  serial p50 ${fmt(serial.p50, 3)} ms p99 ${fmt(serial.p99, 3)} ms  ${mode === 'direct' ? `upstream CPU ${fmt(load.cpuUs.upstream)}` : `daemon CPU ${fmt(load.cpuUs.daemon)}`} µs/req  other procs ${fmt(load.cpuPct.other)}% CPU  [${statusText(load.statuses)}]\n`);
    }
  }

  const memoryAfter = await rpc(daemonChild, 'memory');
  // ---- part 2: 6-exchange agent runs
  log(`\nagent runs (${AGENT_STEPS.length} exchanges each)\n`);
  const daemonCaFile = join(procs.tempDir('mitm-replay-replay-bench-ca-'), 'ca.pem');
  writeFileSync(daemonCaFile, daemon.caPem);
  const direct0 = await runAgent({ directPort: upstreamPort, ca: ca.caCertPem });
  const recSession = await control.createSession({ trace: 'agent-run' });
  const recorded = await runAgent({ proxyPort: daemon.port, proxyAuthorization: basicAuth(recSession.id, recSession.token), ca: daemon.caPem });
  const recEnd = await control.endSession(recSession.id);
  if (recEnd.summary.complete !== AGENT_STEPS.length || recorded.statuses.some((s) => s !== 200)) throw new Error(`agent recording: statuses ${recorded.statuses}, summary ${JSON.stringify(recEnd.summary)}`);
  if (recorded.digest !== direct0.digest) throw new Error('the recorded run saw other bodies than a direct run');
  const reference = recorded.digest;

  const replayOnce = async () => {
    const t0 = now();
    const session = await control.createSession({ mode: 'replay', trace: 'agent-run', pace: 'fast' });
    const t1 = now();
    const run = await runAgent({ proxyPort: daemon.port, proxyAuthorization: basicAuth(session.id, session.token), ca: daemon.caPem });
    const t2 = now();
    const ended = await control.endSession(session.id);
    const t3 = now();
    const ok = ended.report.line.endsWith('PASS') && run.digest === reference && run.statuses.every((s) => s === 200);
    return { total: t3 - t0, open: t1 - t0, requests: t2 - t1, end: t3 - t2, ok, line: ended.report.line };
  };
  await waitQuiet(pids);
  for (let i = 0; i < CONFIG.warmReplays; i++) await replayOnce();
  const replays = [];
  const replayDeadline = now() + 40_000;
  for (let i = 0; i < CONFIG.replays && now() < replayDeadline; i++) replays.push(await replayOnce());
  const failedReplays = replays.filter((r) => !r.ok);
  log(`  replay (in-process client) ×${replays.length}: p50 ${fmt(median(replays.map((r) => r.total)), 1)} ms, p95 ${fmt(percentile(replays.map((r) => r.total), 95), 1)} ms, ${replays.length - failedReplays.length} PASS${failedReplays.length ? `, ${failedReplays.length} FAILED (${failedReplays[0].line})` : ''}\n`);

  const lives = [];
  for (let i = 0; i < CONFIG.liveRuns; i++) {
    const t0 = now();
    const session = await control.createSession({ trace: `agent-live-${i + 1}` });
    const run = await runAgent({ proxyPort: daemon.port, proxyAuthorization: basicAuth(session.id, session.token), ca: daemon.caPem });
    const ended = await control.endSession(session.id);
    lives.push({ total: now() - t0, requests: run.ms, ok: run.digest === reference && ended.summary.complete === AGENT_STEPS.length });
  }
  log(`  live recording ×${lives.length}: p50 ${fmt(median(lives.map((r) => r.total)), 1)} ms${lives.some((r) => !r.ok) ? ' (SOME RUNS DIFFERED)' : ''}\n`);

  const directs = [];
  for (let i = 0; i < CONFIG.directRuns; i++) directs.push(await runAgent({ directPort: upstreamPort, ca: ca.caCertPem }));
  log(`  direct ×${directs.length}: p50 ${fmt(median(directs.map((r) => r.ms)), 1)} ms\n`);

  const spawned = [];
  for (let i = 0; i < CONFIG.spawnRuns; i++) {
    const t0 = now();
    const session = await control.createSession({ mode: 'replay', trace: 'agent-run', pace: 'fast' });
    const out = await new Promise((resolve, reject) => {
      const child = procs.track(
        spawn(process.execPath, [join(here, 'replay-agent.mjs')], {
          stdio: ['ignore', 'pipe', 'inherit'],
          env: { ...process.env, BENCH_PROXY_PORT: String(daemon.port), BENCH_PROXY_AUTH: basicAuth(session.id, session.token), BENCH_CA_FILE: daemonCaFile },
        }),
        'agent script',
      );
      const chunks = [];
      child.stdout.on('data', (c) => chunks.push(c));
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      child.once('exit', (code) => {
        clearTimeout(timer);
        if (code === 0) resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
        else reject(new Error(`agent script exited ${code}`));
      });
    });
    const ended = await control.endSession(session.id);
    spawned.push({ total: now() - t0, inScript: out.ms, ok: ended.report.line.endsWith('PASS') && out.digest === reference });
  }
  log(`  replay (spawned node script) ×${spawned.length}: p50 ${fmt(median(spawned.map((r) => r.total)), 1)} ms\n`);

  // ---- report
  const med = (mode, pick) => median(ka[mode].load.map(pick));
  const medSerial = (mode, pick) => median(ka[mode].serial.map(pick));
  const rate = { direct: med('direct', (r) => r.rate), record: med('record', (r) => r.rate), replay: med('replay', (r) => r.rate) };
  const serialP50 = { direct: medSerial('direct', (r) => r.p50), record: medSerial('record', (r) => r.p50), replay: medSerial('replay', (r) => r.p50) };
  const loadP50 = { direct: med('direct', (r) => r.p50), record: med('record', (r) => r.p50), replay: med('replay', (r) => r.p50) };
  const rows = [];
  const row = (metric, pick, digits, diff, target = '') => {
    const d = pick('direct');
    const cell = (m) => {
      const v = pick(m);
      return [fmt(v, digits), diff ? `${v - d >= 0 ? '+' : ''}${fmt(v - d, digits)}` : `${fmt(v / d, 2)}×`];
    };
    rows.push([metric, fmt(d, digits), ...cell('record'), ...cell('replay'), target]);
  };
  row(`keep-alive GET /echo, req/s (${CONFIG.connections} conns)`, (m) => rate[m], 0, false, 'replay ≥ 0.8× direct');
  row('latency under that load, p50 ms', (m) => loadP50[m], 2, true);
  row('latency unloaded (1 conn, serial), p50 ms', (m) => serialP50[m], 3, true, 'replay added ≤ 1 ms');
  row('latency unloaded, p99 ms', (m) => medSerial(m, (r) => r.p99), 3, true);
  rows.push(['server CPU per request, µs (upstream for direct, daemon otherwise)', fmt(med('direct', (r) => r.cpuUs.upstream)), fmt(med('record', (r) => r.cpuUs.daemon)), '', fmt(med('replay', (r) => r.cpuUs.daemon)), '', '']);
  const header = ['metric', 'direct', 'recording', 'vs direct', 'replay', 'vs direct', 'target'];
  const table = (hdr, body) => [`| ${hdr.join(' | ')} |`, `|${hdr.map((_, i) => (i === 0 ? ':---' : '---:')).join('|')}|`, ...body.map((r) => `| ${r.join(' | ')} |`)].join('\n');

  const stat = (xs) => [fmt(median(xs), 1), fmt(percentile(xs, 95), 1), fmt(Math.min(...xs), 1), fmt(Math.max(...xs), 1), String(xs.length)];
  const runRows = [
    ['replay: open session + 6 requests (fresh client) + end, in-process', ...stat(replays.map((r) => r.total))],
    ['  of which: open replay session (POST /sessions)', ...stat(replays.map((r) => r.open))],
    ['  of which: the 6 requests (2 CONNECT + TLS, 6 exchanges)', ...stat(replays.map((r) => r.requests))],
    ['  of which: end session (verdict, report stored)', ...stat(replays.map((r) => r.end))],
    ['replay, spawned `node replay-agent.mjs` per run (open + script + end)', ...stat(spawned.map((r) => r.total))],
    ['live, recording: open + 6 requests + end', ...stat(lives.map((r) => r.total))],
    ['  of which: the 6 requests', ...stat(lives.map((r) => r.requests))],
    ['direct (no proxy): the 6 requests', ...stat(directs.map((r) => r.ms))],
  ];

  const ratio = rate.replay / rate.direct;
  const added = serialP50.replay - serialP50.direct;
  const replayP50 = median(replays.map((r) => r.total));
  const targets = [
    ['replay keep-alive req/s ≥ 0.8× direct', ratio >= 0.8, `${fmt(ratio, 2)}× (${fmt(rate.replay)} vs ${fmt(rate.direct)} req/s)`],
    ['replay adds ≤ 1 ms at p50 (unloaded, serial)', added <= 1, `+${fmt(added, 3)} ms (${fmt(serialP50.replay, 3)} vs ${fmt(serialP50.direct, 3)} ms)`],
    ['per replayed 6-exchange run below the 340 ms seed', replayP50 < 340, `${fmt(replayP50, 1)} ms p50 (${fmt(340 / replayP50, 0)}× faster than the seed)`],
  ];

  console.log(`\n## Keep-alive (median of ${CONFIG.rounds} round${CONFIG.rounds > 1 ? 's' : ''}; ${CONFIG.warmMs} ms warm-up + ${CONFIG.measureMs} ms window; serial: ${CONFIG.serialCount} requests after ${CONFIG.serialWarm})\n`);
  console.log(table(header, rows));
  console.log(`\n## Agent runs (${AGENT_STEPS.length} exchanges; replays --pace fast; upstream SSE gap ${CONFIG.streamGapMs} ms when live)\n`);
  console.log(table(['per run wall time, ms', 'p50', 'p95', 'min', 'max', 'n'], runRows));
  console.log('\n## Targets\n');
  for (const [what, met, value] of targets) console.log(`- ${met ? 'MET   ' : 'MISSED'} ${what}: ${value}`);
  const disturbed = modes.flatMap((m) => ka[m].load.filter((r) => r.cpuPct.other > OTHER_LIMIT));
  if (disturbed.length) console.log(`\nWARNING: other processes took > ${OTHER_LIMIT}% of a core in ${disturbed.length} of ${modes.length * CONFIG.rounds} keep-alive windows (up to ${fmt(Math.max(...disturbed.map((r) => r.cpuPct.other)))}%): the ratios above are not trustworthy; rerun on a quiet machine.`);
  console.log('\n## Details\n');
  for (const m of modes) {
    const l = ka[m].load;
    console.log(`  ${m.padEnd(7)} req/s ${l.map((r) => fmt(r.rate)).join(' / ')}; serial p50 ${ka[m].serial.map((r) => fmt(r.p50, 3)).join(' / ')} ms; CPU % (of one core) ${['bench', 'upstream', 'daemon', 'other'].map((k) => `${k} ${fmt(median(l.map((r) => r.cpuPct[k])))}`).join(', ')}; statuses ${l.map((r) => statusText(r.statuses)).join(' / ')}`);
  }
  console.log(`  daemon RSS after each replay window: ${ka.replay.load.map((r) => fmt(r.daemonRssMb)).join(' / ')} MB; after each recording window: ${ka.record.load.map((r) => fmt(r.daemonRssMb)).join(' / ')} MB`);
  console.log(`  daemon heap after a forced GC, no session open: ${memoryBefore.heapUsedMb} MB before the rounds, ${memoryAfter.heapUsedMb} MB after ${sessionLoadMs.length * 2} replay sessions of ${fmt(bulkRecorded)}/${fmt(latRecorded)} exchanges ended (RSS ${memoryBefore.rssMb} → ${memoryAfter.rssMb} MB, live sessions ${memoryAfter.sessions})`);
  console.log(`  replay session open for the ${fmt(bulkRecorded)}-exchange keep-alive trace: ${sessionLoadMs.map((x) => fmt(x)).join(' / ')} ms (loads every recording)`);
  console.log(`  agent replays: ${replays.length - failedReplays.length}/${replays.length} PASS with bodies identical to the recording; spawned: ${spawned.filter((r) => r.ok).length}/${spawned.length}; live runs identical: ${lives.filter((r) => r.ok).length}/${lives.length}`);
  if (replays[0]) console.log(`  verdict line: ${replays[0].line}`);
  console.log(`  waited ${fmt((QUIET_BUDGET_MS - quietBudgetMs) / 1000, 1)} s in total for other processes to go quiet`);
  for (const p of problems) console.log(`  PROBLEM: ${p}`);

  // ---- profile (when a target is missed, or --profile)
  const profiles = [];
  const missed = targets.slice(0, 2).some(([, met]) => !met);
  if (PROFILE === 'always' || (PROFILE === 'on-miss' && missed)) {
    const dir = procs.tempDir('mitm-replay-replay-bench-prof-', true);
    console.log(`\n## Daemon CPU profiles (V8 sampling profiler, 200 µs; files in ${dir})\n`);
    {
      const session = await control.createSession({ mode: 'replay', trace: 'ka-bulk', pace: 'fast' });
      const file = join(dir, 'replay-keep-alive.cpuprofile');
      await rpc(daemonChild, 'profile-start', { intervalUs: 200 });
      const r = await loadPhase(proxyOpen(session), { budget: bulkRecorded, warmMs: 0, measureMs: 3000 });
      await rpc(daemonChild, 'profile-stop', { file }, 60_000);
      await control.endSession(session.id);
      const summary = summarizeProfile(JSON.parse(readFileSync(file, 'utf8')), 20);
      profiles.push({ name: 'replay-keep-alive', file, summary });
      console.log(formatSummary(`replay keep-alive, ${fmt(r.count)} requests at ${fmt(r.rate)} req/s (profiler on)`, summary));
    }
    {
      const file = join(dir, 'agent-replays.cpuprofile');
      await rpc(daemonChild, 'profile-start', { intervalUs: 200 });
      const runs = [];
      for (let i = 0; i < 30; i++) runs.push(await replayOnce());
      await rpc(daemonChild, 'profile-stop', { file }, 60_000);
      const summary = summarizeProfile(JSON.parse(readFileSync(file, 'utf8')), 20);
      profiles.push({ name: 'agent-replays', file, summary });
      console.log(`\n${formatSummary(`30 agent replays, p50 ${fmt(median(runs.map((r) => r.total)), 1)} ms (profiler on)`, summary)}`);
    }
  }

  if (JSON_FILE) {
    writeFileSync(
      JSON_FILE,
      `${JSON.stringify({ date: new Date().toISOString(), node: process.version, cpus: cpus().length, config: CONFIG, bulkRecorded, latRecorded, memoryBefore, memoryAfter, keepAlive: ka, sessionLoadMs, replays, lives, directs, spawned, targets, problems, profiles }, null, 2)}\n`,
    );
  }
  console.log(`\ntotal ${fmt((now() - started) / 1000, 1)} s`);

  clearTimeout(hardStop);
  procs.shuttingDown = true;
  control.close();
  const exited = (child) => (child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((resolve) => child.once('exit', resolve)));
  await rpc(daemonChild, 'stop', {}, 20_000).catch(() => undefined);
  upstreamChild.disconnect();
  await Promise.race([Promise.all([exited(daemonChild), exited(upstreamChild)]), sleep(5_000)]);
  procs.cleanup();
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(`[replay-bench] failed: ${err.stack ?? err}`);
    procs.shuttingDown = true;
    procs.cleanup();
    process.exit(1);
  },
);
