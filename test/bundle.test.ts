import { describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { useUpstreamFixture } from './helpers/cli-fixture.js';
import { ROOT, runCli, startCliDaemon } from './helpers/cli.js';

const fx = useUpstreamFixture('bundle');
const agent = join(ROOT, 'test', 'fixtures', 'node-agent.mjs');
const env = { OPENAI_API_KEY: 'sk-proj-bundle0000000000000000000000000', OPENAI_BASE_URL: '' };

function verdictOf(stderr: string): string {
  return /^(verdict: .*)$/m.exec(stderr)![1]!.replace(/child-exit=\S+ /, '');
}

describe('portable bundles', () => {
  it('round trip across two homes gives the same verdict; the stored bytes are identical', async () => {
    const homeA = fx.freshHome();
    const homeB = fx.freshHome();
    const work = mkdtempSync(join(fx.work, 'ws-'));
    writeFileSync(join(work, 'notes.txt'), 'workspace content travels with the bundle\n');
    const rec = await runCli(['record', '--home', homeA, '--trace', 'handover', '--intercept', '+tools.example.test', ...fx.routing(), '--', process.execPath, agent], { cwd: work, env });
    expect(rec.code, rec.stderr).toBe(0);
    const replayA = await runCli(['replay', 'handover', '--home', homeA, '--', process.execPath, agent], { cwd: work, env });
    expect(replayA.code, replayA.stderr).toBe(0);

    const file = join(fx.work, 'handover.bundle');
    const exported = await runCli(['export', 'handover', '--bundle', file, '--home', homeA]);
    expect(exported.code, exported.stderr).toBe(0);
    expect(exported.stderr).toMatch(/exported trace handover \(3 records, \d+ bytes\)/);
    expect(readFileSync(file).toString('latin1')).not.toContain('sk-proj-bundle');
    // a transcript: readable by its owner only
    expect(statSync(file).mode & 0o777).toBe(0o600);

    const imported = await runCli(['import', file, '--home', homeB]);
    expect(imported.code, imported.stderr).toBe(0);
    expect(imported.stderr).toContain('imported trace handover (3 records)');
    const rawA = await runCli(['show', 'handover', '--raw', '--home', homeA]);
    const rawB = await runCli(['show', 'handover', '--raw', '--home', homeB]);
    expect(rawB.stdout).toBe(rawA.stdout);
    // another machine, another key: the same verdict, in a sandbox restored from the bundled snapshot
    const other = mkdtempSync(join(fx.work, 'elsewhere-'));
    const replayB = await runCli(['replay', 'handover', '--home', homeB, '--keep', '--', process.execPath, agent], { cwd: other, env: { ...env, OPENAI_API_KEY: 'sk-proj-someoneelse0000000000000000000' } });
    expect(replayB.code, replayB.stderr).toBe(0);
    expect(verdictOf(replayB.stderr)).toBe(verdictOf(replayA.stderr));
    const sandbox = /sandbox kept at (\S+)/.exec(replayB.stderr)![1]!;
    expect(readFileSync(join(sandbox, 'notes.txt'), 'utf8')).toBe('workspace content travels with the bundle\n');
    // the recorded home's replay report came along
    expect((await runCli(['report', 'handover', '--home', homeB])).stdout).toContain('-> PASS');

    // importing the same bundle again changes nothing
    const again = await runCli(['import', file, '--home', homeB]);
    expect(again.code).toBe(0);
    expect(again.stderr).toContain('already here, identical');
  });

  it('a tampered or truncated bundle is refused with one line; a different trace is not overwritten without --force', async () => {
    const home = fx.freshHome();
    expect((await runCli(['record', '--home', home, '--trace', 'one', '--no-workspace', '--intercept', '+tools.example.test', ...fx.routing(), '--', process.execPath, agent], { env, cwd: fx.work })).code).toBe(0);
    expect((await runCli(['record', '--home', home, '--trace', 'two', '--no-workspace', '--intercept', '+tools.example.test', ...fx.routing(), '--', process.execPath, agent], { env: { ...env, AGENT_VARIANT: '!' }, cwd: fx.work })).code).toBe(0);
    const file = join(fx.work, 'one.bundle');
    expect((await runCli(['export', 'one', '--bundle', file, '--home', home])).code).toBe(0);
    const good = readFileSync(file);

    const tampered = Buffer.from(good);
    tampered[tampered.length - 20] ^= 0xff;
    writeFileSync(join(fx.work, 'tampered.bundle'), tampered);
    writeFileSync(join(fx.work, 'truncated.bundle'), good.subarray(0, good.length - 100));
    writeFileSync(join(fx.work, 'junk.bundle'), 'not a bundle at all');
    const target = fx.freshHome();
    for (const bad of ['tampered.bundle', 'truncated.bundle', 'junk.bundle']) {
      const result = await runCli(['import', join(fx.work, bad), '--home', target]);
      expect(result.code, bad).toBe(2);
      expect(result.stderr.trim().split('\n')).toHaveLength(1);
      expect(result.stderr).toMatch(bad === 'junk.bundle' ? /is not a mitm-replay bundle/ : /failed its integrity check .* truncated or modified/);
    }
    expect((await runCli(['ls', '--home', target])).stdout).toContain('no traces yet');

    // 'one' exported, imported as 'two' into the home that has a different 'two'
    const clash = await runCli(['import', file, '--trace', 'two', '--home', home]);
    expect(clash.code).toBe(2);
    expect(clash.stderr).toContain("a different trace named 'two' exists");
    // beside a running daemon, through its control API, with --force
    const daemon = await startCliDaemon(fx.routing(), home);
    try {
      const forced = await runCli(['import', file, '--trace', 'two', '--force', '--home', home]);
      expect(forced.code, forced.stderr).toBe(0);
      const shown = await runCli(['show', 'two', '--raw', '--home', home]);
      const original = await runCli(['show', 'one', '--raw', '--home', home]);
      expect(shown.stdout).toBe(original.stdout);
    } finally {
      daemon.child.kill('SIGTERM');
      await new Promise((r) => daemon.child.once('exit', r));
    }
  });
});
