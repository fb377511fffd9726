#!/usr/bin/env node
/**
 * Storage bench: how big a trace is when handed over (exported bundle), for a recorded 6-step and a 30-step
 * agent run, against the raw bytes that crossed the wire; then the same runs converted to the structural tier.
 *
 *   npm run build && node bench/storage-bench.mjs
 *
 * The agent resends the whole conversation on every step, as real agents do (a system prompt, the user's
 * turns, the model's answers and tool results accumulate). Loopback only; bounded (36 requests).
 */
import { createSecureContext } from 'node:tls';
import { Daemon } from '../dist/daemon.js';
import { createLogger } from '../dist/log.js';
import { parseConnectTo } from '../dist/proxy/connect-to.js';
import { exportBundle } from '../dist/trace/bundle.js';
import { storeReader } from '../dist/trace/reader.js';
import { convertToStructural } from '../dist/trace/tiers.js';
import { DEFAULT_RETENTION } from '../dist/trace/retention.js';
import { createBenchCa } from './ca.mjs';
import { Conn, basicAuth, openTls } from './client.mjs';
import { BenchProcesses, fmt } from './harness.mjs';

const procs = new BenchProcesses('[storage-bench]');
const HOST = 'api.bench.test';

// Deterministic text (a seeded generator), so every run measures the same bytes.
let seed = 42;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
// A 4,000-word pseudo-vocabulary with English-like word lengths and a Zipf-like choice, so the text compresses
// about as well as real model and user text does (gzip takes English to roughly a third), not better.
const SYLLABLES = 'ba be bi bo bu ca ce ci co cu da de di do du fa fe fi fo fu ga ge gi go gu ha he hi ho hu la le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po pu ra re ri ro ru sa se si so su ta te ti to tu va ve vi vo vu an en in on un ar er ir or ur st th ch sh'.split(' ');
const WORDS = Array.from({ length: 4000 }, () => Array.from({ length: 1 + Math.floor(rand() * 3) }, () => SYLLABLES[Math.floor(rand() * SYLLABLES.length)]).join(''));
const word = () => WORDS[Math.floor(WORDS.length * rand() ** 2.5)];
const text = (words) => Array.from({ length: words }, (_, i) => (rand() < 0.08 && i > 0 ? `${word()}.` : word())).join(' ');
// What a real coding agent sends on every turn: a long system prompt and its tool definitions.
const SYSTEM = `You are a coding agent. ${text(1200)}`;
const TOOLS = Array.from({ length: 24 }, (_, i) => ({
  type: 'function',
  function: {
    name: `tool_${i}_${word()}`,
    description: text(40),
    parameters: { type: 'object', properties: Object.fromEntries(Array.from({ length: 4 }, () => [word(), { type: 'string', description: text(12) }])), required: [] },
  },
}));

function chatRequest(messages) {
  const body = JSON.stringify({ model: 'gpt-4o-mini', temperature: 0, tools: TOOLS, messages });
  return Buffer.from(
    `POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-bench-not-a-key\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
}

async function recordRun(daemon, caPem, trace, steps) {
  const session = await daemon.registerSession({ trace });
  const conn = new Conn(
    await openTls({ proxyPort: daemon.port, host: HOST, port: 443, servername: HOST, secureContext: createSecureContext({ ca: caPem }), proxyAuthorization: basicAuth(session.id, session.token) }),
  );
  const messages = [{ role: 'system', content: SYSTEM }];
  for (let step = 0; step < steps; step++) {
    messages.push({ role: 'user', content: text(60 + Math.floor(rand() * 60)) });
    const res = await conn.send(chatRequest(messages), { what: `step ${step}` });
    if (res.status !== 200) throw new Error(`step ${step}: status ${res.status}`);
    messages.push({ role: 'assistant', content: text(120) });
    messages.push({ role: 'tool', tool_call_id: `call_${step}`, content: JSON.stringify({ path: `src/${word()}.ts`, output: text(250) }) });
  }
  conn.close();
  await daemon.endSession(session.id);
}

async function measure(daemon, trace) {
  let raw = 0;
  for await (const ex of daemon.store.exchanges(trace)) raw += ex.requestHead.length + ex.requestBody.length + ex.responseHead.length + ex.responseBody.length;
  const full = (await exportBundle(storeReader(daemon.store), trace)).bytes.length;
  await convertToStructural(daemon.store, trace, DEFAULT_RETENTION);
  const structural = (await exportBundle(storeReader(daemon.store), trace)).bytes.length;
  return { raw, full, structural };
}

try {
  const ca = createBenchCa(['127.0.0.1', '*.bench.test']);
  const upstream = await procs.startUpstream({ certPem: ca.certPem, keyPem: ca.keyPem });
  const home = procs.tempDir('mitm-replay-storage-bench-');
  const daemon = await Daemon.start({
    home,
    port: 0,
    intercept: [HOST],
    connectTo: [parseConnectTo(`::127.0.0.1:${upstream.port}`)],
    upstreamCAs: [ca.caCertPem],
    logger: createLogger({ level: 'silent' }),
  });
  const { readFileSync } = await import('node:fs');
  const caPem = readFileSync(`${home}/certs/ca.pem`, 'utf8');
  const rows = [];
  for (const steps of [6, 30]) {
    await recordRun(daemon, caPem, `run-${steps}`, steps);
    rows.push({ steps, ...(await measure(daemon, `run-${steps}`)) });
  }
  await daemon.stop();
  console.log('\n| run | raw bytes on the wire | full bundle | full / raw | structural bundle | structural / full |');
  console.log('|:---|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    console.log(`| ${r.steps}-step | ${fmt(r.raw)} | ${fmt(r.full)} | ${(r.full / r.raw).toFixed(3)} | ${fmt(r.structural)} | ${(r.structural / r.full).toFixed(3)} |`);
  }
  const thirty = rows.find((r) => r.steps === 30);
  console.log(`\ntargets: full ≤ 0.5× raw for the 30-step run: ${thirty.full / thirty.raw <= 0.5 ? 'MET' : 'MISSED'} (${(thirty.full / thirty.raw).toFixed(3)}); structural ≤ 1/10 of full: ${rows.every((r) => r.structural * 10 <= r.full) ? 'MET' : 'MISSED'}`);
} finally {
  procs.shuttingDown = true;
  procs.cleanup();
}
