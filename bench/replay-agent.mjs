#!/usr/bin/env node
/**
 * The replay bench's "small script client": one agent-like run of 6 exchanges, with Node's own https client
 * over a fresh keep-alive agent (so every run opens new CONNECT tunnels and TLS sessions, one per origin):
 *   1. POST api.openai.com/v1/chat/completions  stream:true (answers with a get_weather tool call, SSE)
 *   2. GET  tools.example.test/tool/weather?city=Paris
 *   3. POST api.openai.com/v1/chat/completions  (tool result → final JSON answer)
 *   4. POST api.openai.com/v1/embeddings
 *   5. GET  tools.example.test/tool/weather?city=London
 *   6. POST api.openai.com/v1/chat/completions  stream:true
 * Through the proxy (proxyPort + session credentials) or straight to the upstream (directPort, for reference).
 *
 * As a module: runAgent(options) → { ms, statuses, digest }. As a script (one process per run):
 *   BENCH_PROXY_PORT=… BENCH_PROXY_AUTH='Basic …' BENCH_CA_FILE=ca.pem node bench/replay-agent.mjs
 * prints that result as JSON. Loopback only.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import https from 'node:https';
import tls from 'node:tls';
import { pathToFileURL } from 'node:url';
import { connectTunnel } from './client.mjs';

const MODEL = 'gpt-4o-mini';
const TOOLS = [
  {
    type: 'function',
    function: { name: 'get_weather', description: 'Current weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
  },
];
const USER = { role: 'user', content: 'What is the weather in Paris, and how does it compare with London?' };
const TOOL_CALL = { role: 'assistant', content: null, tool_calls: [{ id: 'call_bench_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] };
const OPENAI_HEADERS = { authorization: 'Bearer sk-bench-not-a-real-key-0123456789abcdef', 'content-type': 'application/json', 'user-agent': 'replay-bench-agent/1.0', accept: 'application/json' };
const TOOL_HEADERS = { 'user-agent': 'replay-bench-agent/1.0', accept: 'application/json' };

export const AGENT_STEPS = [
  { origin: 'api.openai.com', method: 'POST', path: '/v1/chat/completions', headers: { ...OPENAI_HEADERS, accept: 'text/event-stream' }, body: { model: MODEL, stream: true, messages: [USER], tools: TOOLS } },
  { origin: 'tools.example.test', method: 'GET', path: '/tool/weather?city=Paris', headers: TOOL_HEADERS },
  {
    origin: 'api.openai.com',
    method: 'POST',
    path: '/v1/chat/completions',
    headers: OPENAI_HEADERS,
    body: { model: MODEL, messages: [USER, TOOL_CALL, { role: 'tool', tool_call_id: 'call_bench_1', content: '{"city":"Paris","conditions":"sunny"}' }], tools: TOOLS },
  },
  { origin: 'api.openai.com', method: 'POST', path: '/v1/embeddings', headers: OPENAI_HEADERS, body: { model: 'text-embedding-3-small', input: ['Paris weather', 'London weather'] } },
  { origin: 'tools.example.test', method: 'GET', path: '/tool/weather?city=London', headers: TOOL_HEADERS },
  {
    origin: 'api.openai.com',
    method: 'POST',
    path: '/v1/chat/completions',
    headers: { ...OPENAI_HEADERS, accept: 'text/event-stream' },
    body: { model: MODEL, stream: true, messages: [USER, TOOL_CALL, { role: 'tool', tool_call_id: 'call_bench_1', content: '{"city":"London","conditions":"rain"}' }], tools: TOOLS },
  },
];

/** Node's https over a CONNECT tunnel (what proxy-aware agents do), or straight to 127.0.0.1:directPort. */
class BenchAgent extends https.Agent {
  constructor({ proxyPort, proxyAuthorization, directPort, ca }) {
    super({ keepAlive: true, maxSockets: 1, ca });
    this.proxyPort = proxyPort;
    this.proxyAuthorization = proxyAuthorization;
    this.directPort = directPort;
  }

  createConnection(options, callback) {
    const servername = options.servername ?? options.host;
    if (this.proxyPort == null) {
      return tls.connect({ ...options, host: '127.0.0.1', port: this.directPort, servername });
    }
    connectTunnel({ proxyPort: this.proxyPort, target: `${options.host}:${options.port}`, proxyAuthorization: this.proxyAuthorization }).then(
      (socket) => callback(null, tls.connect({ ...options, socket, servername })),
      (err) => callback(err),
    );
    return undefined;
  }
}

function send(agent, step, timeoutMs) {
  const body = step.body === undefined ? undefined : Buffer.from(JSON.stringify(step.body));
  return new Promise((resolve, reject) => {
    const req = https.request(
      { host: step.origin, port: 443, method: step.method, path: step.path, headers: { ...step.headers, ...(body ? { 'content-length': body.length } : {}) }, agent, timeout: timeoutMs },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${step.method} ${step.origin}${step.path} timed out`)));
    req.on('error', reject);
    req.end(body);
  });
}

/** One run of the 6 exchanges with a fresh client; digest = sha256 over every response body, in order. */
export async function runAgent({ proxyPort = null, proxyAuthorization, directPort, ca, timeoutMs = 15_000 }) {
  const agent = new BenchAgent({ proxyPort, proxyAuthorization, directPort, ca });
  const t0 = performance.now();
  const statuses = [];
  const digest = createHash('sha256');
  try {
    for (const step of AGENT_STEPS) {
      const r = await send(agent, step, timeoutMs);
      statuses.push(r.status);
      digest.update(`${r.status}\n`).update(r.body);
    }
  } finally {
    agent.destroy();
  }
  return { ms: performance.now() - t0, statuses, digest: digest.digest('hex') };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const env = process.env;
  const result = await runAgent({
    proxyPort: env.BENCH_PROXY_PORT ? Number(env.BENCH_PROXY_PORT) : null,
    proxyAuthorization: env.BENCH_PROXY_AUTH,
    directPort: env.BENCH_DIRECT_PORT ? Number(env.BENCH_DIRECT_PORT) : undefined,
    ca: readFileSync(env.BENCH_CA_FILE, 'utf8'),
  });
  process.stdout.write(`${JSON.stringify(result)}\n`);
}
