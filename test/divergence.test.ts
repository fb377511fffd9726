import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { explainDivergence, MAX_JSON_DIFFERENCES, shorten, type Divergence } from '../src/replay/divergence.js';

interface Req {
  head: Buffer;
  body: Buffer;
}

const head = (requestLine: string, headers: string[]): Buffer => Buffer.from([requestLine, ...headers, '', ''].join('\r\n'), 'latin1');

/** Wraps a payload in chunked framing, `size` bytes per chunk. */
const chunk = (payload: Buffer, size: number): Buffer => {
  const parts: Buffer[] = [];
  for (let i = 0; i < payload.length; i += size) {
    const piece = payload.subarray(i, i + size);
    parts.push(Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n'));
  }
  parts.push(Buffer.from('0\r\n\r\n'));
  return Buffer.concat(parts);
};

interface Options {
  headers?: string[];
  target?: string;
  contentType?: string;
  encoding?: 'gzip' | 'deflate' | 'br';
  chunked?: number;
}

/** A request as the origin received it: head bytes and wire body bytes. */
function request(payload: string | Buffer, options: Options = {}): Req {
  let body = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const headers = ['Host: api.openai.com', `Content-Type: ${options.contentType ?? 'application/json'}`, ...(options.headers ?? [])];
  if (options.encoding === 'gzip') body = gzipSync(body);
  if (options.encoding === 'deflate') body = deflateSync(body);
  if (options.encoding === 'br') body = brotliCompressSync(body);
  if (options.encoding) headers.push(`Content-Encoding: ${options.encoding}`);
  if (options.chunked) {
    body = chunk(body, options.chunked);
    headers.push('Transfer-Encoding: chunked');
  } else {
    headers.push(`Content-Length: ${body.length}`);
  }
  return { head: head(`POST ${options.target ?? '/v1/chat/completions'} HTTP/1.1`, headers), body };
}

const json = (value: unknown, options: Options = {}): Req => request(JSON.stringify(value), options);

const chat = (...contents: string[]) => ({
  model: 'gpt-4o',
  messages: contents.map((content, i) => ({ role: i === 0 ? 'system' : 'user', content })),
});

const noDifference = (d: Divergence): void => {
  expect(d.head).toEqual({ firstDifferentByte: null, differentBytes: 0 });
  expect(d.body).toEqual({ firstDifferentByte: null, differentBytes: 0 });
  expect(d.requestLine).toBeNull();
  expect(d.headers).toEqual([]);
  expect(d.json).toEqual([]);
  expect(d.jsonTruncated).toBe(false);
  expect(d.labels).toEqual([]);
};

describe('explainDivergence: locating the difference', () => {
  it('reports nothing for identical requests', () => {
    const a = json(chat('You are helpful.', 'hello'));
    const b = json(chat('You are helpful.', 'hello'));
    const d = explainDivergence(a, b);
    noDifference(d);
    expect(d.summary).toBe('no difference');
  });

  it('locates a changed prompt by JSON path, string offset and body byte', () => {
    const a = json(chat('You are helpful.', 'Summarise the file in one line.'));
    const b = json(chat('You are helpful.', 'Summarise the file in two lines.'));
    const d = explainDivergence(a, b);
    const at = 'Summarise the file in '.length;
    expect(d.json).toEqual([
      {
        path: 'messages[1].content',
        recorded: '"Summarise the file in one line."',
        replayed: '"Summarise the file in two lines."',
        offset: at,
        labels: [],
      },
    ]);
    expect(d.body.firstDifferentByte).toBe(a.body.toString('latin1').indexOf('Summarise the file') + at);
    // Content-Length 138 vs 139: the head differs at its last digit.
    expect([a.body.length, b.body.length]).toEqual([138, 139]);
    expect(d.head).toEqual({ firstDifferentByte: a.head.toString('latin1').indexOf('Content-Length: ') + 'Content-Length: 13'.length, differentBytes: 1 });
    expect(d.headers).toEqual([
      { name: 'content-length', recorded: String(a.body.length), replayed: String(b.body.length), labels: ['content-length-only'] },
    ]);
    expect(d.summary).toBe(`messages[1].content differs at offset ${at}: 'one…' vs 'two…'; +1 more: header content-length`);
  });

  it('shows long strings around the first difference, within 80 characters', () => {
    const filler = 'lorem ipsum dolor sit amet '.repeat(40);
    const d = explainDivergence(json({ prompt: `${filler}ALPHA ${filler}` }), json({ prompt: `${filler}OMEGA ${filler}` }));
    const [diff] = d.json;
    expect(diff!.offset).toBe(filler.length);
    expect(diff!.recorded.length).toBeLessThanOrEqual(80);
    expect(diff!.recorded).toMatch(/^"….*ALPHA.*…"$/);
    expect(diff!.replayed).toMatch(/^"….*OMEGA.*…"$/);
  });

  it('reports a different request line (path)', () => {
    const a = request('{}', { target: '/v1/messages' });
    const b = request('{}', { target: '/v1/messages?beta=true' });
    const d = explainDivergence(a, b);
    expect(d.requestLine).toEqual({ recorded: 'POST /v1/messages HTTP/1.1', replayed: 'POST /v1/messages?beta=true HTTP/1.1' });
    expect(d.head.firstDifferentByte).toBe('POST /v1/messages'.length);
    expect(d.headers).toEqual([]);
    expect(d.body.firstDifferentByte).toBeNull();
    expect(d.summary).toBe("request line: 'POST /v1/messages HTTP/1.1' vs 'POST /v1/messages?beta=true HTTP/1.1'");
  });

  it('counts differing head bytes over the longer length', () => {
    const a = { head: Buffer.from('GET /a HTTP/1.1\r\n\r\n'), body: Buffer.alloc(0) };
    const b = { head: Buffer.from('GET /b HTTP/1.1\r\nX: 1\r\n\r\n'), body: Buffer.alloc(0) };
    const d = explainDivergence(a, b);
    expect(d.head.firstDifferentByte).toBe(5);
    // '/a' vs '/b' (1 byte), then "\r\n" vs "X:" (2 bytes), then the 6 extra bytes.
    expect(d.head.differentBytes).toBe(1 + 2 + (b.head.length - a.head.length));
  });

  it('notices header order or case that changes only the bytes', () => {
    const a = { head: head('GET / HTTP/1.1', ['Host: x', 'Accept: */*']), body: Buffer.alloc(0) };
    const b = { head: head('GET / HTTP/1.1', ['accept: */*', 'Host: x']), body: Buffer.alloc(0) };
    const d = explainDivergence(a, b);
    expect(d.headers).toEqual([]);
    expect(d.head.firstDifferentByte).toBe('GET / HTTP/1.1\r\n'.length);
    expect(d.summary).toMatch(/^head differs at byte 16 \(header order, name case or spacing only\)$/);
  });
});

describe('explainDivergence: cause labels', () => {
  it('labels a different cwd and a timestamp in the prompt', () => {
    const prompt = (dir: string, when: string) => `Working directory: ${dir}/project\nCurrent time: ${when}\nBe brief.`;
    const a = json(chat(prompt('/tmp/run-a1', '2024-05-01T10:00:00Z'), 'list files'));
    const b = json(chat(prompt('/tmp/run-b2', '2024-05-02T11:30:00.123Z'), 'list files'));
    const d = explainDivergence(a, b);
    expect(d.json).toHaveLength(1);
    expect(d.json[0]!.path).toBe('messages[0].content');
    expect(d.json[0]!.offset).toBe('Working directory: /tmp/run-'.length);
    expect(d.json[0]!.labels).toEqual(['absolute-path', 'timestamp']);
    expect(d.labels).toEqual(['absolute-path', 'content-length-only', 'timestamp']);
    expect(d.summary).toMatch(/^messages\[0\]\.content differs at offset 28: '\/tmp\/run-a1…' vs '\/tmp\/run-b2…' \(absolute-path, timestamp\); \+1 more: header content-length$/);
    expect(d.summary).not.toContain('\n');
  });

  it('labels a path under the given cwd even outside the well-known roots', () => {
    const a = json({ prompt: 'edit /builds/job-17/src/app.ts please' });
    const b = json({ prompt: 'edit /builds/job-18/src/app.ts please' });
    expect(explainDivergence(a, b).labels).toEqual([]);
    const d = explainDivergence(a, b, { recordedCwd: '/builds/job-17', replayedCwd: '/builds/job-18' });
    expect(d.json[0]!.labels).toEqual(['absolute-path']);
  });

  it('labels home, macOS and Windows paths, but not a path that is equal on both sides', () => {
    const label = (x: string, y: string) => explainDivergence(json({ p: x }), json({ p: y })).json[0]!.labels;
    expect(label('/home/alice/code/x.ts', '/home/bob/code/x.ts')).toEqual(['absolute-path']);
    expect(label('file:///Users/alice/x', 'file:///Users/bob/x')).toEqual(['absolute-path']);
    expect(label('C:\\Users\\alice\\proj', 'C:\\Users\\bob\\proj')).toEqual(['absolute-path']);
    expect(label('/var/folders/ab/T/x error 1', '/var/folders/ab/T/x error 2')).toEqual([]);
    expect(label('see /v1/messages', 'see /v1/complete')).toEqual([]);
  });

  it('labels epoch seconds and milliseconds in range, RFC 1123 dates, and not other numbers', () => {
    const labels = (x: unknown, y: unknown) => explainDivergence(json({ v: x }), json({ v: y })).json[0]!.labels;
    expect(labels(1714557600, 1714644000)).toEqual(['timestamp']);
    expect(labels(1714557600123, 1714557600999)).toEqual(['timestamp']);
    expect(labels('at 1714557600.25', 'at 1714557612.5')).toEqual(['timestamp']);
    expect(labels(9999999998, 9999999999)).toEqual([]); // year 2286
    expect(labels(5, 6)).toEqual([]);
    const a = request('x', { contentType: 'text/plain', headers: ['Date: Wed, 01 May 2024 10:00:00 GMT'] });
    const b = request('x', { contentType: 'text/plain', headers: ['Date: Thu, 02 May 2024 11:30:00 GMT'] });
    const d = explainDivergence(a, b);
    expect(d.headers).toEqual([{ name: 'date', recorded: 'Wed, 01 May 2024 10:00:00 GMT', replayed: 'Thu, 02 May 2024 11:30:00 GMT', labels: ['timestamp'] }]);
  });

  it('labels a different uuid', () => {
    const a = json({ metadata: { session_id: '3f2b8c1e-5d4a-4b2c-9e8f-0123456789ab' } });
    const b = json({ metadata: { session_id: 'a9e7d6c5-1b2a-4c3d-8e9f-fedcba987654' } });
    const d = explainDivergence(a, b);
    expect(d.json).toMatchObject([{ path: 'metadata.session_id', offset: 0, labels: ['uuid'] }]);
    expect(d.labels).toEqual(['uuid']);
  });

  it('labels tool-call ids (OpenAI call_…, tool_call_id fields, Anthropic toolu_…)', () => {
    const convo = (id: string) => ({
      model: 'gpt-4o',
      messages: [
        { role: 'user', content: 'read the file' },
        { role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'read', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: id, content: 'contents' },
      ],
    });
    const d = explainDivergence(json(convo('call_abc')), json(convo('call_xyz')));
    expect(d.json.map((j) => [j.path, j.offset, j.labels])).toEqual([
      ['messages[1].tool_calls[0].id', 5, ['tool-call-id']],
      ['messages[2].tool_call_id', 5, ['tool-call-id']],
    ]);
    expect(d.labels).toEqual(['tool-call-id']);

    const anthropic = (id: string) => ({
      messages: [
        { role: 'assistant', content: [{ type: 'tool_use', id, name: 'bash', input: {} }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: id, content: 'ok' }] },
      ],
    });
    const e = explainDivergence(json(anthropic('toolu_01A09q90qw90lq917835lq9')), json(anthropic('toolu_01B7xK2mQp4Zr8sT6vW3yN1')));
    expect(e.json.map((j) => j.labels)).toEqual([['tool-call-id'], ['tool-call-id']]);
    // An id field that is not a tool call's, with a value that is not one either: no such label.
    expect(explainDivergence(json({ id: 'x' }), json({ id: 'y' })).labels).toEqual([]);
  });

  it('labels other generated ids of the same shape as random-id', () => {
    const labels = (x: string, y: string) => explainDivergence(json({ v: x }), json({ v: y })).json[0]!.labels;
    expect(labels('req_011CSHoEeqs5C35K2UUqR7Fy', 'req_011CSHqTf8rWq9Lk3mZx7Pa2')).toEqual(['random-id']);
    expect(labels('chatcmpl-B9MHDbslfCcvsTx2i9b', 'chatcmpl-C1xYzAbcDef9hIjK3lM')).toEqual(['random-id']);
    expect(labels('trace 9f86d081884c7d65', 'trace 2c26b46b68ffc68f')).toEqual(['random-id']);
    expect(labels('k=Ab3dEf6hIj9kLm2nOp5qRs', 'k=Zy8xWv5uTs2rQp9oNm6lKj')).toEqual(['random-id']);
    // Different prefixes are different kinds of thing, not a regenerated id.
    expect(labels('req_a1b2c3d4e5', 'msg_a1b2c3d4e5')).toEqual([]);
    // Plain words are not ids.
    expect(labels('the quick brown fox', 'the quick green fox')).toEqual([]);
  });

  it('labels retry-count and sdk-version headers', () => {
    const base = JSON.stringify(chat('hi'));
    const retry = explainDivergence(request(base, { headers: ['X-Stainless-Retry-Count: 0'] }), request(base, { headers: ['X-Stainless-Retry-Count: 1'] }));
    expect(retry.headers).toEqual([{ name: 'x-stainless-retry-count', recorded: '0', replayed: '1', labels: ['retry-count-header'] }]);
    expect(retry.body.firstDifferentByte).toBeNull();
    expect(retry.summary).toBe("header x-stainless-retry-count: '0' vs '1' (retry-count-header)");

    const sdk = explainDivergence(
      request(base, { headers: ['User-Agent: OpenAI/JS 4.20.0', 'X-Stainless-Package-Version: 4.20.0', 'X-Stainless-Runtime-Version: v20.11.0'] }),
      request(base, { headers: ['User-Agent: OpenAI/JS 4.21.1', 'X-Stainless-Package-Version: 4.21.1', 'X-Stainless-Runtime-Version: v22.1.0'] }),
    );
    expect(sdk.headers.map((h) => [h.name, h.labels])).toEqual([
      ['user-agent', ['sdk-version-header']],
      ['x-stainless-package-version', ['sdk-version-header']],
      ['x-stainless-runtime-version', ['sdk-version-header']],
    ]);
    expect(sdk.labels).toEqual(['sdk-version-header']);
    expect(sdk.summary).toBe("header user-agent: 'OpenAI/JS 4.20.0' vs 'OpenAI/JS 4.21.1' (sdk-version-header); +2 more: header x-stainless-package-version, header x-stainless-runtime-version");

    // A header present on one side only still gets its name's label.
    const added = explainDivergence(request(base), request(base, { headers: ['anthropic-client-version: 0.30.1'] }));
    expect(added.headers).toEqual([{ name: 'anthropic-client-version', recorded: null, replayed: '0.30.1', labels: ['sdk-version-header'] }]);
    expect(added.summary).toBe("header anthropic-client-version: (absent) vs '0.30.1' (sdk-version-header)");
  });

  it('labels content-length-only when Content-Length is the only header difference', () => {
    const body = Buffer.from('{"a":1}');
    const a = { head: head('POST /v1 HTTP/1.1', ['Host: x', 'Content-Length: 7']), body };
    const b = { head: head('POST /v1 HTTP/1.1', ['Host: x', 'Content-Length: 8']), body };
    const d = explainDivergence(a, b);
    expect(d.headers).toEqual([{ name: 'content-length', recorded: '7', replayed: '8', labels: ['content-length-only'] }]);
    expect(d.labels).toEqual(['content-length-only']);
    expect(d.summary).toBe("header content-length: '7' vs '8' (content-length-only)");

    // A length-changing volatile value: the header difference is explained by the body's.
    const e = explainDivergence(json({ cwd: '/tmp/a' }), json({ cwd: '/tmp/abc' }));
    expect(e.headers.map((h) => [h.name, h.labels])).toEqual([['content-length', ['content-length-only']]]);
    expect(e.labels).toEqual(['absolute-path', 'content-length-only']);
    expect(e.summary).toMatch(/^cwd differs at offset 6: '\/tmp\/a' vs '\/tmp\/abc' \(absolute-path\); \+1 more: header content-length$/);

    // Not "only" when another header differs too.
    const f = explainDivergence(json({ x: 1 }, { headers: ['X-Stainless-Retry-Count: 0'] }), json({ x: 10 }, { headers: ['X-Stainless-Retry-Count: 1'] }));
    expect(f.labels).toEqual(['retry-count-header']);
  });

  it('never prints a value the recording holds redacted', () => {
    const secret = ['sk', 'live', 'abcdefghijklmnopqrstuvwx'].join('-');
    const a = request('{}', { headers: ['Authorization: [REDACTED:header:authorization]'] });
    const b = request('{}', { headers: [`Authorization: Bearer ${secret}`] });
    const d = explainDivergence(a, b);
    expect(JSON.stringify(d)).not.toContain(secret);
    expect(d.headers[0]).toMatchObject({ name: 'authorization', recorded: '[REDACTED:header:authorization]' });
  });
});

describe('explainDivergence: bodies', () => {
  const prompt = (n: number) => JSON.stringify(chat('You are helpful.', `Question number ${n}, answer briefly.`));

  it('compares chunked and gzip bodies decoded', () => {
    const plain = request(prompt(1));
    for (const options of [{ encoding: 'gzip', chunked: 7 }, { encoding: 'gzip' }, { chunked: 3 }, { encoding: 'deflate' }, { encoding: 'br', chunked: 5 }] as Options[]) {
      const d = explainDivergence(plain, request(prompt(1), options));
      expect(d.body).toEqual({ firstDifferentByte: null, differentBytes: 0 });
      expect(d.json).toEqual([]);
    }
    const d = explainDivergence(request(prompt(1), { encoding: 'gzip', chunked: 16 }), request(prompt(2), { encoding: 'gzip', chunked: 9 }));
    expect(d.body.firstDifferentByte).toBe(prompt(1).indexOf('number 1') + 'number '.length);
    expect(d.body.differentBytes).toBe(1);
    expect(d.json).toMatchObject([{ path: 'messages[1].content', offset: 'Question number '.length }]);
    expect(d.headers.map((h) => h.name)).toEqual([]); // both gzip + chunked: framing headers are equal
  });

  it('says when only the framing or compression of equal entities differs', () => {
    const d = explainDivergence(request(prompt(1), { chunked: 10 }), request(prompt(1), { chunked: 20 }));
    expect(d.head.firstDifferentByte).toBeNull();
    expect(d.body.firstDifferentByte).toBeNull();
    expect(d.summary).toBe('body wire bytes differ at byte 0 but decode to the same entity (chunk framing or compression)');
  });

  it('compares a body that does not decode as it is', () => {
    const bogus = { head: head('POST /x HTTP/1.1', ['Content-Encoding: gzip', 'Content-Length: 9']), body: Buffer.from('not gzip!') };
    const other = { head: bogus.head, body: Buffer.from('not gzip?') };
    const d = explainDivergence(bogus, other);
    expect(d.body).toEqual({ firstDifferentByte: 8, differentBytes: 1 });
    expect(d.summary).toBe("body differs at byte 8: 'gzip!' vs 'gzip?'");
  });

  it('describes non-JSON text bodies with byte offsets and labels', () => {
    const form = (ts: string) => `grant_type=client_credentials&nonce=${ts}&scope=read`;
    const a = request(form('2024-05-01T10:00:00Z'), { contentType: 'application/x-www-form-urlencoded' });
    const b = request(form('2024-05-01T10:00:07Z'), { contentType: 'application/x-www-form-urlencoded' });
    const d = explainDivergence(a, b);
    expect(d.json).toEqual([]);
    expect(d.body.firstDifferentByte).toBe(form('').length - '&scope=read'.length + '2024-05-01T10:00:0'.length);
    expect(d.labels).toEqual(['timestamp']);
    expect(d.body.firstDifferentByte).toBe(54);
    expect(d.summary).toBe("body differs at byte 54: '2024-05-01T10:00:00Z…' vs '2024-05-01T10:00:07Z…' (timestamp)");
  });

  it('describes binary bodies without printing them', () => {
    const a = request(Buffer.from([0, 1, 2, 3, 4, 5]), { contentType: 'application/octet-stream' });
    const b = request(Buffer.from([0, 1, 9, 3, 4, 5, 6]), { contentType: 'application/octet-stream' });
    const d = explainDivergence(a, b);
    expect(d.body).toEqual({ firstDifferentByte: 2, differentBytes: 2 });
    expect(d.summary).toMatch(/^body differs at byte 2 \(2 bytes differ; 6 vs 7 bytes; binary\)/);
  });

  it('falls back to bytes when only one side parses as JSON', () => {
    const d = explainDivergence(request('{"a":1}'), request('{"a":1'));
    expect(d.json).toEqual([]);
    expect(d.body).toEqual({ firstDifferentByte: 6, differentBytes: 1 });
  });

  it('says when bodies differ only in JSON formatting', () => {
    const d = explainDivergence(request('{"a":1,"b":2}'), request('{"b": 2, "a": 1}'));
    expect(d.json).toEqual([]);
    expect(d.body.firstDifferentByte).toBe(2);
    expect(d.summary).toMatch(/^body differs at byte 2 but parses to equal JSON \(formatting or key order\)/);
  });
});

describe('explainDivergence: JSON structure', () => {
  it('writes paths with dotted identifiers, brackets for other keys, $ for the root', () => {
    const d = explainDivergence(
      json({ 'weird key': 1, 'x-y': { a: [1, 2] }, ok: true }),
      json({ 'weird key': 2, 'x-y': { a: [1, 3] }, ok: false }),
    );
    expect(d.json.map((j) => j.path)).toEqual(['["weird key"]', '["x-y"].a[1]', 'ok']);
    expect(explainDivergence(json([1]), json({ a: 1 })).json).toEqual([{ path: '$', recorded: '[1]', replayed: '{"a":1}', labels: [] }]);
  });

  it('reports absent keys (recorded order, then new keys), extra array items and type changes', () => {
    const d = explainDivergence(json({ a: 1, b: 'x', c: [1, 2, 3] }), json({ c: [1, 2], b: 7, d: null }));
    expect(d.json).toEqual([
      { path: 'a', recorded: '1', replayed: '(absent)', labels: [] },
      { path: 'b', recorded: '"x"', replayed: '7', labels: [] },
      { path: 'c[2]', recorded: '3', replayed: '(absent)', labels: [] },
      { path: 'd', recorded: '(absent)', replayed: 'null', labels: [] },
    ]);
    expect(d.summary).toBe('a: 1 vs (absent); +4 more: b, c[2], d, …');
  });

  it(`caps the JSON differences at ${MAX_JSON_DIFFERENCES}`, () => {
    const d = explainDivergence(json({ v: Array.from({ length: 200 }, (_, i) => i) }), json({ v: Array.from({ length: 200 }, (_, i) => i + 1) }));
    expect(d.json).toHaveLength(MAX_JSON_DIFFERENCES);
    expect(d.jsonTruncated).toBe(true);
    expect(d.summary).toContain('+');
  });

  it('survives deep nesting', () => {
    const nest = (leaf: string) => `${'['.repeat(50_000)}${leaf}${']'.repeat(50_000)}`;
    const d = explainDivergence(request(nest('{"k":1}')), request(nest('{"k":2}')));
    expect(d.json).toHaveLength(1);
    expect(d.json[0]!.path.endsWith('[0][0].k')).toBe(true);
    expect(d.json[0]!.path.length).toBeLessThanOrEqual(400);
  });

  it('previews large values briefly', () => {
    const big = { messages: Array.from({ length: 10_000 }, (_, i) => ({ role: 'user', content: `message ${i}` })) };
    const d = explainDivergence(json({}), json({ big }));
    expect(d.json).toHaveLength(1);
    expect(d.json[0]!.replayed.length).toBeLessThanOrEqual(80);
    expect(d.json[0]!.replayed.endsWith('…')).toBe(true);
  });

  it('keeps the summary on one line', () => {
    const d = explainDivergence(json({ p: 'line one\nline two\n' }), json({ p: 'line one\nline 2\n' }));
    expect(d.summary).not.toMatch(/[\r\n]/);
    expect(d.summary).toBe("p differs at offset 14: 'two…' vs '2…'; +1 more: header content-length");
  });
});

describe('explainDivergence: large bodies', () => {
  it('diffs a 5 MB JSON body quickly', () => {
    const filler = 'x'.repeat(5 * 1024 * 1024);
    const a = json(chat('You are helpful.', `${filler} recorded at /tmp/run-a1/out.txt`));
    const b = json(chat('You are helpful.', `${filler} recorded at /tmp/run-b2/out.txt`));
    const t0 = performance.now();
    const d = explainDivergence(a, b);
    const ms = performance.now() - t0;
    expect(d.json).toMatchObject([{ path: 'messages[1].content', offset: filler.length + ' recorded at /tmp/run-'.length, labels: ['absolute-path'] }]);
    expect(d.body.differentBytes).toBe(2);
    expect(ms).toBeLessThan(2000);
  });

  it('diffs a 5 MB text body and a large shifted array quickly', () => {
    const text = 'word '.repeat(1024 * 1024);
    const t0 = performance.now();
    const d = explainDivergence(request(`A${text}`, { contentType: 'text/plain' }), request(`B${text}!`, { contentType: 'text/plain' }));
    expect(d.body).toEqual({ firstDifferentByte: 0, differentBytes: 2 });
    const items = Array.from({ length: 100_000 }, (_, i) => ({ i }));
    const e = explainDivergence(json({ items }), json({ items: [{ i: -1 }, ...items] }));
    expect(e.jsonTruncated).toBe(true);
    expect(performance.now() - t0).toBeLessThan(2000);
  });
});

describe('shorten', () => {
  it('keeps the start and marks the cut', () => {
    expect(shorten('short')).toBe('short');
    expect(shorten('a'.repeat(80))).toBe('a'.repeat(80));
    expect(shorten('a'.repeat(81))).toBe(`${'a'.repeat(79)}…`);
    expect(shorten('abcdef', 4)).toBe('abc…');
    // never half a surrogate pair
    expect(shorten('ab😀cd', 4)).toBe('ab…');
  });
});
