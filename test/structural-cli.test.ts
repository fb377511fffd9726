import { beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { useUpstreamFixture } from './helpers/cli-fixture.js';
import { ROOT, pythonWithHttpx, run, runCli } from './helpers/cli.js';

const fx = useUpstreamFixture('structural');
const agent = join(ROOT, 'test', 'fixtures', 'weather-agent.py');
// the store scan must see plaintext: LevelDB's compression off, in every process that writes the store
const env = { MITM_REPLAY_STORE_COMPRESSION: '0' };
let python: string;

beforeAll(() => {
  const found = pythonWithHttpx();
  if (!found) throw new Error('these tests need python3 with httpx (Debian python3-httpx); .ci/run installs it');
  python = found;
});

function storeBytes(home: string): string {
  const dir = join(home, 'traces');
  return readdirSync(dir)
    .filter((f) => statSync(join(dir, f)).isFile())
    .map((f) => readFileSync(join(dir, f)).toString('latin1'))
    .join('\n');
}

async function workspaceWithCanary(): Promise<{ dir: string; canary: string }> {
  const dir = mkdtempSync(join(fx.work, 'ws-'));
  const canary = `Canaryville${randomBytes(6).toString('hex')}`;
  writeFileSync(join(dir, 'input.txt'), `${canary}\n`);
  await run('git', ['init', '-q'], { cwd: dir });
  return { dir, canary };
}

const routing = () => ['--intercept', '+tools.example.test', ...fx.routing()];

describe('structural tier', () => {
  it('tier NAME structural leaves no payload on disk, keeps header names, and a structural replay reproduces a shape-dependent bug', async () => {
    const home = fx.freshHome();
    const { dir, canary } = await workspaceWithCanary();
    // the agent's bug depends on the tool answer's shape (it reads a key the answer does not have): exit 1
    const rec = await runCli(['record', '--home', home, '--trace', 'shape', ...routing(), '--', python, agent], { cwd: dir, env });
    expect(rec.code).toBe(1);
    expect(storeBytes(home)).toContain(canary); // the scan sees plaintext while the trace is full

    const converted = await runCli(['tier', 'shape', 'structural', '--home', home], { env });
    expect(converted.code, converted.stderr).toBe(0);
    expect(converted.stderr).toMatch(/trace shape is structural now \(2 records reduced to their shape; dropped the workspace snapshot; \d+ blob\(s\) and \d+ body chunk\(s\) deleted; store compacted\)/);
    const bytes = storeBytes(home);
    expect(bytes).not.toContain(canary);
    expect(bytes).not.toContain('What is the weather in');
    expect(bytes).toContain('x-upstream-request-id'); // a header name: structure, meant to survive
    expect((await runCli(['ls', '--home', home])).stdout).toMatch(/^shape\s+\S+ \S+\s+structural\s+\d{4}-/m);

    const rep = await runCli(['replay', 'shape', '--home', home, '--', python, agent], { cwd: dir, env });
    expect(rep.stderr).toMatch(/exact=2 .* tier=structural child-exit=1 recorded-exit=1 -> PASS/);
    expect(rep.code).toBe(0);
    // a different shape (a longer city name) is a divergence, not a match
    writeFileSync(join(dir, 'input.txt'), `${canary}-and-more\n`);
    const other = await runCli(['replay', 'shape', '--home', home, '--in-place', '--', python, agent], { cwd: dir, env });
    expect(other.stderr).toMatch(/diverged=1/);
    expect(other.code).toBe(1);

    const back = await runCli(['tier', 'shape', 'full', '--home', home]);
    expect(back.code).toBe(2);
    expect(back.stderr).toContain('one way');
  });

  it('record --tier structural never puts a payload on disk; numbers are zeroed when config.json says so', async () => {
    const home = fx.freshHome();
    writeFileSync(join(home, 'config.json'), JSON.stringify({ structural: { numbers: 'zero' } }));
    const { dir, canary } = await workspaceWithCanary();
    const rec = await runCli(['record', '--home', home, '--trace', 'born-structural', '--tier', 'structural', ...routing(), '--', python, agent], { cwd: dir, env });
    expect(rec.code).toBe(1);
    expect(storeBytes(home)).not.toContain(canary);
    const shown = await runCli(['show', 'born-structural', '--home', home]);
    expect(shown.stdout).toContain('GET https://tools.example.test/tool/weather');
    const tool = await runCli(['show', 'born-structural', '--exchange', '1', '--home', home]);
    expect(tool.stdout).toMatch(/"temperatureC": 0\b/);
    expect(tool.stdout).not.toContain(canary);
  });
});
