import { describe, expect, it } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TraceStore } from '../src/trace/store.js';
import { useUpstreamFixture } from './helpers/cli-fixture.js';
import { ROOT, runCli } from './helpers/cli.js';

const fx = useUpstreamFixture('retention');
const agent = join(ROOT, 'test', 'fixtures', 'node-agent.mjs');
const env = { OPENAI_API_KEY: 'sk-proj-retention00000000000000000000', OPENAI_BASE_URL: '' };

async function blobCount(home: string): Promise<number> {
  const store = await TraceStore.open(join(home, 'traces'));
  try {
    return (await store.blobHashes()).length;
  } finally {
    await store.close();
  }
}

function record(home: string, trace: string, cwd: string) {
  return runCli(['record', '--home', home, '--trace', trace, '--intercept', '+tools.example.test', ...fx.routing(), '--', process.execPath, agent], { cwd, env });
}

describe('retention: expiry, keep, gc', () => {
  it('an expired trace cannot be replayed (the error says when); gc deletes it and its blobs, not a pinned one or shared blobs', async () => {
    const home = fx.freshHome();
    // a 5-second policy, so the test can watch traces expire (long enough for two records on a busy machine)
    writeFileSync(join(home, 'config.json'), JSON.stringify({ retention: { fullHours: 5 / 3600 } }));
    const shared = mkdtempSync(join(fx.work, 'ws-'));
    writeFileSync(join(shared, 'same.txt'), 'identical in both workspaces\n');
    const other = mkdtempSync(join(fx.work, 'ws-'));
    writeFileSync(join(other, 'same.txt'), 'identical in both workspaces\n');
    writeFileSync(join(other, 'own.txt'), 'only in the pinned trace\n');
    expect((await record(home, 'short-lived', shared)).code).toBe(0);
    expect((await record(home, 'pinned', other)).code).toBe(0);
    const keep = await runCli(['keep', 'pinned', '--home', home]);
    expect(keep.code, keep.stderr).toBe(0);
    expect(keep.stderr).toContain('WARNING: it is a full trace');

    const listed = (await runCli(['ls', '--home', home])).stdout;
    expect(listed).toMatch(/^short-lived\s+\S+ \S+\s+full\s+\d{4}-\d\d-\d\d \d\d:\d\d\s/m);
    expect(listed).toMatch(/^pinned\s+\S+ \S+\s+full\s+never\*/m);
    expect(listed).toContain('WARNING: pinned full traces');

    await new Promise((r) => setTimeout(r, 5500));
    const refused = await runCli(['replay', 'short-lived', '--home', home, '--', process.execPath, agent], { cwd: shared, env });
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/trace 'short-lived' expired at \d{4}-\d\d-\d\dT[\d:.]+Z and can no longer be replayed/);
    expect((await runCli(['ls', '--home', home])).stdout).toMatch(/^short-lived\s+.*expired /m);

    const blobsBefore = await blobCount(home);
    const gc = await runCli(['gc', '--home', home, '--json']);
    expect(gc.code, gc.stderr).toBe(0);
    const result = JSON.parse(gc.stdout) as { deletedTraces: string[]; deletedBlobs: number };
    expect(result.deletedTraces).toEqual(['short-lived']);
    // short-lived's snapshot is gone; same.txt's content is shared with the pinned trace and stays
    expect(result.deletedBlobs).toBeGreaterThan(0);
    expect(await blobCount(home)).toBe(blobsBefore - result.deletedBlobs);
    const remaining = (await runCli(['ls', '--home', home])).stdout;
    expect(remaining).not.toContain('short-lived');
    const rep = await runCli(['replay', 'pinned', '--home', home, '--keep', '--', process.execPath, agent], { cwd: other, env });
    expect(rep.code, rep.stderr).toBe(0);
    const sandbox = /sandbox kept at (\S+)/.exec(rep.stderr)![1]!;
    expect(readFileSync(join(sandbox, 'same.txt'), 'utf8')).toBe('identical in both workspaces\n');
    expect(readdirSync(sandbox).sort()).toEqual(['answer.txt', 'own.txt', 'same.txt']);

    // released, the pinned trace expires by the policy again (from its creation: already past)
    expect((await runCli(['keep', 'pinned', '--release', '--home', home])).code).toBe(0);
    expect(JSON.parse((await runCli(['gc', '--home', home, '--json'])).stdout).deletedTraces).toEqual(['pinned']);
    expect(await blobCount(home)).toBe(0);
  });

  it('bad input: a broken config.json and an unknown trace each give one line', async () => {
    const home = fx.freshHome();
    expect((await runCli(['keep', 'nope', '--home', home])).stderr.trim().split('\n')).toHaveLength(1);
    writeFileSync(join(home, 'config.json'), '{ not json');
    const gc = await runCli(['gc', '--home', home]);
    expect(gc.code).toBe(2);
    expect(gc.stderr).toMatch(/config\.json is not valid JSON/);
  });
});
