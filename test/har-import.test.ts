import { describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { buildRuleSet } from '../src/capture/redact.js';
import { Matcher, endpointOf, requestHash } from '../src/replay/matcher.js';
import { importBundle } from '../src/trace/bundle.js';
import { traceToHar } from '../src/trace/har.js';
import { HarImportError, harToBundle, parseHarText } from '../src/trace/har-import.js';
import { FORMAT_VERSION, decodeExchange, encodeExchange, type ExchangeRecord, type StoredExchange, type TraceMeta } from '../src/trace/schema.js';
import { TraceStore } from '../src/trace/store.js';
import { useUpstreamFixture } from './helpers/cli-fixture.js';
import { ROOT, runCli } from './helpers/cli.js';

// Built at run time so that no key shape sits in the source.
const KEY = ['sk', 'proj', `${'Hx7'.repeat(8)}T3BlbkFJ${'q9Z'.repeat(6)}`].join('-');

const text = (b: Buffer): string => b.toString('latin1');
const h = (name: string, value: string) => ({ name, value });
const T0 = Date.parse('2026-03-01T10:00:00.000Z');

function entry(overrides: Record<string, unknown>): Record<string, unknown> {
  return {
    startedDateTime: '2026-03-01T10:00:00.000Z',
    time: 100,
    cache: {},
    timings: { blocked: -1, dns: -1, connect: -1, ssl: -1, send: 2, wait: 40, receive: 8 },
    ...overrides,
  };
}

describe('harToBundle: a HAR recorded elsewhere', () => {
  const sse = 'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\ndata: {"choices":[{"delta":{"content":"lo"}}]}\n\ndata: [DONE]\n\n';
  const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0xff, 0xfe, 0x00]);
  const chatBody = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], api_key: KEY });
  const anthropicBody = JSON.stringify({ model: 'claude-x', max_tokens: 5, messages: [] });
  const har = {
    log: {
      version: '1.2',
      creator: { name: 'devtools', version: '1' },
      entries: [
        // 0: JSON over HTTP/1.1; the original response was gzip'd and chunked, the HAR holds the decoded text
        entry({
          request: {
            method: 'POST',
            url: 'https://api.openai.com/v1/chat/completions',
            httpVersion: 'HTTP/1.1',
            headers: [h('Host', 'api.openai.com'), h('Connection', 'keep-alive'), h('Authorization', `Bearer ${KEY}`), h('Content-Type', 'application/json'), h('Content-Length', '999')],
            postData: { mimeType: 'application/json', text: chatBody },
          },
          response: {
            status: 200,
            statusText: 'OK',
            httpVersion: 'HTTP/1.1',
            headers: [h('Content-Type', 'application/json'), h('Content-Encoding', 'gzip'), h('Transfer-Encoding', 'chunked'), h('X-Request-Id', 'req_1')],
            content: { size: 20, mimeType: 'application/json', text: '{"id":"chatcmpl-1"}\n' },
          },
        }),
        // 1: SSE, no chunk timing in the HAR
        entry({
          request: { method: 'POST', url: 'https://api.openai.com/v1/chat/completions?stream=1', httpVersion: 'HTTP/1.1', headers: [h('Host', 'api.openai.com'), h('Content-Type', 'application/json')], postData: { mimeType: 'application/json', text: '{"stream":true}' } },
          response: { status: 200, statusText: 'OK', httpVersion: 'HTTP/1.1', headers: [h('Content-Type', 'text/event-stream')], content: { size: sse.length, mimeType: 'text/event-stream', text: sse } },
          timings: { send: 1.5, wait: 100, receive: 300 },
        }),
        // 2: a binary body, base64
        entry({
          request: { method: 'GET', url: 'http://cdn.example.test:8080/logo.png', httpVersion: 'HTTP/1.1', headers: [h('Host', 'cdn.example.test:8080')] },
          response: { status: 200, statusText: 'OK', httpVersion: 'HTTP/1.1', headers: [h('Content-Type', 'image/png'), h('Content-Length', '12')], content: { size: 12, mimeType: 'image/png', text: png.toString('base64'), encoding: 'base64' } },
        }),
        // 3: an HTTP/2 devtools capture: pseudo-headers, lower-case names, base64 request body, no status text
        entry({
          request: {
            method: 'POST',
            url: 'https://api.anthropic.com/v1/messages',
            httpVersion: 'h2',
            headers: [h(':authority', 'api.anthropic.com'), h(':method', 'POST'), h(':path', '/v1/messages'), h(':scheme', 'https'), h('content-type', 'application/json'), h('x-api-key', KEY), h('anthropic-version', '2023-06-01')],
            postData: { mimeType: 'application/json', text: Buffer.from(anthropicBody).toString('base64'), _encoding: 'base64' },
          },
          response: { status: 200, statusText: '', httpVersion: 'h2', headers: [h(':status', '200'), h('content-type', 'application/json'), h('content-encoding', 'br')], content: { size: 9, mimeType: 'application/json', text: '{"ok":1}\n' } },
        }),
        // 4: a WebSocket: skipped
        entry({ request: { method: 'GET', url: 'wss://realtime.example.test/socket', headers: [] }, response: { status: 101, headers: [], content: {} } }),
        // 5: a CONNECT: skipped
        entry({ request: { method: 'CONNECT', url: 'https://api.openai.com:443', headers: [] }, response: { status: 200, headers: [], content: {} } }),
        // 6: no response (devtools: status 0 and _error)
        entry({ request: { method: 'GET', url: 'https://api.openai.com/v1/models', headers: [h('Host', 'api.openai.com')] }, response: { status: 0, statusText: '', headers: [], content: { size: 0 }, _error: 'net::ERR_CONNECTION_RESET' } }),
        // 7: a tool that kept the encoded bytes (base64 of the gzip stream): kept encoded, with its Content-Encoding
        entry({
          request: { method: 'GET', url: 'https://files.example.test/a.txt', headers: [h('Host', 'files.example.test')] },
          response: { status: 200, statusText: 'OK', headers: [h('Content-Encoding', 'gzip')], content: { size: 6, mimeType: 'text/plain', text: gzipSync('hello\n').toString('base64'), encoding: 'base64' } },
        }),
      ],
    },
  };

  const result = harToBundle(har, 'from-devtools', { now: 1_700_000_000_000 });
  const { bundle } = result;
  const [chat, stream, image, h2, failed, encoded] = bundle.exchanges;

  it('converts each entry to the stored form the recorder would have made', () => {
    expect(bundle.exchanges).toHaveLength(6);
    expect(bundle.exchanges.map((e) => e.record.seq)).toEqual([0, 1, 2, 3, 4, 5]);

    // request: hop-by-hop gone, secrets redacted, Content-Length fitted to the body
    const chatStored = chatBody.replace(KEY, '[REDACTED:openai-key]');
    expect(text(chat!.requestHead)).toBe(
      'POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\nAuthorization: Bearer [REDACTED:header:authorization]\r\nContent-Type: application/json\r\n' +
        `Content-Length: ${chatStored.length}\r\n\r\n`,
    );
    expect(text(chat!.requestBody)).toBe(chatStored);
    expect(chat!.record.request).toMatchObject({ method: 'POST', target: '/v1/chat/completions', droppedHeaders: ['Connection'], hash: requestHash(chat!.requestHead, chat!.requestBody) });
    // response: decoded, so Content-Encoding and Transfer-Encoding go and Content-Length is added
    expect(text(chat!.responseHead)).toBe('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: req_1\r\nContent-Length: 20\r\n\r\n');
    expect(text(chat!.responseBody)).toBe('{"id":"chatcmpl-1"}\n');
    expect(chat!.record).toMatchObject({ kind: 'http', state: 'complete', route: 'connect', origin: { scheme: 'https', host: 'api.openai.com', port: 443 }, startedAt: T0 });
    expect(chat!.record.timings).toEqual({ requestEndMs: 2, responseHeadMs: 42, endMs: 50 });
    expect(chat!.record.response).toMatchObject({ status: 200, chunks: [[42, 20]], headLength: chat!.responseHead.length, bodyLength: 20 });

    // SSE without chunk timing: one chunk at send + wait
    expect(stream!.record.request!.target).toBe('/v1/chat/completions?stream=1');
    expect(text(stream!.responseHead)).toBe(`HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: ${sse.length}\r\n\r\n`);
    expect(text(stream!.responseBody)).toBe(sse);
    expect(stream!.record.response!.chunks).toEqual([[101.5, sse.length]]);

    // binary: base64 decoded; plain http is the proxy route, with its port
    expect(image!.responseBody.equals(png)).toBe(true);
    expect(image!.record).toMatchObject({ route: 'proxy', origin: { scheme: 'http', host: 'cdn.example.test', port: 8080 } });
    expect(text(image!.requestHead)).toBe('GET /logo.png HTTP/1.1\r\nHost: cdn.example.test:8080\r\n\r\n');
    expect(text(image!.responseHead)).toBe('HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 12\r\n\r\n');

    // HTTP/2: pseudo-headers dropped, host synthesized where :authority was, served as HTTP/1.1
    expect(text(h2!.requestHead)).toBe(
      'POST /v1/messages HTTP/1.1\r\nhost: api.anthropic.com\r\ncontent-type: application/json\r\nx-api-key: [REDACTED:header:x-api-key]\r\nanthropic-version: 2023-06-01\r\n' +
        `content-length: ${anthropicBody.length}\r\n\r\n`,
    );
    expect(text(h2!.requestBody)).toBe(anthropicBody);
    expect(text(h2!.responseHead)).toBe('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n');

    // no response: incomplete, with the devtools error
    expect(failed!.record).toMatchObject({ state: 'incomplete', error: { code: 'no-response', message: 'net::ERR_CONNECTION_RESET', phase: 'upstream' } });
    expect(failed!.record.response).toBeUndefined();
    expect(failed!.responseHead.length).toBe(0);
    expect(failed!.record.timings.responseHeadMs).toBeUndefined();

    // still-encoded content stays encoded
    expect(text(encoded!.responseHead)).toBe(`HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: ${encoded!.responseBody.length}\r\n\r\n`);
    expect(encoded!.responseBody.equals(gzipSync('hello\n'))).toBe(true);

    // every record survives the store's encoding
    for (const ex of bundle.exchanges) expect(encodeExchange(decodeExchange(encodeExchange(ex))).equals(encodeExchange(ex))).toBe(true);
  });

  it('lists skipped entries and states what HAR cannot carry', () => {
    expect(result.skipped).toEqual([
      { index: 4, reason: 'wss: URL, not http or https' },
      { index: 5, reason: 'CONNECT opens a tunnel; there is no request in it to replay' },
    ]);
    const limits = result.limits.join('\n');
    expect(limits).toContain('HAR has no chunk timing: each response is served as one chunk');
    expect(limits).toContain('HAR does not keep raw header order, case or spacing');
    expect(limits).toContain('bodies are stored decoded (HAR stores decoded content)');
    expect(limits).toContain('HTTP/2 pseudo-headers');
    expect(limits).toContain('1 entry had no response (status 0)');
    expect(limits).toContain('secrets in 2 entries were redacted (built-in rules)');
    expect(limits).toContain('2 entries skipped: log.entries[4]: wss: URL, not http or https; log.entries[5]: CONNECT');
    for (const line of result.limits) expect(line).not.toMatch(/[\r\n]/);
  });

  it('redacts a raw key in headers and bodies: it is nowhere in the stored trace', () => {
    for (const ex of bundle.exchanges) expect(text(encodeExchange(ex))).not.toContain(KEY);
    expect(JSON.stringify(bundle.meta)).not.toContain(KEY);
    expect(chat!.record.redactions).toEqual(
      expect.arrayContaining([
        { rule: 'header:authorization', where: 'request.header:authorization' },
        { rule: 'openai-key', where: 'request.body' },
      ]),
    );
    expect(h2!.record.redactions).toEqual([{ rule: 'header:x-api-key', where: 'request.header:x-api-key' }]);
    // the trace replays with the rules it was redacted with
    expect(bundle.meta).toEqual({
      name: 'from-devtools',
      formatVersion: FORMAT_VERSION,
      createdAt: 1_700_000_000_000,
      finishedAt: 1_700_000_000_000,
      mode: 'record',
      source: 'daemon',
      intercept: ['api.anthropic.com', 'api.openai.com', 'cdn.example.test', 'files.example.test'],
      redaction: buildRuleSet(),
      restarts: [],
    });
  });

  it('is a bundle importBundle writes into a store', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'har-import-'));
    const store = await TraceStore.open(join(dir, 'traces'));
    try {
      const written = await importBundle(store, bundle, { name: 'devtools-run' });
      expect(written).toEqual({ name: 'devtools-run', exchanges: 6, unchanged: false });
      const back = await store.getExchange('devtools-run', 3);
      expect(back && encodeExchange(back).equals(encodeExchange(h2!))).toBe(true);
      expect((await store.getTrace('devtools-run'))?.source).toBe('daemon');
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// ---------------------------------------------------------------------------------------------------------
// Round trip through our own HAR export
// ---------------------------------------------------------------------------------------------------------

function exchange(
  seq: number,
  record: Partial<ExchangeRecord> & Pick<ExchangeRecord, 'origin' | 'route'>,
  requestHead: string,
  requestBody: Buffer | string,
  responseHead = '',
  responseBody: Buffer | string = '',
  chunks: [number, number][] = [],
): StoredExchange {
  const reqHead = Buffer.from(requestHead, 'latin1');
  const reqBody = Buffer.isBuffer(requestBody) ? requestBody : Buffer.from(requestBody, 'latin1');
  const resHead = Buffer.from(responseHead, 'latin1');
  const resBody = Buffer.isBuffer(responseBody) ? responseBody : Buffer.from(responseBody, 'latin1');
  const [method = 'GET', target = '/'] = requestHead.split(' ');
  const status = Number(responseHead.split(' ')[1] ?? 0);
  return {
    record: {
      seq,
      kind: 'http',
      state: 'complete',
      startedAt: T0 + seq * 1000,
      timings: { requestEndMs: 1.25, responseHeadMs: 80.5, endMs: 120 },
      redactions: [],
      ...record,
      request: { method, target, droppedHeaders: [], headLength: reqHead.length, bodyLength: reqBody.length, flags: [], hash: requestHash(reqHead, reqBody) },
      ...(responseHead ? { response: { status, headLength: resHead.length, bodyLength: resBody.length, flags: [], chunks } } : {}),
    },
    requestHead: reqHead,
    requestBody: reqBody,
    responseHead: resHead,
    responseBody: resBody,
  };
}

const traceMeta = (name: string): TraceMeta => ({
  name,
  formatVersion: FORMAT_VERSION,
  createdAt: T0,
  mode: 'record',
  source: 'record',
  command: ['node', 'agent.mjs'],
  intercept: ['api.openai.com', 'api.anthropic.com'],
  redaction: buildRuleSet(),
  restarts: [],
});

function chunked(...parts: string[]): string {
  return parts.map((p) => `${Buffer.byteLength(p, 'latin1').toString(16)}\r\n${p}\r\n`).join('');
}

describe('harToBundle over our own export --har', () => {
  const openai = { scheme: 'https', host: 'api.openai.com', port: 443 } as const;
  const chatBody = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"caf\u00c3\u00a9?"}]}'; // UTF-8 bytes as latin1
  const chatJson = gzipSync('{"id":"chatcmpl-9","choices":[{"message":{"content":"yes"}}]}');
  const frames = ['data: {"choices":[{"delta":{"content":"a"}}]}', 'data: {"choices":[{"delta":{"content":"b"}}]}', 'data: [DONE]'];
  const piece1 = chunked(`${frames[0]}\n\n`);
  const piece2 = chunked(`${frames[1]}\n\n`);
  const piece3 = chunked(`${frames[2]}\n\n`) + '0\r\n\r\n';
  const audio = Buffer.from([0, 1, 2, 0xff, 0xfe, 0x80, 0x0d, 0x0a]);
  const models = '{"data":[]}';

  const exchanges = [
    exchange(
      0,
      { origin: openai, route: 'connect', redactions: [{ rule: 'header:authorization', where: 'request.header:authorization' }] },
      `POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\nAuthorization: Bearer [REDACTED:header:authorization]\r\nContent-Type: application/json\r\nContent-Length: ${chatBody.length}\r\nUser-Agent: OpenAI/JS 6.30.1\r\n\r\n`,
      chatBody,
      `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: ${chatJson.length}\r\n\r\n`,
      chatJson,
      [[80.5, chatJson.length]],
    ),
    exchange(
      1,
      { origin: openai, route: 'connect' },
      'POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n',
      '{"stream":true}',
      'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n',
      piece1 + piece2 + piece3,
      [
        [90, piece1.length],
        [140.25, piece2.length],
        [190, piece3.length],
      ],
    ),
    exchange(
      2,
      { origin: { scheme: 'http', host: 'localhost', port: 8080 }, route: 'base-url' },
      'GET /v1/models?limit=2&key=[REDACTED:query:key] HTTP/1.1\r\nHost: localhost:8080\r\nAccept: */*\r\n\r\n',
      '',
      `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${models.length}\r\n\r\n`,
      models,
      [
        [30, 4],
        [31, models.length - 4],
      ],
    ),
    exchange(
      3,
      { origin: openai, route: 'connect' },
      `POST /v1/audio/transcriptions HTTP/1.1\r\nHost: api.openai.com\r\nContent-Type: application/octet-stream\r\nContent-Length: ${audio.length}\r\n\r\n`,
      audio,
      'HTTP/1.1 204 No Content\r\n\r\n',
    ),
    exchange(
      4,
      { origin: { scheme: 'https', host: 'api.anthropic.com', port: 443 }, route: 'connect', state: 'incomplete', error: { code: 'ECONNRESET', message: 'socket hang up', phase: 'upstream' }, timings: { requestEndMs: 3 } },
      'POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n',
      '{}',
    ),
  ];
  // The file a user would carry: serialized and parsed again.
  const har = JSON.parse(JSON.stringify(traceToHar(traceMeta('original'), exchanges)));
  const { bundle, limits } = harToBundle(har, 'reimported', { now: T0 + 60_000 });

  it('gives every request back the same stored bytes and hash, so the re-imported trace replays exact', () => {
    expect(bundle.exchanges).toHaveLength(exchanges.length);
    bundle.exchanges.forEach((imported, i) => {
      const original = exchanges[i]!;
      expect(text(imported.requestHead), `seq ${i}`).toBe(text(original.requestHead));
      expect(imported.requestBody.equals(original.requestBody), `seq ${i}`).toBe(true);
      expect(imported.record.request!.hash).toBe(original.record.request!.hash);
      expect(imported.record.request!.target).toBe(original.record.request!.target);
      expect(imported.record).toMatchObject({ origin: original.record.origin, route: original.record.route, state: original.record.state, startedAt: original.record.startedAt });
    });
    // the matcher (what replay uses) calls each original request exact against the imported trace
    const matcher = new Matcher(bundle.exchanges);
    for (const original of exchanges) {
      const { method, target } = original.record.request!;
      const endpoint = endpointOf(method, original.record.origin, target);
      const match = matcher.match(endpoint, matcher.nextPosition(endpoint), requestHash(original.requestHead, original.requestBody));
      expect(match.kind, endpoint).toBe('exact');
    }
  });

  it('restores chunk boundaries and offsets from _mitmReplay, and the state, error and redaction manifest', () => {
    const [chat, stream, models_, audio_, cut] = bundle.exchanges;
    // gzip'd original: stored decoded now; its one chunk keeps its offset
    expect(chat!.record.response!.chunks).toEqual([[80.5, chat!.responseBody.length]]);
    expect(text(chat!.responseHead)).not.toMatch(/content-encoding/i);
    expect(chat!.record.redactions).toEqual([{ rule: 'header:authorization', where: 'request.header:authorization' }]);
    // chunked SSE: one chunk per frame, at the recorded offsets
    expect(text(stream!.responseBody)).toBe(frames.map((f) => `${f}\n\n`).join(''));
    expect(stream!.record.response!.chunks).toEqual(frames.map((f, i) => [[90, 140.25, 190][i], f.length + 2]));
    expect(text(stream!.responseHead)).toBe(`HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nContent-Length: ${stream!.responseBody.length}\r\n\r\n`);
    // an identity body: the chunks exactly as recorded
    expect(models_!.record.response!.chunks).toEqual([
      [30, 4],
      [31, models.length - 4],
    ]);
    expect(models_!.responseHead.equals(exchanges[2]!.responseHead)).toBe(true);
    expect(audio_!.responseHead.equals(exchanges[3]!.responseHead)).toBe(true);
    expect(cut!.record).toMatchObject({ state: 'incomplete', error: { code: 'ECONNRESET', message: 'socket hang up', phase: 'upstream' } });
    expect(cut!.record.response).toBeUndefined();
    expect(bundle.meta.intercept).toEqual(['api.anthropic.com', 'api.openai.com', 'localhost']);
    expect(limits.join('\n')).not.toContain('no chunk timing');
  });

  it('cannot be byte-exact where HAR loses the bytes: header spacing and a chunked request body', () => {
    // HAR holds a header as name and trimmed value: `X-Trace:abc ` comes back as `X-Trace: abc`. A chunked
    // request is stored de-chunked with a Content-Length (HAR has the entity only). Both change the hash.
    const odd = exchange(0, { origin: openai, route: 'connect' }, 'GET /v1/models HTTP/1.1\r\nHost: api.openai.com\r\nX-Trace:abc \r\n\r\n', '');
    const body = chunked('{"a":', '1}') + '0\r\n\r\n';
    const chunkedRequest = exchange(1, { origin: openai, route: 'connect' }, 'POST /v1/files HTTP/1.1\r\nHost: api.openai.com\r\nTransfer-Encoding: chunked\r\n\r\n', body);
    const back = harToBundle(JSON.parse(JSON.stringify(traceToHar(traceMeta('odd'), [odd, chunkedRequest]))), 'odd').bundle.exchanges;
    expect(text(back[0]!.requestHead)).toBe('GET /v1/models HTTP/1.1\r\nHost: api.openai.com\r\nX-Trace: abc\r\n\r\n');
    expect(back[0]!.record.request!.hash).not.toBe(odd.record.request!.hash);
    expect(text(back[1]!.requestHead)).toBe('POST /v1/files HTTP/1.1\r\nHost: api.openai.com\r\nContent-Length: 7\r\n\r\n');
    expect(text(back[1]!.requestBody)).toBe('{"a":1}');
    expect(back[1]!.record.request!.droppedHeaders).toEqual(['Transfer-Encoding']);
  });
});

describe('harToBundle: bad input', () => {
  const expectError = (har: unknown, message: RegExp) => {
    let caught: unknown;
    try {
      harToBundle(har, 'bad');
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(HarImportError);
    const said = (caught as Error).message;
    expect(said).toMatch(message);
    expect(said).not.toMatch(/[\r\n]/);
  };
  const ok = { method: 'GET', url: 'https://api.openai.com/v1/models', headers: [] };

  it('refuses what is not a HAR, or a HAR entry without what a request needs, with one line', () => {
    expectError(null, /^not a HAR document: expected a JSON object/);
    expectError([], /^not a HAR document/);
    expectError({ entries: [] }, /no top-level "log" object; export one from browser devtools/);
    expectError({ log: { version: '1.2' } }, /the HAR "log" has no "entries" array/);
    expectError({ log: { entries: [] } }, /the HAR has no entries: nothing to import/);
    expectError({ log: { entries: ['x'] } }, /^HAR log.entries\[0\] is not an object: fix or remove that entry$/);
    expectError({ log: { entries: [entry({ response: { status: 200 } })] } }, /^HAR log.entries\[0\] has no request: /);
    expectError({ log: { entries: [entry({ request: { method: 'GET', headers: [] } })] } }, /^HAR log.entries\[0\] has no request.url: fix or remove that entry$/);
    expectError({ log: { entries: [entry({ request: ok }), entry({ request: { url: 'https://a.test/' } })] } }, /^HAR log.entries\[1\] has no request.method/);
    expectError({ log: { entries: [entry({ request: ok, startedDateTime: 'yesterday' })] } }, /has no valid startedDateTime/);
    expectError({ log: { entries: [entry({ request: { ...ok, headers: { host: 'x' } } })] } }, /^HAR log.entries\[0\].request.headers is not an array/);
    expectError({ log: { entries: [entry({ request: { ...ok, headers: [{ name: 'a' }] } })] } }, /^HAR log.entries\[0\].request.headers\[0\] is not a \{name, value\} pair/);
    expectError({ log: { entries: [entry({ request: ok, response: 'none' })] } }, /^HAR log.entries\[0\].response is not an object/);
    expect(() => harToBundle({ log: { entries: [entry({ request: ok })] } }, 'no/slash')).toThrow(/^invalid trace name 'no\/slash'/);
    expect(() => parseHarText('{"log":', 'x.har')).toThrow(HarImportError);
    expect(() => parseHarText('{"log":', 'x.har')).toThrow(/^x.har is not valid JSON \(.*\): give a HAR file/);
    expect(parseHarText('\uFEFF{"log":{}}', 'bom.har')).toEqual({ log: {} });
  });

  it('skips entries it cannot convert, and refuses a HAR where nothing is left', () => {
    const entries = [
      entry({ request: { method: 'GET', url: 'data:text/plain,hi', headers: [] }, response: { status: 200, headers: [], content: {} } }),
      entry({ request: { ...ok, headers: [h('Bad Name', 'x')] }, response: { status: 200, headers: [], content: {} } }),
      entry({ request: { ...ok, headers: [h('X-Split', 'a\r\nInjected: 1')] }, response: { status: 200, headers: [], content: {} } }),
      entry({ request: { ...ok, method: 'POST', postData: { mimeType: 'multipart/form-data', params: [{ name: 'f', value: 'v' }] } }, response: { status: 200, headers: [], content: {} } }),
      entry({ request: ok, response: { status: 200, headers: [], content: { text: '!!!', encoding: 'base64' } } }),
    ];
    expectError({ log: { entries } }, /^none of the HAR's 5 entries can be replayed \(log.entries\[0\]: data: URL, not http or https; log.entries\[1\]: header name "Bad Name" is not valid in HTTP\/1.1; .*; and 2 more\): record HTTP or HTTPS requests$/);
    const { skipped, bundle, limits } = harToBundle({ log: { entries: [...entries, entry({ request: ok, response: { status: 200, headers: [], content: { mimeType: 'text/plain' } } })] } }, 'partial');
    expect(skipped.map((s) => s.index)).toEqual([0, 1, 2, 3, 4]);
    expect(skipped[2]!.reason).toBe('header "X-Split" has a line break in its value');
    expect(skipped[3]!.reason).toMatch(/only as form params \(multipart\/form-data\)/);
    expect(skipped[4]!.reason).toBe('its response content is marked base64 but is not base64');
    expect(bundle.exchanges).toHaveLength(1);
    expect(text(bundle.exchanges[0]!.requestHead)).toBe('GET /v1/models HTTP/1.1\r\nHost: api.openai.com\r\n\r\n');
    expect(limits.join('\n')).toContain('1 response had no content in the HAR (not captured): served with an empty body');
  });
});

describe('a recorded run exported as HAR and imported again', () => {
  const fx = useUpstreamFixture('har-import');
  const agent = join(ROOT, 'test', 'fixtures', 'node-agent.mjs');
  const env = { OPENAI_API_KEY: 'sk-proj-harimport000000000000000000000', OPENAI_BASE_URL: '' };

  it('replays exact, paced as recorded, with no chunk-timing limit', async () => {
    const recorded = fx.freshHome();
    const elsewhere = fx.freshHome();
    const work = mkdtempSync(join(fx.work, 'ws-'));
    const rec = await runCli(['record', '--home', recorded, '--trace', 'orig', '--no-workspace', '--intercept', '+tools.example.test', ...fx.routing(), '--', process.execPath, agent], { cwd: work, env });
    expect(rec.code, rec.stderr).toBe(0);
    const file = join(fx.work, 'orig.har');
    const exported = await runCli(['export', 'orig', '--har', file, '--home', recorded]);
    expect(exported.code, exported.stderr).toBe(0);

    const { bundle, limits, skipped } = harToBundle(parseHarText(readFileSync(file, 'utf8'), file), 'from-har');
    expect(skipped).toEqual([]);
    expect(limits.join('\n')).not.toContain('chunk timing');
    const store = await TraceStore.open(join(elsewhere, 'traces'));
    try {
      await importBundle(store, bundle, {});
    } finally {
      await store.close();
    }
    for (const pace of [[], ['--pace', 'recorded']]) {
      const replay = await runCli(['replay', 'from-har', '--home', elsewhere, ...pace, '--', process.execPath, agent], { cwd: work, env: { ...env, OPENAI_API_KEY: 'sk-proj-someoneelse0000000000000000000' } });
      expect(replay.code, replay.stderr).toBe(0);
      expect(replay.stderr).toMatch(/verdict: recorded=3 requests=3 reused=3 exact=3 .* -> PASS/);
    }
  });
});
