import { beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { useUpstreamFixture } from './helpers/cli-fixture.js';
import { ROOT, runCli, startCliDaemon } from './helpers/cli.js';

const fx = useUpstreamFixture('browse');
// har-validator checks against the HAR 1.2 JSON schema (har-schema)
const validateHar = (har: unknown): Promise<unknown> => (createRequire(import.meta.url)('har-validator') as { har(h: unknown): Promise<unknown> }).har(har);
const nodeAgent = join(ROOT, 'test', 'fixtures', 'openai-agent.mjs');
let home: string;

beforeAll(async () => {
  home = fx.freshHome();
  const rec = await runCli(['record', '--home', home, '--trace', 'browse-me', '--no-workspace', ...fx.routing(), '--', process.execPath, nodeAgent], {
    env: { OPENAI_API_KEY: 'sk-proj-browse000000000000000000000000', OPENAI_BASE_URL: '' },
  });
  expect(rec.code, rec.stderr).toBe(0);
});

describe('ls and show on a real recording', () => {
  it('ls lists the trace with its columns, with or without a running daemon', async () => {
    const alone = await runCli(['ls', '--home', home]);
    expect(alone.code, alone.stderr).toBe(0);
    const [header, row] = alone.stdout.trim().split('\n');
    expect(header).toMatch(/^NAME\s+CREATED \(UTC\)\s+TIER\s+EXPIRES \(UTC\)\s+EXCHANGES\s+BYTES\s+COMMAND\s+EXIT\s+LAST VERDICT$/);
    expect(row).toMatch(/^browse-me\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+full\s+\d{4}-\d\d-\d\d \d\d:\d\d\s+2\s+[\d.]+ KiB\s+.*openai-agent\.mjs\s+0\s+-$/);
    // beside a running daemon (which holds the store): no lock error, the same listing
    const daemon = await startCliDaemon(fx.routing(), home);
    try {
      const beside = await runCli(['ls', '--home', home, '--json']);
      expect(beside.code, beside.stderr).toBe(0);
      const listing = JSON.parse(beside.stdout) as { meta: { name: string }; summary: { exchanges: number } }[];
      expect(listing.map((l) => [l.meta.name, l.summary.exchanges])).toEqual([['browse-me', 2]]);
      const shown = await runCli(['show', 'browse-me', '--home', home]);
      expect(shown.code, shown.stderr).toBe(0);
      expect(shown.stdout).toContain('tools: get_weather');
    } finally {
      daemon.child.kill('SIGTERM');
      await new Promise((r) => daemon.child.once('exit', r));
    }
  });

  it('show lists exchanges with status, sizes, frames, model, tokens and tool calls', async () => {
    const shown = await runCli(['show', 'last', '--home', home]);
    expect(shown.code, shown.stderr).toBe(0);
    const lines = shown.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^trace browse-me: 2 records/);
    expect(lines[1]).toMatch(/^#0 {2}POST https:\/\/api\.openai\.com\/v1\/chat\/completions {2}200 {2}req \d+ B {2}resp \d+ B {2}\d+ ms {2}model gpt-4o-mini {2}tokens 12 in \/ 6 out$/);
    expect(lines[2]).toMatch(/^#1 {2}POST https:\/\/api\.openai\.com\/v1\/chat\/completions {2}200 .* 6 frames {2}model gpt-4o-mini {2}tools: get_weather$/);
  });

  it('show --exchange N prints it decoded: heads, pretty JSON, SSE frames one per line; --raw the stored bytes', async () => {
    const one = await runCli(['show', 'browse-me', '--exchange', '1', '--home', home]);
    expect(one.code, one.stderr).toBe(0);
    expect(one.stdout).toMatch(/^POST \/v1\/chat\/completions HTTP\/1\.1\r?\n/);
    expect(one.stdout).toContain('"stream": true');
    expect(one.stdout).toContain('[REDACTED:header:authorization]');
    expect(one.stdout).not.toContain('sk-proj-browse');
    expect(one.stdout.split('\n').filter((l) => l.startsWith('data: ')).length).toBe(6);
    expect(one.stdout).toContain('data: [DONE]');
    expect(one.stdout).toContain('redacted: header:authorization at request.header:authorization');
    const raw = await runCli(['show', 'browse-me', '--exchange', '0', '--raw', '--home', home]);
    expect(raw.stdout.startsWith('POST /v1/chat/completions HTTP/1.1\r\n')).toBe(true);
    expect(raw.stdout).toContain('HTTP/1.1 200 OK\r\n');
    const json = JSON.parse((await runCli(['show', 'browse-me', '--json', '--home', home])).stdout);
    expect(json.exchanges).toHaveLength(2);
  });

  it('export --har writes valid HAR 1.2 with decoded bodies and the frames and chunk timing as _mitmReplay', async () => {
    const file = join(fx.work, 'browse.har');
    const exported = await runCli(['export', 'browse-me', '--har', file, '--home', home]);
    expect(exported.code, exported.stderr).toBe(0);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const har = JSON.parse(readFileSync(file, 'utf8'));
    await validateHar(har).catch((err: { errors?: unknown }) => {
      throw new Error(`HAR 1.2 schema: ${JSON.stringify(err.errors).slice(0, 800)}`);
    });
    expect(har.log.entries).toHaveLength(2);
    const [json, stream] = har.log.entries;
    expect(json.request.url).toBe('https://api.openai.com/v1/chat/completions');
    expect(JSON.parse(json.request.postData.text).model).toBe('gpt-4o-mini');
    expect(JSON.parse(json.response.content.text).model).toBe('gpt-4o-mini');
    expect(json.request.headers.find((h: { name: string }) => h.name.toLowerCase() === 'authorization').value).toBe('Bearer [REDACTED:header:authorization]');
    expect(stream.response.content.mimeType).toMatch(/^text\/event-stream/);
    expect(stream.response.content.text).toContain('data: [DONE]');
    expect(stream._mitmReplay.frames).toHaveLength(6);
    const offsets = stream._mitmReplay.frames.map((f: { offsetMs: number }) => f.offsetMs);
    expect([...offsets].sort((a, b) => a - b)).toEqual(offsets);
    expect(stream._mitmReplay.chunks.length).toBeGreaterThan(3);
    expect(JSON.stringify(har)).not.toContain('sk-proj-browse');
  });

  it('import --har makes a replayable trace from a HAR and states the limits of HAR', async () => {
    const file = join(fx.work, 'for-import.har');
    expect((await runCli(['export', 'browse-me', '--har', file, '--home', home])).code).toBe(0);
    const other = fx.freshHome();
    const imported = await runCli(['import', '--har', file, '--trace', 'from-har', '--home', other]);
    expect(imported.code, imported.stderr).toBe(0);
    expect(imported.stderr).toMatch(/HAR limit: .*header/i);
    expect(imported.stderr).toContain('imported trace from-har (2 records)');
    const rep = await runCli(['replay', 'from-har', '--home', other, '--', process.execPath, nodeAgent], { env: { OPENAI_API_KEY: 'sk-other', OPENAI_BASE_URL: '' } });
    expect(rep.stderr).toContain('exact=2');
    expect(rep.code, rep.stderr).toBe(0);
    const notHar = join(fx.work, 'not.har');
    writeFileSync(notHar, '{"log": {"entries": "nope"}}');
    const bad = await runCli(['import', '--har', notHar, '--home', other]);
    expect(bad.code).toBe(2);
    expect(bad.stderr.trim().split('\n')).toHaveLength(1);
  });

  it('bad input: unknown trace, bad --exchange, missing exchange: exit 2 with one line', async () => {
    for (const args of [
      ['show', 'nope', '--home', home],
      ['show', 'browse-me', '--exchange', 'x', '--home', home],
      ['show', 'browse-me', '--exchange', '9', '--home', home],
      ['show', '--home', home],
      ['ls', 'extra', '--home', home],
    ]) {
      const result = await runCli(args);
      expect(result.code, args.join(' ')).toBe(2);
      expect(result.stderr.trim().split('\n')).toHaveLength(1);
    }
  });
});
