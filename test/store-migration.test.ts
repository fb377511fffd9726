/**
 * Store format migration, from a fixture store that the previous format's code wrote: scripts/make-store-fixture.mjs
 * exported that commit, built it, recorded real traces with it and copied its store here (test/fixtures/store-v1),
 * with a manifest of what the old code read back. Nothing in the fixture is written by hand.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { cpSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Level } from 'level';
import { TraceStore } from '../src/trace/store.js';
import { encodeExchange, FORMAT_VERSION } from '../src/trace/schema.js';
import { ROOT, pythonWithHttpx, runCli } from './helpers/cli.js';

const FIXTURE = join(ROOT, 'test/fixtures/store-v1');
const manifest = JSON.parse(readFileSync(join(FIXTURE, 'manifest.json'), 'utf8')) as {
  commit: string;
  formatVersion: number;
  traces: Record<string, { tier: string; workspace: string | null; reports: number; exchanges: { seq: number; state: string; requestHead: string; requestBody: string; requestBodyLength: number; responseHead: string; responseBody: string }[] }>;
};
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const agent = join(ROOT, 'test/fixtures/long-agent.py');

let work: string;
beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), 'mitm-replay-migration-'));
});
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** A fresh home holding a copy of the fixture store. */
function homeWithFixture(): string {
  const home = mkdtempSync(join(work, 'home-'));
  cpSync(join(FIXTURE, 'traces'), join(home, 'traces'), { recursive: true });
  return home;
}

async function checkAgainstManifest(store: TraceStore): Promise<void> {
  for (const [name, expected] of Object.entries(manifest.traces)) {
    const meta = await store.getTrace(name);
    expect(meta?.tier).toBe(expected.tier);
    expect(meta?.workspace?.snapshot ?? null).toBe(expected.workspace);
    if (expected.workspace) expect(await store.getBlob(expected.workspace)).toBeDefined();
    expect(await store.listReports(name)).toHaveLength(expected.reports);
    const got = [];
    for await (const ex of store.exchanges(name)) {
      got.push({
        seq: ex.record.seq,
        state: ex.record.state,
        requestHead: sha(ex.requestHead),
        requestBody: sha(ex.requestBody),
        requestBodyLength: ex.requestBody.length,
        responseHead: sha(ex.responseHead),
        responseBody: sha(ex.responseBody),
      });
    }
    expect(got).toEqual(expected.exchanges);
  }
}

describe('store migration from the previous format (fixture written by that format’s code)', () => {
  it('the fixture is what the script says: format 1, made by a commit, with large bodies to chunk', () => {
    expect(manifest.formatVersion).toBe(1);
    expect(FORMAT_VERSION).toBe(2);
    expect(manifest.commit).toMatch(/^[0-9a-f]{40}$/);
    expect(manifest.traces['chat-v1']!.exchanges.some((e) => e.requestBodyLength >= 4096)).toBe(true);
    expect(manifest.traces['chat-v1']!.reports).toBe(1);
    expect(manifest.traces['shape-v1']!.tier).toBe('structural');
  });

  it('opening migrates every exchange to format 2 with nothing lost; reopening does nothing more', async () => {
    const home = homeWithFixture();
    const store = await TraceStore.open(join(home, 'traces'));
    const exchanges = Object.values(manifest.traces).reduce((n, t) => n + t.exchanges.length, 0);
    expect(store.migration).toEqual({ from: 1, to: 2, exchanges });
    await checkAgainstManifest(store);
    // the resent conversation is now in chunks, each once
    const { chunks, bytes } = await store.chunkStats();
    expect(chunks).toBeGreaterThan(0);
    // (the fixture's turns add ~500 bytes each, less than a chunk: each body's last chunk is its own)
    const bodyBytes = Object.values(manifest.traces).flatMap((t) => t.exchanges).reduce((n, e) => n + (e.requestBodyLength >= 4096 ? e.requestBodyLength : 0), 0);
    expect(bytes).toBeLessThan(bodyBytes * 0.6);
    await store.close();

    const again = await TraceStore.open(join(home, 'traces'));
    expect(again.migration).toBeNull();
    await checkAgainstManifest(again);
    await again.close();
    const db = new Level<string, string>(join(home, 'traces'));
    await db.open();
    expect(await db.get('v:format')).toBe('2');
    await db.close();
  });

  it('a migration cut short (some values still format 1) finishes on the next open', async () => {
    const home = homeWithFixture();
    const first = await TraceStore.open(join(home, 'traces'));
    const ex = await first.getExchange('chat-v1', 0);
    await first.close();
    // as if the process died mid-way: the version key not yet written, one value still in the old encoding
    const db = new Level<string, Buffer>(join(home, 'traces'), { valueEncoding: 'buffer' });
    await db.open();
    await db.put('v:format', Buffer.from('1'));
    await db.put('t:chat-v1:x:0000000000', encodeExchange(ex!));
    await db.close();
    const store = await TraceStore.open(join(home, 'traces'));
    expect(store.migration).toEqual({ from: 1, to: 2, exchanges: 1 });
    await checkAgainstManifest(store);
    await store.close();
  });

  it('the CLI lists the migrated traces, and the old recording replays to PASS with no network', async () => {
    const python = pythonWithHttpx();
    if (!python) return;
    const home = homeWithFixture();
    const ls = await runCli(['ls', '--home', home]);
    expect(ls.code, ls.stderr).toBe(0);
    expect(ls.stdout).toMatch(/^chat-v1\s.*\sfull\s/m);
    expect(ls.stdout).toMatch(/^shape-v1\s.*\sstructural\s/m);
    const replayDir = mkdtempSync(join(work, 'replay-'));
    const rep = await runCli(['replay', 'chat-v1', '--home', home, '--in-place', '--', python, agent], { cwd: replayDir, env: { OPENAI_API_KEY: 'sk-another-key-on-this-machine-0000' } });
    expect(rep.code, rep.stderr).toBe(0);
    expect(rep.stderr).toContain('exact=6 reordered=0 diverged=0 missing=0 unused=0 egress=blocked');
    expect(rep.stderr).toContain('-> PASS');
    const shape = await runCli(['replay', 'shape-v1', '--home', home, '--in-place', '--', python, agent], { cwd: replayDir, env: { OPENAI_API_KEY: 'sk-another-key-on-this-machine-0000' } });
    // a structural trace serves filler for strings: this agent cannot parse the tool call's arguments and stops
    // after the first exchange, which matched on its shape
    expect(shape.stderr).toMatch(/verdict: recorded=6 requests=1 reused=1 exact=1 .* tier=structural/);
  });
});
