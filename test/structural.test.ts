import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { headerValue, RequestParser, ResponseParser, type MessageHead, type ParseEvent } from '../src/proxy/http1.js';
import { sseFrames } from '../src/trace/inspect.js';
import { decodeExchange, encodeExchange, type ExchangeRecord, type StoredExchange } from '../src/trace/schema.js';
import { DEFAULT_STRUCTURAL, structuralExchange, structuralRequest, type StructuralOptions } from '../src/trace/structural.js';

// Canary values are assembled at run time, so the only copies are the ones the test feeds in.
const CANARY = ['secret', 'customer', 'text', '123'].join('-');
const CANARY2 = ['other', 'private', 'words'].join('-');
const CANARY_HEADER = ['X', 'Canary', 'Header', 'Name'].join('-');
const ZERO: StructuralOptions = { numbers: 'zero', booleans: 'zero' };

const head = (...lines: string[]): Buffer => Buffer.from(lines.map((l) => `${l}\r\n`).join('') + '\r\n', 'latin1');
const json = (v: unknown): Buffer => Buffer.from(JSON.stringify(v));
const text = (b: Buffer): string => b.toString('latin1');

function postHead(body: Buffer, extra: string[] = [], target = '/v1/chat/completions'): Buffer {
  return head(`POST ${target} HTTP/1.1`, 'Host: api.openai.com', 'Content-Type: application/json', `Content-Length: ${body.length}`, ...extra);
}

function chatBody(content = CANARY, extra: Record<string, unknown> = {}): Buffer {
  return json({ model: 'gpt-4o-mini', temperature: 0.7, stream: true, n: 2, messages: [{ role: 'user', content }], ...extra });
}

function reduce(body: Buffer, extra: string[] = [], options = DEFAULT_STRUCTURAL): { head: Buffer; body: Buffer } {
  return structuralRequest(postHead(body, extra), body, options);
}

/** Parses a whole message with the project's parser; returns the head and the de-framed body. */
function parse<H extends MessageHead>(parser: RequestParser | ResponseParser, bytes: Buffer): { head: H; body: Buffer; ended: boolean } {
  const events = parser.push(bytes) as ParseEvent<H>[];
  const headEvent = events.find((e) => e.type === 'head');
  if (!headEvent || headEvent.type !== 'head') throw new Error('no head parsed');
  const body = Buffer.concat(events.flatMap((e) => (e.type === 'body' ? e.payload : [])));
  return { head: headEvent.head, body, ended: events.some((e) => e.type === 'end') };
}

function expectNoCanary(...buffers: Buffer[]): void {
  for (const b of buffers) {
    for (const c of [CANARY, CANARY2]) {
      expect(b.includes(c)).toBe(false);
      expect(b.includes(Buffer.from(c, 'utf16le'))).toBe(false);
    }
  }
}

function record(partial: Partial<ExchangeRecord>, ex: { requestHead: Buffer; requestBody: Buffer; responseHead: Buffer; responseBody: Buffer }, chunks: [number, number][]): ExchangeRecord {
  return {
    seq: 1,
    kind: 'http',
    state: 'complete',
    origin: { scheme: 'https', host: 'api.openai.com', port: 443 },
    route: 'connect',
    startedAt: 1_700_000_000_000,
    timings: { requestEndMs: 1, responseHeadMs: 5, endMs: chunks.at(-1)?.[0] ?? 5 },
    request: {
      method: 'POST',
      target: '/v1/chat/completions',
      droppedHeaders: ['Proxy-Connection'],
      headLength: ex.requestHead.length,
      bodyLength: ex.requestBody.length,
      flags: [],
      hash: 'f'.repeat(64),
    },
    response: { status: 200, headLength: ex.responseHead.length, bodyLength: ex.responseBody.length, flags: [], chunks },
    redactions: [],
    ...partial,
  };
}

function exchange(responseHead: Buffer, pieces: { at: number; bytes: Buffer }[], request = chatBody(), partial: Partial<ExchangeRecord> = {}): StoredExchange {
  const requestHead = postHead(request, [`${CANARY_HEADER}: ${CANARY}`]);
  const responseBody = Buffer.concat(pieces.map((p) => p.bytes));
  const parts = { requestHead, requestBody: request, responseHead, responseBody };
  const chunks = pieces.map((p): [number, number] => [p.at, p.bytes.length]);
  return { record: record(partial, parts, chunks), ...parts };
}

/** The reduced body cut into the pieces replay writes, with their offsets. */
function pieces(ex: StoredExchange): { at: number; text: string }[] {
  let pos = 0;
  return ex.record.response!.chunks.map(([at, length]) => {
    const part = ex.responseBody.subarray(pos, pos + length);
    pos += length;
    return { at, text: part.toString('utf8') };
  });
}

function expectWellFormedExchange(ex: StoredExchange): void {
  const r = ex.record;
  expect(r.request!.headLength).toBe(ex.requestHead.length);
  expect(r.request!.bodyLength).toBe(ex.requestBody.length);
  expect(r.response!.headLength).toBe(ex.responseHead.length);
  expect(r.response!.bodyLength).toBe(ex.responseBody.length);
  expect(r.request!.flags).toContain('structural');
  expect(r.response!.flags).toContain('structural');
  expect(r.request!.hash).toBeUndefined();
  expect(r.response!.chunks.reduce((s, [, l]) => s + l, 0)).toBe(ex.responseBody.length);
  const req = parse<MessageHead>(new RequestParser(), Buffer.concat([ex.requestHead, ex.requestBody]));
  expect(req.ended).toBe(true);
  expect(req.body.equals(ex.requestBody)).toBe(true);
  const parser = new ResponseParser();
  parser.expectResponseTo(r.request!.method);
  const res = parse<MessageHead>(parser, Buffer.concat([ex.responseHead, ex.responseBody]));
  expect(res.ended).toBe(true);
  expect(res.body.equals(ex.responseBody)).toBe(true);
  expect(headerValue(res.head, 'content-length')).toBe(String(ex.responseBody.length));
  expect(headerValue(res.head, 'transfer-encoding')).toBeUndefined();
  expect(headerValue(res.head, 'content-encoding')).toBeUndefined();
  // the stored form survives the store's encoding
  const round = decodeExchange(encodeExchange(ex));
  expect(round.responseBody.equals(ex.responseBody)).toBe(true);
  expect(round.requestHead.equals(ex.requestHead)).toBe(true);
}

describe('structuralRequest', () => {
  it('is deterministic', () => {
    const body = chatBody();
    const a = reduce(body, [`Authorization: Bearer ${CANARY}`]);
    const b = reduce(Buffer.from(body), [`Authorization: Bearer ${CANARY}`]);
    expect(a.head.equals(b.head)).toBe(true);
    expect(a.body.equals(b.body)).toBe(true);
  });

  it('reduces JSON to its shape: keys kept, strings as same-length filler, numbers and booleans kept by default', () => {
    const { body } = reduce(chatBody());
    const parsed = JSON.parse(body.toString()) as { model: string; temperature: number; stream: boolean; n: number; messages: { role: string; content: string }[] };
    expect(Object.keys(parsed)).toEqual(['model', 'temperature', 'stream', 'n', 'messages']);
    expect(parsed.model).toBe('x'.repeat('gpt-4o-mini'.length));
    expect(parsed.messages).toEqual([{ role: 'xxxx', content: 'x'.repeat(CANARY.length) }]);
    expect(parsed.temperature).toBe(0.7);
    expect(parsed.stream).toBe(true);
    expect(parsed.n).toBe(2);
    expect(body.toString()).not.toMatch(/\s/); // compact
  });

  it('measures strings in UTF-16 code units and keeps null', () => {
    const { body } = reduce(json({ a: 'é😀', b: null, c: [1, 'ab'] }));
    expect(JSON.parse(body.toString())).toEqual({ a: 'xxx', b: null, c: [1, 'xx'] });
  });

  it('zeroes numbers and booleans when configured', () => {
    const { body } = reduce(chatBody(), [], ZERO);
    const parsed = JSON.parse(body.toString()) as Record<string, unknown>;
    expect(parsed.temperature).toBe(0);
    expect(parsed.n).toBe(0);
    expect(parsed.stream).toBe(false);
    const numbersOnly = JSON.parse(reduce(chatBody(), [], { numbers: 'zero', booleans: 'keep' }).body.toString()) as Record<string, unknown>;
    expect(numbersOnly.stream).toBe(true);
    expect(numbersOnly.n).toBe(0);
  });

  it('reduces requests differing only in same-length string content (and secret values) to the same bytes', () => {
    const other = 'x'.repeat(CANARY.length).replace(/x/g, (_, i: number) => String.fromCharCode(97 + (i % 26)));
    const a = reduce(chatBody(CANARY), [`Authorization: Bearer ${CANARY}`, 'X-Request-Id: 0123456789'], DEFAULT_STRUCTURAL);
    const b = reduce(chatBody(other), [`Authorization: Bearer ${other}`, 'X-Request-Id: 9876543210'], DEFAULT_STRUCTURAL);
    expect(a.head.equals(b.head)).toBe(true);
    expect(a.body.equals(b.body)).toBe(true);
  });

  it('reduces requests of another JSON shape differently', () => {
    const base = reduce(chatBody()).body;
    const variants = [
      chatBody(CANARY, { extra: 'key' }), // extra key
      json({ model: 'gpt-4o-mini', temperature: 0.7, stream: true, n: 2, messages: [{ role: 'user', content: CANARY }, { role: 'user', content: CANARY }] }), // array length
      json({ model: 'gpt-4o-mini', temperature: 0.7, stream: true, n: '2', messages: [{ role: 'user', content: CANARY }] }), // type change
      chatBody(CANARY + '!'), // string length
      chatBody(CANARY, { stream: false }), // boolean value (kept by default)
    ];
    for (const v of variants) expect(reduce(v).body.equals(base)).toBe(false);
    // numbers zeroed: a different number is the same shape, a different type is not
    expect(reduce(chatBody(CANARY, { n: 3 }), [], ZERO).body.equals(reduce(chatBody(), [], ZERO).body)).toBe(true);
    expect(reduce(chatBody(CANARY, { n: true }), [], ZERO).body.equals(reduce(chatBody(), [], ZERO).body)).toBe(false);
  });

  it('keeps header names, order and count, and only shape header values', () => {
    const body = chatBody();
    const { head: out } = structuralRequest(
      head(
        'POST /v1/messages HTTP/1.1',
        'Host: api.anthropic.com',
        `${CANARY_HEADER}: ${CANARY}`,
        'Accept: text/event-stream',
        'anthropic-version: 2023-06-01',
        'x-api-key: [REDACTED:header:x-api-key]',
        'Authorization: Bearer [REDACTED:openai-key]',
        `Cookie: session=${CANARY2}`,
        'User-Agent: Anthropic/JS 0.30.1',
        'x-stainless-os: Linux',
        'Content-Type: application/json',
        `Content-Length: ${body.length}`,
        'X-Empty:',
      ),
      body,
      DEFAULT_STRUCTURAL,
    );
    const lines = text(out).split('\r\n');
    const reduced = structuralRequest(postHead(body), body, DEFAULT_STRUCTURAL).body;
    expect(lines).toEqual([
      'POST /v1/messages HTTP/1.1',
      'Host: api.anthropic.com',
      `${CANARY_HEADER}: ${'x'.repeat(CANARY.length)}`,
      'Accept: text/event-stream',
      'anthropic-version: 2023-06-01',
      'x-api-key: [REDACTED:header:x-api-key]',
      'Authorization: xxxxxxx[REDACTED:openai-key]',
      `Cookie: ${'x'.repeat(`session=${CANARY2}`.length)}`,
      `User-Agent: ${'x'.repeat('Anthropic/JS 0.30.1'.length)}`,
      'x-stainless-os: xxxxx',
      'Content-Type: application/json',
      `Content-Length: ${reduced.length}`,
      'X-Empty:',
      '',
      '',
    ]);
    expectNoCanary(out);
  });

  it('keeps method and path, fills query values (names kept)', () => {
    const { head: out } = structuralRequest(head(`GET /v1/search/items?q=${CANARY}&limit=10&flag&key=[REDACTED:query:key] HTTP/1.1`, 'Host: tools.example.test'), Buffer.alloc(0), DEFAULT_STRUCTURAL);
    expect(text(out).split('\r\n')[0]).toBe(`GET /v1/search/items?q=${'x'.repeat(CANARY.length)}&limit=xx&flag&key=[REDACTED:query:key] HTTP/1.1`);
    expect(text(out)).not.toMatch(/content-length/i); // a bodiless request gets no framing it did not have
    expectNoCanary(out);
  });

  it('decodes chunked and gzip request bodies, dropping their framing headers', () => {
    const plain = chatBody();
    const gz = gzipSync(plain);
    const chunked = Buffer.concat([Buffer.from(`${(10).toString(16)}\r\n`), gz.subarray(0, 10), Buffer.from(`\r\n${(gz.length - 10).toString(16)}\r\n`), gz.subarray(10), Buffer.from('\r\n0\r\n\r\n')]);
    const out = structuralRequest(
      head('POST /v1/chat/completions HTTP/1.1', 'Host: api.openai.com', 'Content-Type: application/json', 'Content-Encoding: gzip', 'Transfer-Encoding: chunked'),
      chunked,
      DEFAULT_STRUCTURAL,
    );
    const expected = reduce(plain);
    expect(out.body.equals(expected.body)).toBe(true);
    expect(text(out.head)).not.toMatch(/transfer-encoding|content-encoding/i);
    const parsed = parse<MessageHead>(new RequestParser(), Buffer.concat([out.head, out.body]));
    expect(parsed.ended).toBe(true);
    expect(headerValue(parsed.head, 'content-length')).toBe(String(out.body.length));
    expect(parsed.body.equals(out.body)).toBe(true);
    expectNoCanary(out.head, out.body);
  });

  it('fills non-JSON bodies to their length, keeps content type, fills a multipart boundary', () => {
    const body = Buffer.from(`--b0undary${CANARY}\r\nContent-Disposition: form-data; name="file"\r\n\r\n${CANARY2}\r\n--b0undary${CANARY}--\r\n`);
    const out = structuralRequest(head('POST /upload HTTP/1.1', 'Host: x.test', `Content-Type: multipart/form-data; boundary=b0undary${CANARY}`, `Content-Length: ${body.length}`), body, DEFAULT_STRUCTURAL);
    expect(out.body.equals(Buffer.alloc(body.length, 'x'))).toBe(true);
    expect(text(out.head)).toContain(`Content-Type: multipart/form-data; boundary=${'x'.repeat(`b0undary${CANARY}`.length)}\r\n`);
    expectNoCanary(out.head, out.body);
  });

  it('keeps form field names, fills their values', () => {
    const body = Buffer.from(`grant_type=refresh_token&refresh_token=${CANARY}`);
    const out = structuralRequest(head('POST /oauth/token HTTP/1.1', 'Host: x.test', 'Content-Type: application/x-www-form-urlencoded', `Content-Length: ${body.length}`), body, DEFAULT_STRUCTURAL);
    expect(out.body.toString()).toBe(`grant_type=xxxxxxxxxxxxx&refresh_token=${'x'.repeat(CANARY.length)}`);
  });

  it('treats a JSON body without a JSON content type as JSON', () => {
    const body = json({ q: CANARY });
    const out = structuralRequest(head('POST /x HTTP/1.1', 'Host: x.test', 'Content-Type: text/plain', `Content-Length: ${body.length}`), body, DEFAULT_STRUCTURAL);
    expect(out.body.toString()).toBe(JSON.stringify({ q: 'x'.repeat(CANARY.length) }));
  });
});

describe('structuralExchange', () => {
  const sseHead = head('HTTP/1.1 200 OK', 'Content-Type: text/event-stream; charset=utf-8', 'Transfer-Encoding: chunked', `X-Request-Id: req_${CANARY}`, 'Date: Tue, 01 Dec 2026 10:00:00 GMT');
  const chunk = (s: string | Buffer): Buffer => {
    const b = Buffer.isBuffer(s) ? s : Buffer.from(s);
    return Buffer.concat([Buffer.from(`${b.length.toString(16)}\r\n`), b, Buffer.from('\r\n')]);
  };
  const delta = (content: string): string => `data: ${JSON.stringify({ id: `chatcmpl-${CANARY2}`, choices: [{ index: 0, delta: { content } }] })}\n\n`;

  it('keeps SSE frames, event names, [DONE] and each frame\'s arrival offset', () => {
    const frames = [
      `event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: { id: CANARY2 } })}\n\n`,
      ': keep-alive comment\n\n',
      delta(CANARY),
      `id: ${CANARY}\nretry: 3000\ndata: not json ${CANARY}\n\n`,
      delta('tail'),
      'data: [DONE]\n\n',
    ];
    const all = frames.join('');
    // reads: frame 0 alone; frames 1-2 together; frame 3 split across two reads (completes in the 4th);
    // frames 4 and 5 in two reads with the same offset (one upstream read); the terminating chunk last
    const f3 = frames[3]!;
    const reads = [
      { at: 10, bytes: chunk(frames[0]!) },
      { at: 20, bytes: chunk(frames[1]! + frames[2]!) },
      { at: 30, bytes: chunk(f3.slice(0, 7)) },
      { at: 40, bytes: chunk(f3.slice(7)) },
      { at: 50, bytes: chunk(frames[4]!) },
      { at: 50, bytes: chunk(frames[5]!) },
      { at: 60, bytes: Buffer.from('0\r\n\r\n') },
    ];
    const ex = exchange(sseHead, reads);
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    expectWellFormedExchange(out);
    const body = out.responseBody.toString();
    expect(sseFrames(body)).toHaveLength(sseFrames(all).length);
    expect(sseFrames(body)).toHaveLength(6);
    expect(body.split('\n').length).toBe(all.split('\n').length);
    expect(body).toContain('event: message_start\n');
    expect(body.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(body).toContain(`id: ${'x'.repeat(CANARY.length)}\nretry: xxxx\ndata: ${'x'.repeat(`not json ${CANARY}`.length)}\n\n`);
    expect(body).toContain(': xxxxxxxxxxxxxxxxxx\n\n');
    const reducedFrames = sseFrames(body);
    expect(pieces(out)).toEqual([
      { at: 10, text: `${reducedFrames[0]}\n\n` },
      { at: 20, text: `${reducedFrames[1]}\n\n${reducedFrames[2]}\n\n` },
      { at: 40, text: `${reducedFrames[3]}\n\n` },
      { at: 50, text: `${reducedFrames[4]}\n\n${reducedFrames[5]}\n\n` },
    ]);
    const payload = JSON.parse(reducedFrames[2]!.slice('data: '.length)) as unknown;
    expect(payload).toEqual({ id: 'x'.repeat(`chatcmpl-${CANARY2}`.length), choices: [{ index: 0, delta: { content: 'x'.repeat(CANARY.length) } }] });
    expectNoCanary(out.requestHead, out.requestBody, out.responseHead, out.responseBody, Buffer.from(JSON.stringify(out.record)));
    expect(text(out.requestHead)).toContain(`${CANARY_HEADER}: `);
    expect(text(out.responseHead).split('\r\n')[0]).toBe('HTTP/1.1 200 OK');
    expect(text(out.responseHead)).toContain('Content-Type: text/event-stream; charset=utf-8\r\n');
    expect(structuralExchange(ex, DEFAULT_STRUCTURAL)).toEqual(out); // deterministic
  });

  it('maps frames when a read ends inside a chunk of the chunked framing', () => {
    const frames = [delta(CANARY), delta('second'), 'data: [DONE]\n\n'];
    const wire = Buffer.concat([chunk(frames[0]! + frames[1]!), chunk(frames[2]!), Buffer.from('0\r\n\r\n')]);
    // the first read ends inside the first chunk's data, just after frame 0's blank line
    const cut = wire.indexOf('\r\n') + 2 + Buffer.byteLength(frames[0]!);
    const ex = exchange(sseHead, [{ at: 5, bytes: wire.subarray(0, cut) }, { at: 15, bytes: wire.subarray(cut) }]);
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    expectWellFormedExchange(out);
    const reducedFrames = sseFrames(out.responseBody.toString());
    expect(pieces(out)).toEqual([
      { at: 5, text: `${reducedFrames[0]}\n\n` },
      { at: 15, text: `${reducedFrames[1]}\n\n${reducedFrames[2]}\n\n` },
    ]);
    // the same stream stored with Content-Length framing reduces to the same body
    const plain = Buffer.from(frames.join(''));
    const flat = structuralExchange(exchange(head('HTTP/1.1 200 OK', 'Content-Type: text/event-stream', `Content-Length: ${plain.length}`), [{ at: 5, bytes: plain }]), DEFAULT_STRUCTURAL);
    expect(flat.responseBody.equals(out.responseBody)).toBe(true);
  });

  it('maps SSE frames through gzip to the chunk they completed in', () => {
    const frames = [delta(CANARY), delta('b'), 'data: [DONE]\n\n'];
    const all = Buffer.from(frames.join(''));
    // a compressed stream flushed after each frame, as a streaming server would
    const gz = gzipSync(all);
    const parts = [gz.subarray(0, 12), gz.subarray(12)];
    const ex = exchange(
      head('HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Content-Encoding: gzip', `Content-Length: ${gz.length}`),
      parts.map((bytes, i) => ({ at: 10 * (i + 1), bytes })),
    );
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    expectWellFormedExchange(out);
    expect(sseFrames(out.responseBody.toString())).toHaveLength(3);
    // the whole stream only decodes once its last bytes arrived: every frame leaves at the last offset
    expect(out.record.response!.chunks).toEqual([[20, out.responseBody.length]]);
    expectNoCanary(out.responseBody, out.responseHead);
  });

  it('maps a gzip stream flushed per frame frame by frame', async () => {
    const { createGzip, constants } = await import('node:zlib');
    const frames = [delta(CANARY), delta('bb'), 'data: [DONE]\n\n'];
    const gzip = createGzip();
    const out: Buffer[] = [];
    gzip.on('data', (b: Buffer) => out.push(b));
    const reads: Buffer[] = [];
    for (const f of frames) {
      await new Promise<void>((resolve) => {
        gzip.write(f);
        gzip.flush(constants.Z_SYNC_FLUSH, () => resolve());
      });
      reads.push(Buffer.concat(out.splice(0)));
    }
    await new Promise((resolve) => {
      gzip.on('end', resolve);
      gzip.end();
    });
    reads[reads.length - 1] = Buffer.concat([reads.at(-1)!, ...out.splice(0)]);
    const gz = Buffer.concat(reads);
    const ex = exchange(
      head('HTTP/1.1 200 OK', 'Content-Type: text/event-stream', 'Content-Encoding: gzip', `Content-Length: ${gz.length}`),
      reads.map((bytes, i) => ({ at: 10 * (i + 1), bytes })),
    );
    const reduced = structuralExchange(ex, DEFAULT_STRUCTURAL);
    expectWellFormedExchange(reduced);
    const reducedFrames = sseFrames(reduced.responseBody.toString());
    expect(reducedFrames).toHaveLength(3);
    expect(pieces(reduced)).toEqual(reducedFrames.map((f, i) => ({ at: 10 * (i + 1), text: `${f}\n\n` })));
  });

  it('reduces a JSON response with proportional chunk boundaries and no stale framing', () => {
    const body = json({ id: CANARY, choices: [{ message: { content: CANARY2 } }], usage: { prompt_tokens: 12, completion_tokens: 5 } });
    const gz = gzipSync(body);
    const ex = exchange(head('HTTP/1.1 200 OK', 'Content-Type: application/json', 'Content-Encoding: gzip', `Content-Length: ${gz.length}`, `Set-Cookie: s=${CANARY}`), [{ at: 42, bytes: gz }]);
    const out = structuralExchange(ex, ZERO);
    expectWellFormedExchange(out);
    expect(JSON.parse(out.responseBody.toString())).toEqual({ id: 'x'.repeat(CANARY.length), choices: [{ message: { content: 'x'.repeat(CANARY2.length) } }], usage: { prompt_tokens: 0, completion_tokens: 0 } });
    expect(out.record.response!.chunks).toEqual([[42, out.responseBody.length]]);
    expectNoCanary(out.responseHead, out.responseBody);
  });

  it('keeps every boundary of a filled (length-preserving) body', () => {
    const partsIn = [`hello ${CANARY}\n`, 'more text\n', CANARY2];
    const ex = exchange(head('HTTP/1.1 200 OK', 'Content-Type: text/plain', 'Transfer-Encoding: chunked'), [
      ...partsIn.map((p, i) => ({ at: i + 1, bytes: chunk(p) })),
      { at: 9, bytes: Buffer.from('0\r\n\r\n') },
    ]);
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    expectWellFormedExchange(out);
    expect(out.responseBody.equals(Buffer.alloc(partsIn.join('').length, 'x'))).toBe(true);
    expect(out.record.response!.chunks).toEqual(partsIn.map((p, i) => [i + 1, p.length]));
  });

  it('reduces NDJSON line by line, each line at its offset', () => {
    const lines = [JSON.stringify({ message: { content: CANARY }, done: false }), JSON.stringify({ message: { content: 'a' }, done: false }), JSON.stringify({ done: true, eval_count: 7 })];
    const ex = exchange(head('HTTP/1.1 200 OK', 'Content-Type: application/x-ndjson', 'Transfer-Encoding: chunked'), [
      ...lines.map((l, i) => ({ at: i + 1, bytes: chunk(`${l}\n`) })),
      { at: 4, bytes: Buffer.from('0\r\n\r\n') },
    ]);
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    expectWellFormedExchange(out);
    const reduced = out.responseBody.toString().split('\n');
    expect(reduced).toHaveLength(4);
    expect(JSON.parse(reduced[2]!)).toEqual({ done: true, eval_count: 7 });
    expect(pieces(out).map((p) => p.at)).toEqual([1, 2, 3]);
    expectNoCanary(out.responseBody);
  });

  it('keeps a cut-off recording cut off: the head announces more than the body holds', () => {
    const ex = exchange(sseHead, [{ at: 10, bytes: chunk(delta(CANARY)) }, { at: 20, bytes: chunk('data: {"a"') }], chatBody(), {
      state: 'incomplete',
      error: { code: 'ECONNRESET', message: 'socket hang up', phase: 'response' },
    });
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    const parser = new ResponseParser();
    parser.expectResponseTo('POST');
    const parsed = parse<MessageHead>(parser, Buffer.concat([out.responseHead, out.responseBody]));
    expect(parsed.ended).toBe(false);
    expect(Number(headerValue(parsed.head, 'content-length'))).toBeGreaterThan(out.responseBody.length);
    expect(out.record.response!.chunks.reduce((s, [, l]) => s + l, 0)).toBe(out.responseBody.length);
    expect(pieces(out).map((p) => p.at)).toEqual([10, 20]);
  });

  it('leaves a bodiless response bodiless (HEAD, 204)', () => {
    const ex = exchange(head('HTTP/1.1 204 No Content', `X-Trace: ${CANARY}`), []);
    ex.record.response!.status = 204;
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    expect(text(out.responseHead)).toBe(`HTTP/1.1 204 No Content\r\nX-Trace: ${'x'.repeat(CANARY.length)}\r\n\r\n`);
    expect(out.record.response!.chunks).toEqual([]);
    // a response to HEAD keeps the length it announced (a number, not data) and gets no body
    const headEx = exchange(head('HTTP/1.1 200 OK', 'Content-Type: application/json', 'Content-Length: 1234', `ETag: "${CANARY}"`), []);
    headEx.record.request!.method = 'HEAD';
    const headOut = structuralExchange(headEx, DEFAULT_STRUCTURAL);
    expect(text(headOut.responseHead)).toBe(`HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1234\r\nETag: ${'x'.repeat(CANARY.length + 2)}\r\n\r\n`);
    const parser = new ResponseParser();
    parser.expectResponseTo('HEAD');
    expect(parse<MessageHead>(parser, headOut.responseHead).ended).toBe(true);
  });

  it('passes error and tunnel records through unchanged', () => {
    const empty = Buffer.alloc(0);
    const base = { requestHead: empty, requestBody: empty, responseHead: empty, responseBody: empty };
    const error: StoredExchange = { record: { ...record({ kind: 'error', error: { code: 'ECONNREFUSED', message: 'refused', phase: 'connect' } }, base, []), request: undefined, response: undefined }, ...base };
    const tunnel: StoredExchange = { record: { ...record({ kind: 'tunnel', tunnel: { bytesUp: 1, bytesDown: 2, durationMs: 3 } }, base, []), request: undefined, response: undefined }, ...base };
    expect(structuralExchange(error, DEFAULT_STRUCTURAL)).toBe(error);
    expect(structuralExchange(tunnel, DEFAULT_STRUCTURAL)).toBe(tunnel);
  });

  it('stores the request exactly as structuralRequest reduces it, with the query filled in the record target', () => {
    const ex = exchange(head('HTTP/1.1 200 OK', 'Content-Type: application/json', 'Content-Length: 2'), [{ at: 3, bytes: Buffer.from('{}') }]);
    ex.requestHead = head(`POST /v1/chat/completions?user=${CANARY} HTTP/1.1`, 'Host: api.openai.com', 'Content-Type: application/json', `Content-Length: ${ex.requestBody.length}`);
    ex.record.request!.target = `/v1/chat/completions?user=${CANARY}`;
    ex.record.request!.headLength = ex.requestHead.length;
    const out = structuralExchange(ex, DEFAULT_STRUCTURAL);
    const direct = structuralRequest(ex.requestHead, ex.requestBody, DEFAULT_STRUCTURAL);
    expect(out.requestHead.equals(direct.head)).toBe(true);
    expect(out.requestBody.equals(direct.body)).toBe(true);
    expect(out.record.request!.target).toBe(`/v1/chat/completions?user=${'x'.repeat(CANARY.length)}`);
    expect(text(out.requestHead).split('\r\n')[0]).toBe(`POST ${out.record.request!.target} HTTP/1.1`);
    expectWellFormedExchange(out);
    expectNoCanary(Buffer.from(JSON.stringify(out.record)));
    // reducing again changes nothing but the (already present) flag
    const twice = structuralExchange(out, DEFAULT_STRUCTURAL);
    expect(twice.requestHead.equals(out.requestHead)).toBe(true);
    expect(twice.responseBody.equals(out.responseBody)).toBe(true);
    expect(twice.record.response!.flags).toEqual(out.record.response!.flags);
  });
});
