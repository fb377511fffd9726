import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { TunnelAgent, entityBody, request, startHarness, type Harness } from './helpers/proxy.js';

/** Fake secrets in the providers' shapes, made at run time so the repository holds none. */
function token(alphabet: string, n: number): string {
  const bytes = randomBytes(n);
  return [...bytes].map((b) => alphabet[b % alphabet.length]).join('');
}
const ALNUM = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
const secrets = {
  openai: `sk-proj-${token(ALNUM, 48)}`,
  anthropic: `sk-ant-api03-${token(ALNUM, 80)}`,
  aws: `AKIA${token('ABCDEFGHIJKLMNOPQRSTUVWXYZ234567', 16)}`,
  github: `ghp_${token(ALNUM, 36)}`,
  google: `AIza${token(ALNUM, 35)}`,
  cookie: `session=${token(ALNUM, 32)}`,
};
const canaries = {
  header: `CANARY-header-${token(ALNUM, 8)}`,
  json: `CANARY-json-${token(ALNUM, 8)}`,
  query: `CANARY-query-${token(ALNUM, 8)}`,
  gzip: `CANARY-gzip-${token(ALNUM, 8)}`,
};

let h: Harness;

beforeAll(async () => {
  h = await startHarness({ storeCompression: false });
});

afterAll(async () => {
  await h?.close();
});

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? filesUnder(path) : [path];
  });
}

describe('redaction on ingress', () => {
  it('no secret reaches the store, the files under the home or the logs; every canary does', async () => {
    const agent = new TunnelAgent(h.daemon.port);
    // secrets in headers (echoed back by the upstream in its response body, so responses are covered too)
    await request('https://api.openai.com/v1/chat/completions', {
      agent,
      ca: h.caPem,
      method: 'POST',
      headers: { authorization: `Bearer ${secrets.openai}`, 'x-api-key': secrets.anthropic, cookie: secrets.cookie, 'x-canary': canaries.header, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: `my keys: ${secrets.aws} ${secrets.github}` }], canary: canaries.json }),
    });
    await request('https://tools.example.test/echo', { agent, ca: h.caPem, headers: { 'x-canary': canaries.header, authorization: `token ${secrets.github}` } });
    // a query string
    await request(`https://tools.example.test/tool/weather?city=Paris&key=${secrets.google}&canary=${canaries.query}`, { agent, ca: h.caPem });
    // a gzip body
    await request('https://tools.example.test/echo', {
      agent,
      ca: h.caPem,
      method: 'POST',
      headers: { 'content-encoding': 'gzip', 'content-type': 'application/json' },
      body: gzipSync(JSON.stringify({ token: secrets.openai, canary: canaries.gzip })),
    });
    agent.destroy();

    // the real values still went upstream
    const upstreamSaw = h.upstream.requests.map((r) => r.rawHeaders.join('\n') + r.url).join('\n');
    expect(upstreamSaw).toContain(secrets.openai);
    expect(upstreamSaw).toContain(secrets.google);

    // read back through the store, decoded
    const exchanges = await h.exchanges();
    expect(exchanges.filter((e) => e.record.kind === 'http')).toHaveLength(4);
    const decoded = exchanges
      .map((ex) => {
        const reqBody = ex.record.request!.flags.includes('decoded') || !/content-encoding: gzip/i.test(ex.requestHead.toString()) ? ex.requestBody : gunzipSync(ex.requestBody);
        const resBody = entityBody(ex.responseHead, ex.responseBody);
        const resPlain = /content-encoding: gzip/i.test(ex.responseHead.toString()) ? gunzipSync(resBody) : resBody;
        return [ex.requestHead, reqBody, ex.responseHead, resPlain, Buffer.from(JSON.stringify(ex.record))].map((b) => b.toString('latin1')).join('\n');
      })
      .join('\n');
    for (const canary of Object.values(canaries)) expect(decoded).toContain(canary);
    for (const [kind, secret] of Object.entries(secrets)) expect(decoded, kind).not.toContain(secret.replace(/^session=/, ''));
    const gzipExchange = exchanges.find((e) => e.requestBody.includes(canaries.gzip))!;
    expect(gzipExchange.record.request!.flags).toContain('decoded');
    expect(gzipExchange.requestHead.toString()).not.toMatch(/content-encoding/i);
    expect(gzipExchange.requestHead.toString(), gzipExchange.requestHead.toString()).toMatch(new RegExp(`content-length: ${gzipExchange.requestBody.length}\r\n`, "i"));
    expect(decoded).toContain('[REDACTED:');
    // the manifest says which rules fired where, never the values
    const rules = exchanges.flatMap((e) => e.record.redactions.map((f) => f.rule));
    expect(rules).toEqual(expect.arrayContaining(['header:authorization', 'header:x-api-key', 'header:cookie']));

    // every file under the home and the logs, as raw bytes (store compression is off, so the canaries show)
    await h.daemon.stop();
    const files = filesUnder(h.home);
    const everything = Buffer.concat([...files.map((f) => readFileSync(f)), Buffer.from(h.logs.join('\n'))]);
    const asText = everything.toString('latin1');
    for (const [kind, secret] of Object.entries(secrets)) expect(asText.includes(secret.replace(/^session=/, '')), `${kind} on disk`).toBe(false);
    for (const canary of Object.values(canaries)) expect(asText.includes(canary), `${canary} visible to the scan`).toBe(true);
  });
});
