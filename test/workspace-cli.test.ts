import { beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ReplayReport } from '../src/replay/verdict.js';
import { readMeta, useUpstreamFixture } from './helpers/cli-fixture.js';
import { ROOT, pythonWithHttpx, run, runCli } from './helpers/cli.js';

const fx = useUpstreamFixture('workspace-cli');
let python: string;

beforeAll(() => {
  const found = pythonWithHttpx();
  if (!found) throw new Error('these tests need python3 with httpx (Debian python3-httpx); .ci/run installs it');
  python = found;
});

const agent = join(ROOT, 'test', 'fixtures', 'weather-agent.py');
const routing = () => ['--intercept', '+tools.example.test', ...fx.routing()];

/** A git work tree holding the agent's input, a .env with a secret, and a git-ignored log. */
async function makeWorkspace(): Promise<{ dir: string; secret: string; password: string }> {
  const dir = mkdtempSync(join(fx.work, 'ws-'));
  const secret = `sk-proj-${randomBytes(30).toString('base64url').replace(/[-_]/g, 'x')}`;
  // a secret with no recognisable shape: caught by its name (env-secret)
  const password = `pw-${randomBytes(9).toString('hex')}`;
  writeFileSync(join(dir, 'input.txt'), 'Paris\n');
  writeFileSync(join(dir, '.env'), `OPENAI_API_KEY=${secret}\nDB_PASSWORD=${password}\nCANARY=plain-value\n`);
  writeFileSync(join(dir, '.gitignore'), 'ignored.log\n');
  writeFileSync(join(dir, 'ignored.log'), 'not for the snapshot\n');
  await run('git', ['init', '-q'], { cwd: dir });
  return { dir, secret, password };
}

function sandboxOf(stderr: string): string {
  return /sandbox kept at (\S+)/.exec(stderr)![1]!;
}

describe('workspace snapshot, sandboxed replay, outcome', () => {
  it('replays on the restored snapshot: the real cwd is untouched and later edits do not matter', async () => {
    const home = fx.freshHome();
    const { dir, secret, password } = await makeWorkspace();
    const rec = await runCli(['record', '--home', home, '--trace', 'ws', ...routing(), '--', python, agent], { cwd: dir, env: { PATCH: 'fix' } });
    expect(rec.code, rec.stderr).toBe(0);
    expect(rec.stderr).toContain('secrets redacted before storing in .env');
    expect(rec.stderr).toMatch(/workspace: \d+ files snapshotted, 1 changed by the run/);
    const meta = (await readMeta(home, 'ws'))!;
    expect(meta.workspace!.redactedFiles).toEqual(['.env']);
    expect(meta.workspace!.diff!.map((c) => [c.path, c.change])).toEqual([['result.txt', 'added']]);
    // the key never reached the store; .gitignore was respected
    const onDisk = readdirSync(join(home, 'traces')).map((f) => readFileSync(join(home, 'traces', f)).toString('latin1')).join('');
    expect(onDisk).not.toContain(secret);
    expect(onDisk).not.toContain(password);

    // change the input in the real cwd: the replay still runs on the recorded snapshot
    writeFileSync(join(dir, 'input.txt'), 'Berlin\n');
    const before = readFileSync(join(dir, 'result.txt'), 'utf8');
    const rep = await runCli(['replay', 'ws', '--home', home, '--keep', '--', python, agent], { cwd: dir, env: { PATCH: 'fix' } });
    expect(rep.code, rep.stderr).toBe(0);
    expect(rep.stderr).toContain('child-exit=0 recorded-exit=0 files=same -> PASS');
    expect(readFileSync(join(dir, 'result.txt'), 'utf8')).toBe(before);
    expect(readFileSync(join(dir, 'input.txt'), 'utf8')).toBe('Berlin\n');
    const sandbox = sandboxOf(rep.stderr);
    expect(sandbox.startsWith(dir)).toBe(false);
    expect(readFileSync(join(sandbox, 'input.txt'), 'utf8')).toBe('Paris\n');
    expect(existsSync(join(sandbox, 'ignored.log'))).toBe(false);
    expect(readFileSync(join(sandbox, '.env'), 'utf8')).toContain('[REDACTED:');
    expect(readFileSync(join(sandbox, '.env'), 'utf8')).toContain('DB_PASSWORD=[REDACTED:env-secret]\n');
    expect(readFileSync(join(sandbox, '.env'), 'utf8')).toContain('CANARY=plain-value');
    rmSync(sandbox, { recursive: true, force: true });

    // --in-place runs in the cwd (with the edited input: the agent asks about Berlin, which was never recorded)
    const inPlace = await runCli(['replay', 'ws', '--home', home, '--in-place', '--', python, agent], { cwd: dir, env: { PATCH: 'fix' } });
    expect(inPlace.code).toBe(1);
    expect(inPlace.stderr).toContain('-> FAIL');
  });

  it('reports per-file differences with a unified diff when the outcome differs', async () => {
    const home = fx.freshHome();
    const { dir } = await makeWorkspace();
    expect((await runCli(['record', '--home', home, '--trace', 'diff', ...routing(), '--', python, agent], { cwd: dir, env: { PATCH: 'fix' } })).code).toBe(0);
    const json = join(fx.work, 'diff.json');
    const rep = await runCli(['replay', 'diff', '--home', home, '--json', json, '--', python, agent], { cwd: dir, env: { PATCH: '' } });
    expect(rep.code).toBe(0); // the traffic matched; the outcome does not decide the exit code
    expect(rep.stderr).toContain('child-exit=1 recorded-exit=0 files=different:1 -> PASS');
    const report = JSON.parse(readFileSync(json, 'utf8')) as ReplayReport;
    const difference = report.outcome!.differences[0]!;
    expect(difference.path).toBe('result.txt');
    expect(difference.unifiedDiff).toContain('-Paris: ');
    expect(difference.unifiedDiff).toContain('+result: unknown');
  });

  it('compare: the four readings', async () => {
    const home = fx.freshHome();
    const { dir } = await makeWorkspace();
    // the recorded run fails: exit 1, a bad result file, caused by the tool answer held in the recording
    const rec = await runCli(['record', '--home', home, '--trace', 'bug', ...routing(), '--', python, agent], { cwd: dir });
    expect(rec.code).toBe(1);
    const unpatched = `${python} ${agent}`;
    const compare = (control: string, patched: string[]) => runCli(['compare', 'bug', '--home', home, '--control', control, '--', ...patched], { cwd: dir });

    const fixed = await compare(unpatched, ['env', 'PATCH=fix', python, agent]);
    expect(fixed.stderr).toContain('reading 3: the fix is exercised by this trajectory');
    expect(fixed.code).toBe(0);

    const prompt = await compare(unpatched, ['env', 'PATCH=prompt', python, agent]);
    expect(prompt.stderr).toMatch(/reading 2: patched diverges from the recording at exchange 1; this recording cannot judge it beyond that point/);
    expect(prompt.code).toBe(1);

    const passingControl = await compare(`env PATCH=fix ${python} ${agent}`, ['env', 'PATCH=fix', python, agent]);
    expect(passingControl.stderr).toContain('reading 1: the failure does not reproduce on this recording; a green patched run says nothing about the fix');
    expect(passingControl.code).toBe(1);

    const noop = await compare(unpatched, [python, agent]);
    expect(noop.stderr).toContain('reading 4: the patch does not change the outcome on this recording');
    expect(noop.code).toBe(1);
    // each arm's report is kept
    const runId = /control run (r-\S+):/.exec(noop.stderr)![1]!;
    expect((await runCli(['report', 'bug', '--home', home, '--run', runId])).stdout).toContain(runId);
  });

  it('--repeat 4 with an outcome that depends on something outside the recording: the tally shows 2/2', async () => {
    const home = fx.freshHome();
    const { dir } = await makeWorkspace();
    expect((await runCli(['record', '--home', home, '--trace', 'flaky', ...routing(), '--', python, agent], { cwd: dir, env: { PATCH: 'fix' } })).code).toBe(0);
    const counter = join(fx.work, `counter-${randomBytes(4).toString('hex')}`);
    const rep = await runCli(['replay', 'flaky', '--home', home, '--repeat', '4', '--', python, agent], { cwd: dir, env: { PATCH: 'fix', AGENT_COUNTER_FILE: counter } });
    expect(rep.stderr).toMatch(/tally: runs=4 pass=4\/4 reproduced=2\/4 outcomes: 2\/4 child-exit=0 files=same, 2\/4 child-exit=1 files=different:1/);
    expect(readFileSync(counter, 'utf8')).toBe('4');
    // each run had its own sandbox: none is left behind
    expect(readdirSync(dir).sort()).toEqual(['.env', '.git', '.gitignore', 'ignored.log', 'input.txt', 'result.txt']);
  });

  it('--same-path: a prompt that embeds the cwd matches exactly; without it the divergence is labelled absolute-path', async () => {
    const home = fx.freshHome();
    const { dir } = await makeWorkspace();
    const env = { PATCH: 'fix', AGENT_PUT_CWD: '1' };
    expect((await runCli(['record', '--home', home, '--trace', 'cwd', ...routing(), '--', python, agent], { cwd: dir, env })).code).toBe(0);
    const json = join(fx.work, 'cwd.json');
    const sandboxed = await runCli(['replay', 'cwd', '--home', home, '--json', json, '--', python, agent], { cwd: fx.work, env });
    expect(sandboxed.code).toBe(1);
    const report = JSON.parse(readFileSync(json, 'utf8')) as ReplayReport;
    expect(report.requests[0]!.divergence!.labels).toContain('absolute-path');
    // --same-path needs the recorded path free: move the original away
    const moved = `${dir}-moved`;
    await run('mv', [dir, moved]);
    const same = await runCli(['replay', 'cwd', '--home', home, '--same-path', '--', python, agent], { cwd: fx.work, env });
    expect(same.code, same.stderr).toBe(0);
    expect(same.stderr).toContain('exact=2');
    expect(existsSync(dir)).toBe(false);
    // and a path that is not free is refused clearly
    mkdirSync(dir);
    writeFileSync(join(dir, 'occupied'), 'x');
    const refused = await runCli(['replay', 'cwd', '--home', home, '--same-path', '--', python, agent], { cwd: fx.work, env });
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('is not free');
  });

  it('refuses a workspace over the size limit, with a clear message, and records nothing', async () => {
    const home = fx.freshHome();
    const { dir } = await makeWorkspace();
    writeFileSync(join(dir, 'big.bin'), Buffer.alloc(2 * 1024 * 1024, 7));
    const rec = await runCli(['record', '--home', home, '--trace', 'big', '--max-workspace-mb', '1', ...routing(), '--', python, agent], { cwd: dir });
    expect(rec.code).toBe(125);
    expect(rec.stderr.trim().split('\n')).toHaveLength(1);
    expect(rec.stderr).toMatch(/workspace .* (over|exceeds|larger).*(--exclude|--no-workspace)/i);
    expect(existsSync(join(dir, 'result.txt'))).toBe(false);
    expect(await readMeta(home, 'big')).toBeUndefined();
    // --no-workspace records it without a snapshot; its replay runs in the cwd and says so
    expect((await runCli(['record', '--home', home, '--trace', 'big', '--no-workspace', ...routing(), '--', python, agent], { cwd: dir, env: { PATCH: 'fix' } })).code).toBe(0);
    const rep = await runCli(['replay', 'big', '--home', home, '--', python, agent], { cwd: dir, env: { PATCH: 'fix' } });
    expect(rep.stderr).toContain('has no workspace snapshot; replaying in the current directory');
    expect(rep.code).toBe(0);
    expect(statSync(join(dir, 'result.txt')).isFile()).toBe(true);
  });
});
