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
import { createServer } from 'node:https';
import { createSecureContext } from 'node:tls';
import { gzipSync } from 'node:zlib';
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
const SHOW_BREAKDOWN = process.argv.includes('--breakdown');

// Deterministic text (a seeded generator), so every run measures the same bytes.
let seed = 42;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
// A 4,000-word pseudo-vocabulary with English-like word lengths and a Zipf-like choice, so the text compresses
// about as well as real model and user text does (gzip takes English to roughly a third), not better.
const SYLLABLES = 'ba be bi bo bu ca ce ci co cu da de di do du fa fe fi fo fu ga ge gi go gu ha he hi ho hu la le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po pu ra re ri ro ru sa se si so su ta te ti to tu va ve vi vo vu an en in on un ar er ir or ur st th ch sh'.split(' ');
const WORDS = Array.from({ length: 4000 }, () => Array.from({ length: 1 + Math.floor(rand() * 3) }, () => SYLLABLES[Math.floor(rand() * SYLLABLES.length)]).join(''));
const word = () => WORDS[Math.floor(WORDS.length * rand() ** 2.5)];
const text = (words) => Array.from({ length: words }, (_, i) => (rand() < 0.08 && i > 0 ? `${word()}.` : word())).join(' ');
// What a real coding agent sends on every turn: a long system prompt and its tool definitions. Tool and
// parameter names are the plain identifiers real agents use (descriptions are generated text).
const SYSTEM = `You are a coding agent. ${text(1200)}`;
const TOOL_SHAPES = {
  read_file: ['path', 'offset', 'limit'],
  write_file: ['path', 'content'],
  edit_file: ['path', 'old_string', 'new_string', 'replace_all'],
  run_command: ['command', 'timeout_ms', 'cwd', 'description'],
  search_files: ['pattern', 'path', 'glob', 'case_sensitive'],
  list_directory: ['path', 'recursive', 'ignore'],
  glob: ['pattern', 'path'],
  web_fetch: ['url', 'prompt'],
  web_search: ['query', 'allowed_domains', 'blocked_domains'],
  todo_write: ['todos'],
  ask_user: ['question', 'options'],
  git_diff: ['path', 'staged'],
  git_commit: ['message', 'paths'],
  run_tests: ['pattern', 'path', 'timeout_ms'],
  notebook_edit: ['path', 'cell_id', 'new_source', 'edit_mode'],
  task: ['description', 'prompt', 'agent_type'],
};
const TOOLS = Object.entries(TOOL_SHAPES).map(([name, params]) => ({
  type: 'function',
  function: {
    name,
    description: text(40),
    parameters: { type: 'object', properties: Object.fromEntries(params.map((p) => [p, { type: 'string', description: text(12) }])), required: params.slice(0, 1) },
  },
}));

function chatRequest(messages) {
  const body = JSON.stringify({ model: 'gpt-4o-mini', temperature: 0, stream: true, stream_options: { include_usage: true }, tools: TOOLS, messages });
  return Buffer.from(
    `POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-bench-not-a-key\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
}

/**
 * The model: an in-process HTTPS server (this bench measures bytes, not speed) that streams an OpenAI-style
 * answer as real providers do: one SSE frame per token or two, a millisecond apart, then a tool call, the usage
 * frame and [DONE]. `lastAnswer` is what the client appends to the conversation.
 */
let lastAnswer = null;
let completionId = 0;
function startModel(certPem, keyPem) {
  const server = createServer({ cert: certPem, key: keyPem }, (req, res) => {
    const parts = [];
    req.on('data', (c) => parts.push(c));
    req.on('end', async () => {
      const messages = JSON.parse(Buffer.concat(parts).toString('utf8')).messages;
      const id = `chatcmpl-${(++completionId).toString(36).padStart(8, '0')}${Math.floor(rand() * 1e9).toString(36)}`;
      const content = text(80 + Math.floor(rand() * 80));
      const tool = Object.keys(TOOL_SHAPES)[Math.floor(rand() * 16)];
      const args = JSON.stringify({ [TOOL_SHAPES[tool][0]]: `src/${word()}/${word()}.ts` });
      const frame = (delta, extra = {}) => `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 1764400000 + completionId, model: 'gpt-4o-mini-2024-07-18', system_fingerprint: 'fp_0ba0d124f1', choices: [{ index: 0, delta, logprobs: null, finish_reason: null }], ...extra })}\n\n`;
      const frames = [frame({ role: 'assistant', content: '', refusal: null })];
      const words = content.split(' ');
      for (let i = 0; i < words.length; i += 2) frames.push(frame({ content: (i ? ' ' : '') + words.slice(i, i + 2).join(' ') }));
      const callId = `call_${Math.floor(rand() * 36 ** 8).toString(36)}`;
      frames.push(frame({ tool_calls: [{ index: 0, id: callId, type: 'function', function: { name: tool, arguments: '' } }] }));
      for (let i = 0; i < args.length; i += 8) frames.push(frame({ tool_calls: [{ index: 0, function: { arguments: args.slice(i, i + 8) } }] }));
      const promptTokens = Math.round(JSON.stringify(messages).length / 4);
      frames.push(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 1764400000 + completionId, model: 'gpt-4o-mini-2024-07-18', choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: 'tool_calls' }] })}\n\n`);
      frames.push(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 1764400000 + completionId, model: 'gpt-4o-mini-2024-07-18', choices: [], usage: { prompt_tokens: promptTokens, completion_tokens: words.length + 12, total_tokens: promptTokens + words.length + 12 } })}\n\n`);
      frames.push('data: [DONE]\n\n');
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-request-id': `req_${id.slice(9)}` });
      for (const f of frames) {
        res.write(f);
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
      res.end();
      lastAnswer = { role: 'assistant', content, tool_calls: [{ id: callId, type: 'function', function: { name: tool, arguments: args } }] };
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
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
    messages.push(lastAnswer);
    messages.push({ role: 'tool', tool_call_id: lastAnswer.tool_calls[0].id, content: JSON.stringify({ output: text(250) }) });
  }
  conn.close();
  await daemon.endSession(session.id);
}

/** Where a trace's bytes go: each part gzipped on its own (parts dedupe and compress together in a bundle). */
async function breakdown(store, trace, label) {
  const exchanges = [];
  for await (const ex of store.exchanges(trace)) exchanges.push(ex);
  const gz = (parts) => fmt(gzipSync(Buffer.concat(parts.map((p) => Buffer.from(p))), { level: 9 }).length);
  const meta = await store.getTrace(trace);
  const records = exchanges.map((e) => e.record);
  console.log(
    `  ${trace} ${label}: meta ${gz([JSON.stringify(meta)])} (rules ${gz([JSON.stringify(meta.redaction)])}), records ${gz(records.map((r) => JSON.stringify(r)))} ` +
      `(frame timings ${gz(records.map((r) => JSON.stringify(r.response?.chunks ?? [])))}), request heads ${gz(exchanges.map((e) => e.requestHead))}, ` +
      `request bodies ${gz(exchanges.map((e) => e.requestBody))}, response heads ${gz(exchanges.map((e) => e.responseHead))}, response bodies ${gz(exchanges.map((e) => e.responseBody))} (gzip -9 each)`,
  );
}

async function measure(daemon, trace, chunksBefore) {
  let raw = 0;
  let bodies = 0;
  for await (const ex of daemon.store.exchanges(trace)) {
    raw += ex.requestHead.length + ex.requestBody.length + ex.responseHead.length + ex.responseBody.length;
    bodies += ex.requestBody.length + ex.responseBody.length;
  }
  // what the store keeps of the bodies: the chunks this run added (bodies under 4 KiB are inline, not counted)
  const chunked = (await daemon.store.chunkStats()).bytes - chunksBefore;
  const full = (await exportBundle(storeReader(daemon.store), trace)).bytes.length;
  if (SHOW_BREAKDOWN) await breakdown(daemon.store, trace, 'full');
  await convertToStructural(daemon.store, trace, DEFAULT_RETENTION);
  const structural = (await exportBundle(storeReader(daemon.store), trace)).bytes.length;
  if (SHOW_BREAKDOWN) await breakdown(daemon.store, trace, 'structural');
  return { raw, bodies, chunked, full, structural };
}

let model;
try {
  const ca = createBenchCa(['127.0.0.1', '*.bench.test']);
  model = await startModel(ca.certPem, ca.keyPem);
  const upstream = model.address();
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
    const chunksBefore = (await daemon.store.chunkStats()).bytes;
    await recordRun(daemon, caPem, `run-${steps}`, steps);
    rows.push({ steps, ...(await measure(daemon, `run-${steps}`, chunksBefore)) });
  }
  await daemon.stop();
  console.log('\n| run | raw bytes on the wire | body bytes | store: body chunks | full bundle | full / raw | structural bundle | structural / full |');
  console.log('|:---|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    console.log(`| ${r.steps}-step | ${fmt(r.raw)} | ${fmt(r.bodies)} | ${fmt(r.chunked)} | ${fmt(r.full)} | ${(r.full / r.raw).toFixed(3)} | ${fmt(r.structural)} | ${(r.structural / r.full).toFixed(3)} |`);
  }
  const thirty = rows.find((r) => r.steps === 30);
  console.log(`\ntargets: full ≤ 0.5× raw for the 30-step run: ${thirty.full / thirty.raw <= 0.5 ? 'MET' : 'MISSED'} (${(thirty.full / thirty.raw).toFixed(3)}); structural ≤ 1/10 of full: ${rows.every((r) => r.structural * 10 <= r.full) ? 'MET' : 'MISSED'}`);
} finally {
  model?.close();
  procs.shuttingDown = true;
  procs.cleanup();
}
