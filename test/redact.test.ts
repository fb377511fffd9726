import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import {
  buildRuleSet,
  loadRuleSet,
  RedactionRulesError,
  Redactor,
  SECRET_HEADERS,
  type Firing,
  type UserRules,
} from '../src/capture/redact.js';

// Fake secrets are assembled at run time so this file holds no literal token for secret scanners to flag.
const alnum = (n: number, seed = 0): string => {
  const chars = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
  let out = '';
  for (let i = 0; i < n; i++) out += chars[(i * 7 + seed * 13 + 3) % chars.length];
  return out;
};
const upper = (n: number, seed = 0): string => alnum(n, seed).toUpperCase().replace(/[^A-Z0-9]/g, 'Q');
const b64url = (o: object): string => Buffer.from(JSON.stringify(o)).toString('base64url');

const FAKE = {
  openai: (s = 0) => 'sk-' + alnum(48, s),
  openaiProject: (s = 0) => 'sk-' + 'proj-' + alnum(60, s) + '_' + alnum(20, s + 1) + '-' + alnum(30, s + 2),
  anthropic: (s = 0) => 'sk-' + 'ant-' + 'api03-' + alnum(80, s) + '-' + alnum(10, s) + 'AA',
  awsAkia: (s = 0) => 'AKIA' + upper(16, s),
  awsAsia: (s = 0) => 'ASIA' + upper(16, s),
  githubPat: (s = 0) => 'github_' + 'pat_' + alnum(22, s) + '_' + alnum(59, s),
  githubGhp: (s = 0) => 'ghp' + '_' + alnum(36, s),
  githubGho: (s = 0) => 'gho' + '_' + alnum(36, s),
  githubGhs: (s = 0) => 'ghs' + '_' + alnum(36, s),
  google: (s = 0) => 'AIza' + alnum(35, s),
  slack: (s = 0) => 'xox' + 'b-' + '1234567890-' + alnum(24, s),
  jwt: (s = 0) => `${b64url({ alg: 'HS256', typ: 'JWT' })}.${b64url({ sub: alnum(10, s), iat: 1700000000 })}.${alnum(43, s).replace(/[A-C]/g, '_')}`,
};

const rules = buildRuleSet();
const redactor = new Redactor(rules);

const head = (...lines: string[]): Buffer => Buffer.from(lines.map((l) => `${l}\r\n`).join('') + '\r\n', 'latin1');
const reqHead = (headers: string[], target = '/v1/messages'): Buffer => head(`POST ${target} HTTP/1.1`, 'Host: api.example.com', ...headers);
const text = (b: Buffer): string => b.toString('latin1');

function expectNoSecret(fired: Firing[], ...secrets: string[]): void {
  const manifest = JSON.stringify(fired);
  for (const s of secrets) expect(manifest).not.toContain(s);
}

describe('redactHead: secret headers', () => {
  it.each(SECRET_HEADERS.filter((h) => !h.endsWith('authorization')))('replaces the whole value of %s', (name) => {
    const secret = alnum(30);
    // Mixed-case name on the wire: matched case-insensitively, written back untouched.
    const wireName = name.replace(/(^|-)([a-z])/g, (_, d: string, c: string) => d + c.toUpperCase());
    const { head: out, fired } = redactor.redactHead(reqHead([`${wireName}: ${secret}`, 'X-Canary: canary-1']), 'request');
    expect(text(out)).toContain(`\r\n${wireName}: [REDACTED:header:${name}]\r\n`);
    expect(text(out)).toContain('X-Canary: canary-1\r\n');
    expect(text(out)).not.toContain(secret);
    expect(fired).toEqual([{ rule: `header:${name}`, where: `request.header:${name}` }]);
  });

  it('matches header names case-insensitively', () => {
    const { head: out } = redactor.redactHead(reqHead(['X-API-KEY: abc', 'x-Goog-Api-Key: def', 'COOKIE: a=b']), 'request');
    expect(text(out)).toContain('X-API-KEY: [REDACTED:header:x-api-key]\r\n');
    expect(text(out)).toContain('x-Goog-Api-Key: [REDACTED:header:x-goog-api-key]\r\n');
    expect(text(out)).toContain('COOKIE: [REDACTED:header:cookie]\r\n');
  });

  it('keeps the Bearer scheme and odd spacing', () => {
    const secret = FAKE.openaiProject();
    const { head: out, fired } = redactor.redactHead(reqHead([`Authorization:   Bearer  ${secret}  `]), 'request');
    expect(text(out)).toContain('\r\nAuthorization:   Bearer  [REDACTED:header:authorization]  \r\n');
    expect(fired).toEqual([{ rule: 'header:authorization', where: 'request.header:authorization' }]);
  });

  it('keeps the Basic scheme, and the scheme of Proxy-Authorization', () => {
    const basic = Buffer.from('user:pa55word').toString('base64');
    const { head: out } = redactor.redactHead(reqHead([`authorization: Basic ${basic}`, `Proxy-Authorization: Basic ${basic}`]), 'request');
    expect(text(out)).toContain('authorization: Basic [REDACTED:header:authorization]\r\n');
    expect(text(out)).toContain('Proxy-Authorization: Basic [REDACTED:header:proxy-authorization]\r\n');
    expect(text(out)).not.toContain(basic);
  });

  it('keeps an AWS SigV4 scheme but not the credential, and redacts a bare token entirely', () => {
    const sig = `AWS4-HMAC-SHA256 Credential=${FAKE.awsAkia()}/20240101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=${alnum(64)}`;
    const { head: out } = redactor.redactHead(reqHead([`Authorization: ${sig}`]), 'request');
    expect(text(out)).toContain('Authorization: AWS4-HMAC-SHA256 [REDACTED:header:authorization]\r\n');
    const bare = FAKE.anthropic();
    expect(text(redactor.redactHead(reqHead([`Authorization: ${bare}`]), 'request').head)).toContain(
      'Authorization: [REDACTED:header:authorization]\r\n',
    );
    // A "scheme" that is itself a key is not kept.
    expect(text(redactor.redactHead(reqHead([`Authorization: ${bare} extra`]), 'request').head)).toContain(
      'Authorization: [REDACTED:header:authorization]\r\n',
    );
  });

  it('redacts every duplicate header line', () => {
    const out = redactor.redactHead(
      head('HTTP/1.1 200 OK', 'Set-Cookie: session=abc123; Path=/; HttpOnly', 'Content-Type: text/plain', 'set-cookie: csrf=zzz; Secure'),
      'response',
    );
    expect(text(out.head)).toBe(
      'HTTP/1.1 200 OK\r\nSet-Cookie: [REDACTED:header:set-cookie]\r\nContent-Type: text/plain\r\nset-cookie: [REDACTED:header:set-cookie]\r\n\r\n',
    );
    expect(out.fired).toEqual([{ rule: 'header:set-cookie', where: 'response.header:set-cookie' }]);
  });

  it('does not treat organization/project ids as secrets', () => {
    const input = reqHead(['OpenAI-Organization: org-abc123', 'OpenAI-Project: proj_abc', 'anthropic-version: 2023-06-01']);
    const out = redactor.redactHead(input, 'request');
    expect(out.head).toBe(input);
    expect(out.fired).toEqual([]);
  });

  it('finds key shapes in other header values', () => {
    const key = FAKE.githubGhp();
    const { head: out, fired } = redactor.redactHead(reqHead([`X-Custom: token ${key} canary`]), 'request');
    expect(text(out)).toContain('X-Custom: token [REDACTED:github-token] canary\r\n');
    expect(fired).toEqual([{ rule: 'github-token', where: 'request.header:x-custom' }]);
  });

  it('applies user header names', () => {
    const r = new Redactor(buildRuleSet({ headers: ['X-My-Secret'] }));
    const { head: out, fired } = r.redactHead(reqHead(['x-my-secret: hunter2']), 'request');
    expect(text(out)).toContain('x-my-secret: [REDACTED:header:x-my-secret]\r\n');
    expectNoSecret(fired, 'hunter2');
  });

  it('redacts obs-fold continuation lines of a secret header', () => {
    const { head: out } = redactor.redactHead(reqHead(['X-Api-Key: part1', '   part2', 'X-Canary: ok']), 'request');
    expect(text(out)).toContain('X-Api-Key: [REDACTED:header:x-api-key]\r\n   [REDACTED:header:x-api-key]\r\nX-Canary: ok\r\n');
    // No "scheme" is kept on a continuation line.
    const auth = redactor.redactHead(reqHead(['Authorization: Bearer', '\tabc def']), 'request');
    expect(text(auth.head)).toContain('Authorization: [REDACTED:header:authorization]\r\n\t[REDACTED:header:authorization]\r\n');
  });

  it('leaves a head untouched (same Buffer) when nothing fired', () => {
    const input = reqHead(['Content-Type: application/json', 'User-Agent: agent/1.0 (risk-assessment-tool)'], '/v1/chat?q=hello&n=2');
    const out = redactor.redactHead(input, 'request');
    expect(out.head).toBe(input);
    expect(out.head.equals(input)).toBe(true);
    expect(out.fired).toEqual([]);
  });

  it('never touches the status line and keeps empty secret values as they are', () => {
    const input = head('HTTP/1.1 401 Unauthorized', 'Set-Cookie:', 'X-Api-Key:   ');
    expect(redactor.redactHead(input, 'response').head).toBe(input);
  });
});

describe('redactHead: request target', () => {
  it('replaces secret query values and keeps canaries', () => {
    const key = FAKE.google();
    const { head: out, fired } = redactor.redactHead(reqHead([], `/v1beta/models/g:generateContent?key=${key}&q=canary`), 'request');
    expect(text(out).split('\r\n')[0]).toBe('POST /v1beta/models/g:generateContent?key=[REDACTED:query:key]&q=canary HTTP/1.1');
    expect(fired).toEqual([{ rule: 'query:key', where: 'request.query:key' }]);
  });

  it('handles encoded and mixed-case names, many params, empty values and fragments', () => {
    const target = `/x?API%5FKEY=abc&Access_Token=def&token=&sig=s%2Bg%3D&a=1&api_key#frag`;
    const { head: out } = redactor.redactHead(reqHead([], target), 'request');
    expect(text(out).split('\r\n')[0]).toBe(
      'POST /x?API%5FKEY=[REDACTED:query:api_key]&Access_Token=[REDACTED:query:access_token]&token=&sig=[REDACTED:query:sig]&a=1&api_key#frag HTTP/1.1',
    );
  });

  it('finds key shapes in any query value and in the path', () => {
    const a = FAKE.openai();
    const b = FAKE.slack();
    const { head: out, fired } = redactor.redactHead(reqHead([], `/keys/${b}/x?q=${a}&canary=yes`), 'request');
    expect(text(out).split('\r\n')[0]).toBe('POST /keys/[REDACTED:slack-token]/x?q=[REDACTED:openai-key]&canary=yes HTTP/1.1');
    expect(fired).toEqual([
      { rule: 'slack-token', where: 'request.target' },
      { rule: 'openai-key', where: 'request.query:q' },
    ]);
  });

  it('redacts a password in an absolute-form target', () => {
    const out = redactor.redactHead(head('GET http://bob:s3cret@example.com/a?b=1 HTTP/1.1', 'Host: example.com'), 'request');
    expect(text(out.head).split('\r\n')[0]).toBe('GET http://bob:[REDACTED:url-password]@example.com/a?b=1 HTTP/1.1');
  });

  it('applies user patterns to the query string', () => {
    const r = new Redactor(buildRuleSet({ patterns: [{ name: 'internal', regex: 'itk_[a-z0-9]{8}' }] }));
    const { head: out, fired } = r.redactHead(reqHead([], '/a?t=itk_abcd1234&u=2'), 'request');
    expect(text(out).split('\r\n')[0]).toBe('POST /a?t=[REDACTED:user:internal]&u=2 HTTP/1.1');
    expect(fired).toEqual([{ rule: 'user:internal', where: 'request.query:t' }]);
  });

  it('redacts signatures in a Location header', () => {
    const input = head('HTTP/1.1 302 Found', `Location: https://bucket.s3.amazonaws.com/o?X-Amz-Signature=${alnum(64)}&X-Amz-Expires=300`);
    const { head: out, fired } = redactor.redactHead(input, 'response');
    expect(text(out)).toContain('Location: https://bucket.s3.amazonaws.com/o?X-Amz-Signature=[REDACTED:query:x-amz-signature]&X-Amz-Expires=300\r\n');
    expect(fired).toEqual([{ rule: 'query:x-amz-signature', where: 'response.header:location' }]);
  });
});

describe('redactBody: key shapes', () => {
  const cases: [string, string][] = [
    ['openai-key', FAKE.openai()],
    ['openai-key', FAKE.openaiProject()],
    ['anthropic-key', FAKE.anthropic()],
    ['aws-access-key-id', FAKE.awsAkia()],
    ['aws-access-key-id', FAKE.awsAsia()],
    ['github-token', FAKE.githubGhp()],
    ['github-token', FAKE.githubGho()],
    ['github-token', FAKE.githubGhs()],
    ['github-token', FAKE.githubPat()],
    ['google-api-key', FAKE.google()],
    ['slack-token', FAKE.slack()],
    ['jwt', FAKE.jwt()],
  ];

  it.each(cases)('labels %s and keeps quotes, commas and canaries', (rule, secret) => {
    const body = Buffer.from(`{"canary":"before","v":"${secret}","w":["${secret}",1],"after":"canary2"}`);
    const { body: out, fired, decoded } = redactor.redactBody(body, 'request', undefined, 'application/json');
    expect(out.toString()).toBe(
      `{"canary":"before","v":"[REDACTED:${rule}]","w":["[REDACTED:${rule}]",1],"after":"canary2"}`,
    );
    expect(fired).toEqual([{ rule, where: 'request.body' }]);
    expect(decoded).toBe(false);
    expectNoSecret(fired, secret);
    JSON.parse(out.toString()); // placeholders keep JSON valid
  });

  it('finds keys in free text, in JSON-escaped strings and next to prose', () => {
    const key = FAKE.anthropic();
    const body = Buffer.from(`export ANTHROPIC_API_KEY=${key}\nBearer ${FAKE.jwt()}; done. "k=\\"${key}\\""`);
    const out = redactor.redactBody(body, 'request', undefined, 'text/plain').body.toString();
    expect(out).toBe(
      'export ANTHROPIC_API_KEY=[REDACTED:anthropic-key]\nBearer [REDACTED:jwt]; done. "k=\\"[REDACTED:anthropic-key]\\""',
    );
  });

  it('does not match inside longer words or on short look-alikes', () => {
    const body = Buffer.from(
      `risk-${alnum(30)} disk-${alnum(30)} sk-ant-short sk-short AKIA123 xAIza${alnum(35)} eyJhbGciOi.eyJ the task-management-sk-module`,
    );
    const out = redactor.redactBody(body, 'request', undefined, 'text/plain');
    expect(out.body).toBe(body);
    expect(out.fired).toEqual([]);
  });

  it('catches unsigned and very long JWTs', () => {
    const unsigned = `${b64url({ alg: 'none' })}.${b64url({ sub: 'x' })}.`;
    const long = `${b64url({ alg: 'RS256' })}.${b64url({ groups: alnum(30000) })}.${alnum(342)}`;
    const body = Buffer.from(`a ${unsigned} b ${long} c`);
    expect(redactor.redactBody(body, 'request', undefined, 'text/plain').body.toString()).toBe('a [REDACTED:jwt] b [REDACTED:jwt] c');
  });

  it('redacts a PEM private key, escaped inside JSON too', () => {
    const pem = `-----BEGIN PRIVATE KEY-----\n${alnum(64)}\n${alnum(20)}==\n-----END PRIVATE KEY-----`;
    const body = Buffer.from(JSON.stringify({ file: pem, canary: 'keep' }));
    const out = redactor.redactBody(body, 'request', undefined, 'application/json');
    expect(JSON.parse(out.body.toString())).toEqual({ file: '[REDACTED:private-key]', canary: 'keep' });
  });

  it('gives identical output for two different secrets under the same rule', () => {
    const make = (k: string) => Buffer.from(`{"messages":[{"content":"my key is ${k} ok"}]}`);
    const a = redactor.redactBody(make(FAKE.anthropic(1)), 'request', undefined, 'application/json');
    const b = redactor.redactBody(make(FAKE.anthropic(2)), 'request', undefined, 'application/json');
    expect(FAKE.anthropic(1)).not.toBe(FAKE.anthropic(2));
    expect(a.body.equals(b.body)).toBe(true);
    expect(a.fired).toEqual(b.fired);

    const h1 = redactor.redactHead(reqHead([`Authorization: Bearer ${FAKE.openai(1)}`], `/x?key=${FAKE.google(1)}`), 'request');
    const h2 = redactor.redactHead(reqHead([`Authorization: Bearer ${FAKE.openai(2)}`], `/x?key=${FAKE.google(2)}`), 'request');
    expect(h1.head.equals(h2.head)).toBe(true);
  });

  it('returns the very same Buffer when nothing fired', () => {
    const body = Buffer.from(JSON.stringify({ model: 'claude', messages: [{ role: 'user', content: 'Héllo 日本 🙂 sk- eyJ AKIA' }] }));
    const out = redactor.redactBody(body, 'request', undefined, 'application/json');
    expect(out.body).toBe(body);
    expect(out.body.equals(body)).toBe(true);
    expect(out.fired).toEqual([]);
    expect(out.decoded).toBe(false);
  });

  it('round-trips non-UTF-8 bytes and multi-byte UTF-8 around a match', () => {
    const key = FAKE.openai();
    const body = Buffer.concat([
      Buffer.from([0xff, 0xfe, 0x00, 0x80, 0xc3]), // invalid UTF-8, a NUL, a lone lead byte
      Buffer.from(`日本${key}é🙂`),
      Buffer.from([0xed, 0xa0, 0x80, 0xf8]),
    ]);
    const out = redactor.redactBody(body, 'response', undefined, 'application/octet-stream');
    const expected = Buffer.concat([
      Buffer.from([0xff, 0xfe, 0x00, 0x80, 0xc3]),
      Buffer.from('日本[REDACTED:openai-key]é🙂'),
      Buffer.from([0xed, 0xa0, 0x80, 0xf8]),
    ]);
    expect(out.body.equals(expected)).toBe(true);
    expect(out.fired).toEqual([{ rule: 'openai-key', where: 'response.body' }]);
  });
});

describe('redactBody: JSON paths', () => {
  const user: UserRules = {
    jsonPaths: ['$.credentials.token', '$.items[*].secret', '$..password', "$['odd key']", '$.list[1]'],
  };
  const r = new Redactor(buildRuleSet(user));

  it('replaces string and number values at the paths, byte-exact elsewhere', () => {
    const src =
      '{\n  "credentials": { "token": "t-123", "user": "canary" },\n  "items": [ {"secret": 42}, {"secret": "s2", "keep": true} ],\n' +
      '  "deep": {"a": [{"password": "p1"}, {"x": {"password": 7.5e3}}]},\n  "password": "top", "odd key": "v",\n' +
      '  "list": ["a", "b", "c"], "flag": {"password": true}, "café": "ünïcode"\n}';
    const { body: out, fired } = r.redactBody(Buffer.from(src), 'response', undefined, 'application/json; charset=utf-8');
    const P = (p: string) => `"[REDACTED:json:${p}]"`;
    const expected = src
      .replace('"t-123"', P('$.credentials.token'))
      .replace('42', P('$.items[*].secret'))
      .replace('"s2"', P('$.items[*].secret'))
      .replace('"p1"', P('$..password'))
      .replace('7.5e3', P('$..password'))
      .replace('"top"', P('$..password'))
      .replace('"v"', P("$['odd key']"))
      .replace('"b"', P('$.list[1]'));
    expect(out.toString()).toBe(expected);
    expect(JSON.parse(out.toString()).flag).toEqual({ password: true }); // only strings and numbers are replaced
    // Array indices are collapsed so that a rule firing in every element of a big array is one entry.
    expect(fired.filter((f) => f.rule === 'json:$.items[*].secret')).toEqual([
      { rule: 'json:$.items[*].secret', where: 'response.body:$.items[*].secret' },
    ]);
    expect(fired).toContainEqual({ rule: 'json:$..password', where: 'response.body:$.deep.a[*].x.password' });
    expect(fired).toContainEqual({ rule: 'json:$..password', where: 'response.body:$.deep.a[*].password' });
    expect(fired).toContainEqual({ rule: "json:$['odd key']", where: "response.body:$['odd key']" });
    expectNoSecret(fired, 't-123', 'p1', 'top');
  });

  it('matches keys written with escapes or non-ASCII characters', () => {
    const r2 = new Redactor(buildRuleSet({ jsonPaths: ['$.mot_de_passé', '$..secret'] }));
    const src = '{"mot_de_passé":"x1","\\u0073ecret":"x2"}';
    const out = r2.redactBody(Buffer.from(src), 'request', undefined, 'application/json').body.toString();
    expect(out).toBe('{"mot_de_passé":"[REDACTED:json:$.mot_de_passé]","\\u0073ecret":"[REDACTED:json:$..secret]"}');
  });

  it('applies to +json types and after a BOM, not to other types or invalid JSON', () => {
    const src = '{"password":"x"}';
    expect(r.redactBody(Buffer.from(src), 'request', undefined, 'application/vnd.api+json').body.toString()).toBe(
      '{"password":"[REDACTED:json:$..password]"}',
    );
    const bom = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(src)]);
    expect(r.redactBody(bom, 'request', undefined, 'application/json').body.subarray(3).toString()).toBe(
      '{"password":"[REDACTED:json:$..password]"}',
    );
    const plain = Buffer.from(src);
    expect(r.redactBody(plain, 'request', undefined, 'text/plain').body).toBe(plain);
    const broken = Buffer.from('{"password":"x",');
    expect(r.redactBody(broken, 'request', undefined, 'application/json').body).toBe(broken);
  });

  it('lets a JSON path swallow a key shape inside its value', () => {
    const body = Buffer.from(JSON.stringify({ password: `pre ${FAKE.openai()} post` }));
    const out = r.redactBody(body, 'request', undefined, 'application/json');
    expect(out.body.toString()).toBe('{"password":"[REDACTED:json:$..password]"}');
    expect(out.fired).toEqual([{ rule: 'json:$..password', where: 'request.body:$.password' }]);
  });

  it('copes with deep nesting without recursion', () => {
    const depth = 20000;
    const src = '['.repeat(depth) + '{"password":"x"}' + ']'.repeat(depth);
    const out = r.redactBody(Buffer.from(src), 'request', undefined, 'application/json');
    expect(out.body.toString()).toContain('{"password":"[REDACTED:json:$..password]"}');
  });

  it('never puts a secret found in a JSON key into the manifest', () => {
    const key = FAKE.openai();
    const body = Buffer.from(JSON.stringify({ [key]: { password: 'x' } }));
    const out = r.redactBody(body, 'request', undefined, 'application/json');
    expect(out.body.toString()).toBe('{"[REDACTED:openai-key]":{"password":"[REDACTED:json:$..password]"}}');
    expectNoSecret(out.fired, key);
  });
});

describe('redactBody: content encodings', () => {
  const secretJson = () => Buffer.from(JSON.stringify({ key: FAKE.anthropic(), canary: 'keep' }));
  const cleanJson = Buffer.from(JSON.stringify({ hello: 'world', canary: 'keep' }));

  it.each([
    ['gzip', gzipSync],
    ['x-gzip', gzipSync],
    ['deflate', deflateSync],
    ['deflate', deflateRawSync],
    ['br', brotliCompressSync],
  ] as const)('%s with a secret: returns the decoded, redacted body', (encoding, encode) => {
    const out = redactor.redactBody(encode(secretJson()), 'response', encoding.toUpperCase(), 'application/json');
    expect(out.decoded).toBe(true);
    expect(out.body.toString()).toBe('{"key":"[REDACTED:anthropic-key]","canary":"keep"}');
    expect(out.fired).toEqual([{ rule: 'anthropic-key', where: 'response.body' }]);
  });

  it.each([
    ['gzip', gzipSync],
    ['deflate', deflateSync],
    ['br', brotliCompressSync],
  ] as const)('%s without a secret: returns the original encoded bytes', (encoding, encode) => {
    const encoded = encode(cleanJson);
    const copy = Buffer.from(encoded);
    const out = redactor.redactBody(encoded, 'response', encoding, 'application/json');
    expect(out.decoded).toBe(false);
    expect(out.body).toBe(encoded);
    expect(out.body.equals(copy)).toBe(true);
    expect(out.fired).toEqual([]);
  });

  it('scans undecodable and unknown encodings as raw bytes', () => {
    const key = FAKE.google();
    const corrupt = Buffer.concat([Buffer.from([0x1f, 0x8b, 0x08, 0x00]), Buffer.from(` ${key} `)]);
    const out = redactor.redactBody(corrupt, 'response', 'gzip', undefined);
    expect(out.decoded).toBe(false);
    expect(text(out.body)).toBe('\x1f\x8b\x08\x00 [REDACTED:google-api-key] ');
    const zstd = Buffer.from(`x ${key} y`);
    expect(redactor.redactBody(zstd, 'response', 'zstd', undefined)).toEqual({
      body: Buffer.from('x [REDACTED:google-api-key] y'),
      fired: [{ rule: 'google-api-key', where: 'response.body' }],
      decoded: false,
    });
  });
});

describe('redactBody: server-sent events', () => {
  const r = new Redactor(buildRuleSet({ jsonPaths: ['$.delta.secret'] }));

  it('applies JSON paths per data line and key shapes across the stream', () => {
    const key = FAKE.openai();
    const src =
      'event: message_start\r\ndata: {"type":"start"}\r\n\r\n' +
      'event: delta\ndata: {"delta":{"secret":"abc","text":"canary"}}\n\n' +
      `data: {"delta":{"text":"${key}"}}\n\n` +
      `data: not json ${FAKE.githubGhp()}\n\n` +
      'data:{"delta":{"secret":5}}\n\ndata: [DONE]\n\n';
    const out = r.redactBody(Buffer.from(src), 'response', undefined, 'text/event-stream; charset=utf-8');
    expect(out.body.toString()).toBe(
      'event: message_start\r\ndata: {"type":"start"}\r\n\r\n' +
        'event: delta\ndata: {"delta":{"secret":"[REDACTED:json:$.delta.secret]","text":"canary"}}\n\n' +
        'data: {"delta":{"text":"[REDACTED:openai-key]"}}\n\n' +
        'data: not json [REDACTED:github-token]\n\n' +
        'data:{"delta":{"secret":"[REDACTED:json:$.delta.secret]"}}\n\ndata: [DONE]\n\n',
    );
    expect(out.fired).toEqual([
      { rule: 'json:$.delta.secret', where: 'response.body:$.delta.secret' },
      { rule: 'openai-key', where: 'response.body' },
      { rule: 'github-token', where: 'response.body' },
    ]);
  });

  it('is verbatim when nothing fired', () => {
    const src = Buffer.from('data: {"delta":{"text":"hi"}}\n\n');
    expect(r.redactBody(src, 'response', undefined, 'text/event-stream').body).toBe(src);
  });
});

describe('redactBody: secrets in environment-style assignments', () => {
  const pw = `hunter2-${alnum(12, 5)}`;
  const aws = alnum(40, 6);

  it('redacts the value after a secret-sounding UPPER_CASE name and keeps the name', () => {
    const text = [`DB_PASSWORD=${pw}`, `export STRIPE_SECRET_KEY="${pw}x"`, `AWS_SECRET_ACCESS_KEY = ${aws}`, `GITHUB_TOKEN='${pw}y'`, 'CANARY=plain-value'].join('\n');
    const out = redactor.redactBody(Buffer.from(text), 'request', undefined, 'text/plain');
    expect(out.body.toString()).toBe(
      ['DB_PASSWORD=[REDACTED:env-secret]', 'export STRIPE_SECRET_KEY="[REDACTED:env-secret]"', 'AWS_SECRET_ACCESS_KEY = [REDACTED:env-secret]', "GITHUB_TOKEN='[REDACTED:env-secret]'", 'CANARY=plain-value'].join('\n'),
    );
    expect(out.fired).toEqual([{ rule: 'env-secret', where: 'request.body' }]);
  });

  it('finds them in a .env a tool read and sent to the model (JSON-escaped newlines)', () => {
    const body = Buffer.from(JSON.stringify({ role: 'tool', content: `# config\nDB_PASSWORD=${pw}\nAPI_KEY=${aws}\nPORT=5432\n` }));
    const out = redactor.redactBody(body, 'request', undefined, 'application/json').body.toString();
    expect(JSON.parse(out).content).toBe('# config\nDB_PASSWORD=[REDACTED:env-secret]\nAPI_KEY=[REDACTED:env-secret]\nPORT=5432\n');
  });

  it('leaves names that only contain a word, lower-case names, short values and placeholders alone', () => {
    const text = 'MAX_TOKENS=4096 TOKEN_LENGTH=32 XPASSWORD=abcdef db_password=abcdef PASSWORD=ab PASSWORD=[REDACTED:openai-key]';
    const body = Buffer.from(text);
    expect(redactor.redactBody(body, 'request', undefined, 'text/plain').body).toBe(body);
  });

  it('lets a key shape name the rule, and redacting twice changes nothing', () => {
    const once = redactor.redactBody(Buffer.from(`OPENAI_API_KEY=${FAKE.openai()}\nDB_PASSWORD=${pw}\n`), 'request', undefined, 'text/plain').body;
    expect(once.toString()).toBe('OPENAI_API_KEY=[REDACTED:openai-key]\nDB_PASSWORD=[REDACTED:env-secret]\n');
    expect(redactor.redactBody(once, 'request', undefined, 'text/plain').body).toBe(once);
  });

  it('user patterns can name the part to replace with (?<secret>…)', () => {
    const r = new Redactor(buildRuleSet({ patterns: [{ name: 'pin', regex: 'pin=(?<secret>\\d{4})', flags: 'i' }] }));
    expect(r.redactBody(Buffer.from('a PIN=1234 b'), 'request', undefined, 'text/plain').body.toString()).toBe('a PIN=[REDACTED:user:pin] b');
  });
});

describe('redactBody: JSON keys named like secrets', () => {
  const pw = `hunter2-${alnum(12, 7)}`;

  it('redacts string values under secret keys, in JSON and in JSON sent as text, and nothing else', () => {
    const inner = JSON.stringify({ password: pw, user: 'bob' });
    const body = Buffer.from(JSON.stringify({ login: { username: 'bob', password: pw }, headers: { Authorization: `Bearer ${pw}` }, tool: inner, apiKey: `${pw}k`, note: 'canary' }));
    const out = redactor.redactBody(body, 'request', undefined, 'application/json');
    const parsed = JSON.parse(out.body.toString());
    expect(parsed.login).toEqual({ username: 'bob', password: '[REDACTED:json-secret]' });
    expect(parsed.headers.Authorization).toBe('[REDACTED:json-secret]');
    expect(JSON.parse(parsed.tool)).toEqual({ password: '[REDACTED:json-secret]', user: 'bob' });
    expect(parsed.apiKey).toBe('[REDACTED:json-secret]');
    expect(parsed.note).toBe('canary');
    expect(out.body.toString()).not.toContain(pw);
  });

  it('leaves schemas, numbers, logprob tokens and placeholders alone', () => {
    const body = Buffer.from(JSON.stringify({ properties: { password: { type: 'string' } }, secret: 42, logprobs: [{ token: 'Hello' }], password: '[REDACTED:openai-key]' }));
    expect(redactor.redactBody(body, 'request', undefined, 'application/json').body).toBe(body);
  });
});

describe('user patterns', () => {
  it('applies to bodies with flags, and names the rule user:<name>', () => {
    const r = new Redactor(
      buildRuleSet({
        patterns: [
          { name: 'acme', regex: 'acme_[0-9a-f]{8}' },
          { name: 'pin', regex: 'pin=(\\d{4})', flags: 'i' },
        ],
      }),
    );
    const body = Buffer.from('x acme_0123abcd y PIN=1234 z canary');
    const out = r.redactBody(body, 'request', undefined, 'text/plain');
    expect(out.body.toString()).toBe('x [REDACTED:user:acme] y [REDACTED:user:pin] z canary');
    expect(out.fired).toEqual([
      { rule: 'user:acme', where: 'request.body' },
      { rule: 'user:pin', where: 'request.body' },
    ]);
  });

  it('does not apply to header values', () => {
    const r = new Redactor(buildRuleSet({ patterns: [{ name: 'acme', regex: 'acme_[0-9a-f]{8}' }] }));
    const input = reqHead(['X-Trace: acme_0123abcd']);
    expect(r.redactHead(input, 'request').head).toBe(input);
  });
});

describe('redactText', () => {
  it('redacts URLs, header-like text and key shapes in log lines', () => {
    const key = FAKE.google();
    expect(redactor.redactText(`GET https://g.example/v1?key=${key}&alt=sse failed`)).toBe(
      'GET https://g.example/v1?key=[REDACTED:query:key]&alt=sse failed',
    );
    expect(redactor.redactText(`upstream said: Authorization: Bearer ${FAKE.openai()}`)).toBe(
      'upstream said: Authorization: Bearer [REDACTED:header:authorization]',
    );
    expect(redactor.redactText('proxy http://me:pa55@proxy.local:3128 refused')).toBe(
      'proxy http://me:[REDACTED:url-password]@proxy.local:3128 refused',
    );
    expect(redactor.redactText(`env has ${FAKE.awsAkia()} set`)).toBe('env has [REDACTED:aws-access-key-id] set');
    expect(redactor.redactText('nothing to see')).toBe('nothing to see');
  });
});

describe('rules', () => {
  const expectRulesError = (user: unknown, fragment: RegExp) => {
    let err: unknown;
    try {
      buildRuleSet(user as UserRules);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(RedactionRulesError);
    const message = (err as Error).message;
    expect(message).not.toMatch(/[\r\n]/);
    expect(message).toMatch(fragment);
  };

  it('rejects bad user rules with a one-line message', () => {
    expectRulesError({ header: ['x'] }, /unknown key "header".*allowed keys are headers, patterns, jsonPaths/);
    expectRulesError([], /must be a JSON object/);
    expectRulesError({ headers: 'x-a' }, /"headers" .* must be an array/);
    expectRulesError({ headers: ['bad header'] }, /not a valid header name/);
    expectRulesError({ patterns: [{ name: 'a', regex: '(' }] }, /"a" has an invalid regex: .*Unterminated group/);
    expectRulesError({ patterns: [{ name: 'a', regex: 'x*' }] }, /matches the empty string/);
    expectRulesError({ patterns: [{ name: 'a', regex: 'x', flags: 'g' }] }, /only i, m, s, u, v/);
    expectRulesError({ patterns: [{ name: 'a b', regex: 'x' }] }, /name "a b" is invalid/);
    expectRulesError({ patterns: [{ name: 'a', regex: 'x', extra: 1 }] }, /unknown key "extra"/);
    expectRulesError({ patterns: [{ name: 'a', regex: 'x' }, { name: 'a', regex: 'y' }] }, /duplicate name "a"/);
    expectRulesError({ jsonPaths: ['credentials.token'] }, /must start with \$/);
    expectRulesError({ jsonPaths: ['$.a[?(@.x)]'] }, /unsupported selector/);
    expectRulesError({ jsonPaths: ['$["a"]'] }, /double quotes/);
    expectRulesError({ jsonPaths: ['$'] }, /whole document/);
    expectRulesError({ jsonPaths: ["$['a"] }, /unclosed/);
  });

  it('merges user rules into the built-ins', () => {
    const set = buildRuleSet({ headers: ['X-Tok', 'authorization'], patterns: [{ name: 'p', regex: 'q+', flags: 'si' }], jsonPaths: ['$..pw'] });
    expect(set.version).toBe(1);
    expect(set.headers.filter((h) => h === 'authorization')).toHaveLength(1);
    expect(set.headers).toContain('x-tok');
    expect(set.patterns.at(-1)).toEqual({ name: 'user:p', regex: 'q+', flags: 'is' });
    expect(set.patterns.map((p) => p.name)).toEqual(expect.arrayContaining(['openai-key', 'anthropic-key', 'jwt']));
    expect(set.jsonPaths).toEqual(['$..pw']);
    expect(set.queryParams).toContain('api_key');
    expect(JSON.parse(JSON.stringify(set))).toEqual(set); // serializable into a trace
  });

  describe('loadRuleSet', () => {
    const dir = mkdtempSync(join(tmpdir(), 'redact-test-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('uses built-ins for a missing optional file or no file', () => {
      expect(loadRuleSet(join(dir, 'missing.json'), true)).toEqual(buildRuleSet());
      expect(loadRuleSet(undefined, false)).toEqual(buildRuleSet());
    });

    it('fails for a missing required file, bad JSON and bad rules, naming the file', () => {
      const missing = join(dir, 'missing.json');
      expect(() => loadRuleSet(missing, false)).toThrow(RedactionRulesError);
      expect(() => loadRuleSet(missing, false)).toThrow(missing);
      const bad = join(dir, 'bad.json');
      writeFileSync(bad, '{"headers": [\n');
      expect(() => loadRuleSet(bad, true)).toThrow(/bad\.json is not valid JSON .*fix the syntax/);
      const wrong = join(dir, 'wrong.json');
      writeFileSync(wrong, '{"jsonpaths": []}');
      expect(() => loadRuleSet(wrong, true)).toThrow(/wrong\.json: unknown key "jsonpaths"/);
    });

    it('loads a valid file', () => {
      const file = join(dir, 'ok.json');
      writeFileSync(file, JSON.stringify({ headers: ['x-tok'], jsonPaths: ['$..pw'] }));
      const set = loadRuleSet(file, false);
      expect(set.headers).toContain('x-tok');
      expect(set.jsonPaths).toEqual(['$..pw']);
    });
  });
});

describe('performance', () => {
  it('scans a 10 MB JSON body without secrets in about one regex pass', () => {
    const messages: object[] = [];
    let size = 0;
    for (let i = 0; size < 10 * 1024 * 1024; i++) {
      const m = { role: i % 2 ? 'user' : 'assistant', content: `message ${i}: risk-free disk-usage café 日本語 sk- eyJ AKIA token=${i}`, id: `msg_${i}` };
      messages.push(m);
      size += JSON.stringify(m).length;
    }
    const body = Buffer.from(JSON.stringify({ model: 'x', messages }));
    redactor.redactBody(body, 'request', undefined, 'application/json'); // warm-up
    const start = performance.now();
    const out = redactor.redactBody(body, 'request', undefined, 'application/json');
    const ms = performance.now() - start;
    console.log(`redactBody: ${(body.length / 1048576).toFixed(1)} MB JSON without secrets in ${ms.toFixed(1)} ms`);
    expect(out.body).toBe(body);
    expect(ms).toBeLessThan(2000); // generous: shared CI machines
  });
});
