import { beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { ReplayReport } from '../src/replay/verdict.js';
import { ROOT, pythonWithHttpx, run, runCli, startCliDaemon } from './helpers/cli.js';
import { useUpstreamFixture } from './helpers/cli-fixture.js';
import { TraceStore } from '../src/trace/store.js';

const fx = useUpstreamFixture('replay-cli');
let python: string | null;

beforeAll(() => {
  python = pythonWithHttpx();
});

const routing = () => ['--intercept', '+tools.example.test', ...fx.routing()];
const pyAgent = join(ROOT, 'test', 'fixtures', 'agent.py');
const nodeAgent = join(ROOT, 'test', 'fixtures', 'openai-agent.mjs');

function dirs() {
  const home = mkdtempSync(join(fx.work, 'home-'));
  const recordDir = mkdtempSync(join(fx.work, 'run-a-'));
  const replayDir = mkdtempSync(join(fx.work, 'run-b-'));
  return { home, recordDir, replayDir };
}

function readReport(file: string): ReplayReport {
  return JSON.parse(readFileSync(file, 'utf8')) as ReplayReport;
}

describe('record, then replay end to end with real clients', () => {
  it('a multi-turn agent that resends its conversation: stored as shared chunks, replayed byte for byte (PASS)', async () => {
    if (!python) return;
    const { home, recordDir, replayDir } = dirs();
    const longAgent = join(ROOT, 'test', 'fixtures', 'long-agent.py');
    const rec = await runCli(['record', '--home', home, '--trace', 'long', ...routing(), '--', python, longAgent], { cwd: recordDir });
    expect(rec.code, rec.stderr).toBe(0);
    expect(rec.stderr).toContain('trace long: 6 exchanges');
    const store = await TraceStore.open(join(home, 'traces'));
    try {
      const bodies = [];
      for await (const ex of store.exchanges('long')) bodies.push(ex.requestBody.length);
      // every model call resends the ~6 KB system prompt. Its text (a few words over and over) gives the hash
      // no content-defined boundary, so only the 4 KiB maximum cuts: the first 4 KiB are stored once, the tails
      // (each a little longer than the last) are not shared. With 16 KiB chunks nothing at all was shared.
      const { bytes } = await store.chunkStats();
      expect(bodies.filter((n) => n >= 4096)).toHaveLength(5);
      expect(bytes).toBeLessThan(bodies.reduce((a, b) => a + b, 0) * 0.7);
    } finally {
      await store.close();
    }
    const before = fx.upstream.requests.length;
    const rep = await runCli(['replay', 'long', '--home', home, '--in-place', '--', python, longAgent], { cwd: replayDir });
    expect(rep.code, rep.stderr).toBe(0);
    expect(rep.stderr).toContain('exact=6 reordered=0 diverged=0 missing=0 unused=0 egress=blocked');
    expect(fx.upstream.requests.length).toBe(before);
    expect(readFileSync(join(replayDir, 'answers.txt'), 'utf8')).toBe(readFileSync(join(recordDir, 'answers.txt'), 'utf8'));
  });

  it('Python httpx agent through HTTPS_PROXY: PASS with exact counts and zero upstream connections', async () => {
    if (!python) return;
    const { home, recordDir, replayDir } = dirs();
    const rec = await runCli(['record', '--home', home, '--trace', 'py', ...routing(), '--', python, pyAgent], { cwd: recordDir, env: { OPENAI_API_KEY: 'sk-proj-recordkey0000000000000000000000' } });
    expect(rec.code, rec.stderr).toBe(0);
    expect(rec.stderr).toContain('trace py: 3 exchanges');
    const before = { connections: fx.upstream.connections, requests: fx.upstream.requests.length };
    const json = join(fx.work, 'py-report.json');
    // a different API key on the replaying machine: no divergence
    const rep = await runCli(['replay', 'py', '--home', home, '--json', json, '--keep', ...routing(), '--', python, pyAgent], { cwd: replayDir, env: { OPENAI_API_KEY: 'sk-proj-anotherkey999999999999999999999' } });
    expect(rep.code, rep.stderr).toBe(0);
    expect(rep.stderr).toContain('verdict: recorded=3 requests=3 reused=3 exact=3 reordered=0 diverged=0 missing=0 unused=0 egress=blocked child-exit=0 recorded-exit=0 files=same -> PASS');
    expect(rep.stderr).toMatch(/replay run r-\d{8}-\d{6}-[0-9a-f]{4} of trace py/);
    expect({ connections: fx.upstream.connections, requests: fx.upstream.requests.length }).toEqual(before);
    // it ran in a sandbox restored from the snapshot; the cwd it was started from is untouched
    const sandbox = /sandbox kept at (\S+)/.exec(rep.stderr)![1]!;
    expect(readFileSync(join(sandbox, 'answer.txt'), 'utf8')).toBe(readFileSync(join(recordDir, 'answer.txt'), 'utf8'));
    expect(existsSync(join(replayDir, 'answer.txt'))).toBe(false);
    rmSync(sandbox, { recursive: true, force: true });
    const report = readReport(json);
    expect(report.child).toEqual({ exitCode: 0, signal: null, recordedExitCode: 0 });
    expect(JSON.stringify(report)).not.toContain('recordkey');
    expect(JSON.stringify(report)).not.toContain('anotherkey');
    // report shows it again
    const again = await runCli(['report', 'py', '--home', home]);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain(report.line);
    const asJson = await runCli(['report', 'last', '--home', home, '--run', report.runId, '--json']);
    expect(JSON.parse(asJson.stdout).runId).toBe(report.runId);
  });

  it('multi-step Node agent (SDK via the base-URL route, tool via HTTPS_PROXY): PASS, zero upstream connections', async () => {
    const { home, recordDir, replayDir } = dirs();
    const agent = join(ROOT, 'test', 'fixtures', 'node-agent.mjs');
    const env = { OPENAI_API_KEY: 'sk-proj-nodeagent000000000000000000000', OPENAI_BASE_URL: '' };
    const rec = await runCli(['record', '--home', home, '--trace', 'node-multi', ...routing(), '--', process.execPath, agent], { cwd: recordDir, env });
    expect(rec.code, rec.stderr).toBe(0);
    expect(rec.stderr).toContain('trace node-multi: 3 exchanges');
    const before = { connections: fx.upstream.connections, requests: fx.upstream.requests.length };
    const json = join(fx.work, 'node-multi.json');
    const rep = await runCli(['replay', 'node-multi', '--home', home, '--json', json, '--', process.execPath, agent], { cwd: replayDir, env });
    expect(rep.code, rep.stderr).toBe(0);
    expect(rep.stderr).toContain('verdict: recorded=3 requests=3 reused=3 exact=3 reordered=0 diverged=0 missing=0 unused=0 egress=blocked child-exit=0 recorded-exit=0 files=same -> PASS');
    expect({ connections: fx.upstream.connections, requests: fx.upstream.requests.length }).toEqual(before);
    const report = readReport(json);
    expect(report.requests.map((r) => r.route)).toEqual(['base-url', 'connect', 'base-url']);
    expect(JSON.parse(rep.stdout).city).toBe('Paris');
  });

  it('Node agent (official openai SDK) via the base-URL route: PASS; a changed prompt: FAIL located', async () => {
    const { home, recordDir, replayDir } = dirs();
    const rec = await runCli(['record', '--home', home, '--trace', 'node', ...routing(), '--', process.execPath, nodeAgent], { cwd: recordDir, env: { OPENAI_API_KEY: 'sk-a', OPENAI_BASE_URL: '' } });
    expect(rec.code, rec.stderr).toBe(0);
    const before = fx.upstream.connections;
    const pass = await runCli(['replay', 'node', '--home', home, '--', process.execPath, nodeAgent], { cwd: replayDir, env: { OPENAI_API_KEY: 'sk-b', OPENAI_BASE_URL: '' } });
    expect(pass.code, pass.stderr).toBe(0);
    expect(pass.stderr).toContain('exact=2');
    expect(pass.stderr).toContain('-> PASS');
    const json = join(fx.work, 'node-fail.json');
    const fail = await runCli(['replay', 'node', '--home', home, '--json', json, '--', process.execPath, nodeAgent], { cwd: replayDir, env: { OPENAI_API_KEY: 'sk-b', OPENAI_BASE_URL: '', AGENT_VARIANT: '!' } });
    expect(fx.upstream.connections).toBe(before);
    expect(fail.code).toBe(1);
    expect(fail.stderr).toContain('-> FAIL');
    const report = readReport(json);
    expect(report.verdict).toMatchObject({ requests: 1, diverged: 1, unused: 2 });
    const diverged = report.requests[0]!;
    expect(diverged).toMatchObject({ outcome: 'diverged', position: 0, recordedSeq: 0 });
    expect(diverged.divergence!.json[0]!.path).toBe('messages[0].content');
    expect(diverged.divergence!.body.firstDifferentByte).toBeGreaterThan(0);
    // the agent failed at once (no SDK retries): its own exit code is in the report, and did not decide the verdict
    expect(report.child.exitCode).not.toBe(0);
    expect(report.child.recordedExitCode).toBe(0);
  });

  it('an agent that puts its cwd and the time in the prompt: the report labels the causes', async () => {
    if (!python) return;
    const { home, recordDir, replayDir } = dirs();
    const env = { AGENT_PUT_CONTEXT: '1' };
    expect((await runCli(['record', '--home', home, '--trace', 'ctx', ...routing(), '--', python, pyAgent], { cwd: recordDir, env })).code).toBe(0);
    const json = join(fx.work, 'ctx.json');
    const rep = await runCli(['replay', '--home', home, '--json', json, '--', python, pyAgent], { cwd: replayDir, env });
    expect(rep.code).toBe(1);
    const report = readReport(json);
    expect(report.trace).toBe('ctx');
    const labels = report.requests.flatMap((r) => r.divergence?.labels ?? []);
    expect(labels).toContain('absolute-path');
    expect(labels).toContain('timestamp');
    const terminal = await runCli(['report', 'ctx', '--home', home]);
    expect(terminal.stdout).toMatch(/diverged d1 .*absolute-path/);
  });

  it('diagnostic mode exits non-zero and the verdict says DIAGNOSTIC', async () => {
    const { home, recordDir, replayDir } = dirs();
    expect((await runCli(['record', '--home', home, '--trace', 'diag', ...routing(), '--', process.execPath, nodeAgent], { cwd: recordDir, env: { OPENAI_BASE_URL: '', OPENAI_API_KEY: 'sk-a' } })).code).toBe(0);
    const rep = await runCli(['replay', 'diag', '--diagnostic', '--home', home, '--', process.execPath, nodeAgent], { cwd: replayDir, env: { OPENAI_BASE_URL: '', OPENAI_API_KEY: 'sk-a', AGENT_VARIANT: '?' } });
    expect(rep.code).toBe(1);
    expect(rep.stderr).toMatch(/diverged=1 .*-> DIAGNOSTIC/);
    // the agent got the recorded answer and completed
    expect(JSON.parse(rep.stdout).model).toBe('gpt-4o-mini');
  });

  it('env --replay + end on a running daemon; daemon --replay prints the verdict when it stops', async () => {
    const { home, recordDir } = dirs();
    expect((await runCli(['record', '--home', home, '--trace', 'hand', ...routing(), '--', process.execPath, nodeAgent], { cwd: recordDir, env: { OPENAI_BASE_URL: '', OPENAI_API_KEY: 'sk-a' } })).code).toBe(0);
    const daemon = await startCliDaemon(routing(), home);
    try {
      const env = await runCli(['env', '--home', home, '--replay', 'hand']);
      expect(env.code, env.stderr).toBe(0);
      const vars: Record<string, string> = {};
      for (const line of env.stdout.trim().split('\n')) {
        const match = /^export ([A-Za-z_]+)='(.*)'$/.exec(line);
        if (match) vars[match[1]!] = match[2]!;
      }
      expect(env.stdout).toContain(`mitm-replay end ${vars.MITM_REPLAY_RUN}`);
      const ran = await run(process.execPath, [nodeAgent], { env: { ...process.env, ...vars, OPENAI_API_KEY: 'sk-x' } });
      expect(ran.code, ran.stderr).toBe(0);
      const end = await runCli(['end', vars.MITM_REPLAY_RUN!, '--home', home]);
      expect(end.code, end.stderr).toBe(0);
      expect(end.stderr).toContain('-> PASS');
    } finally {
      daemon.child.kill('SIGTERM');
      await new Promise((r) => daemon.child.once('exit', r));
    }
    const replayDaemon = await startCliDaemon(['--replay', 'hand', ...routing()], home);
    const stderr: string[] = [];
    replayDaemon.child.stderr!.on('data', (c: Buffer) => stderr.push(c.toString()));
    replayDaemon.child.kill('SIGTERM');
    const code = await new Promise((r) => replayDaemon.child.once('exit', r));
    expect(code).toBe(0);
    expect(replayDaemon.stderr() + stderr.join('')).toContain('verdict: recorded=2 requests=0 reused=0 exact=0');
  });

  it('bad input: no such trace, bad --pace, no command: exit 2 with one line', async () => {
    const { home } = dirs();
    for (const args of [
      ['replay', 'nope', '--home', home, '--', 'true'],
      ['replay', 'nope', '--home', home, '--pace', 'slow', '--', 'true'],
      ['replay', 'nope', '--home', home],
      ['report', 'nope', '--home', home],
    ]) {
      const result = await runCli(args);
      expect(result.code, args.join(' ')).toBe(2);
      expect(result.stderr.trim().split('\n'), result.stderr).toHaveLength(1);
    }
  });
});
