import { describe, expect, it } from 'vitest';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pythonWithHttpx, run, runCli, startCliDaemon } from './helpers/cli.js';
import { readMeta, readTrace, useUpstreamFixture } from './helpers/cli-fixture.js';

const fx = useUpstreamFixture('record');
const routing = () => fx.routing();
const freshHome = () => fx.freshHome();

function agentScript(name: string, body: string): string {
  const path = join(fx.work, name);
  writeFileSync(path, `#!/bin/sh\nset -e\n${body}\n`, { mode: 0o755 });
  return path;
}

describe('mitm-replay record -- CMD', () => {
  it('records a small agent end to end, prints the trace and summary, exits with the child code', async () => {
    const home = freshHome();
    const agent = agentScript(
      'agent.sh',
      [
        `curl -sS -o ${fx.work}/chat.out https://api.openai.com/v1/chat/completions -H 'content-type: application/json' -H 'x-test-id: rec-chat' -d '{"model":"gpt-4o-mini","stream":true}'`,
        `curl -sS -o ${fx.work}/tool.out 'https://tools.example.test/tool/weather?city=Paris' -H 'x-test-id: rec-tool'`,
        'exit 3',
      ].join('\n'),
    );
    const result = await runCli(['record', '--home', home, '--trace', 'agent-run', '--intercept', '+tools.example.test', ...routing(), '--', agent]);
    expect(result.stderr).toContain('trace agent-run: 2 exchanges');
    expect(result.code).toBe(3);
    expect(readFileSync(join(fx.work, 'chat.out')).equals(fx.upstream.sent.get('rec-chat')!)).toBe(true);
    const exchanges = await readTrace(home, 'agent-run');
    expect(exchanges.map((e) => e.record.origin.host)).toEqual(['api.openai.com', 'tools.example.test']);
    const meta = (await readMeta(home, 'agent-run'))!;
    expect(meta.command).toEqual([agent]);
    expect(meta.exitCode).toBe(3);
    expect(meta.intercept).toContain('tools.example.test');
    expect(meta.redaction.headers.length).toBeGreaterThan(0);
  });

  it('exits 128+N when a signal kills the child', async () => {
    const home = freshHome();
    const result = await runCli(['record', '--home', home, ...routing(), '--', 'sh', '-c', 'kill -TERM $$']);
    expect(result.code).toBe(128 + 15);
  });

  it('refuses an existing trace name (exit 125, says how to pick another) unless --force', async () => {
    const home = freshHome();
    expect((await runCli(['record', '--home', home, '--trace', 'dup', ...routing(), '--', 'true'])).code).toBe(0);
    const again = await runCli(['record', '--home', home, '--trace', 'dup', ...routing(), '--', 'true']);
    expect(again.code).toBe(125);
    expect(again.stderr.trim().split('\n')).toHaveLength(1);
    expect(again.stderr).toMatch(/already exists.*--trace.*--force/);
    expect((await runCli(['record', '--home', home, '--trace', 'dup', '--force', ...routing(), '--', 'true'])).code).toBe(0);
  });

  it('names tunnelled hosts in the summary with the --intercept that would capture them, storing metadata only', async () => {
    const home = freshHome();
    const agent = agentScript('tunnel.sh', `curl -sS -o /dev/null --cacert ${fx.ca.caPath} https://api.anthropic.com/v1/embeddings -d '{}'`);
    const result = await runCli(['record', '--home', home, '--trace', 'tun', '--intercept', 'api.openai.com', ...routing(), '--', agent]);
    expect(result.code).toBe(0);
    expect(result.stderr).toContain('tunnelled without decryption: api.anthropic.com (to capture: --intercept +api.anthropic.com)');
    const exchanges = await readTrace(home, 'tun');
    expect(exchanges).toHaveLength(1);
    const tunnel = exchanges[0]!;
    expect(tunnel.record.kind).toBe('tunnel');
    expect(tunnel.record.tunnel!.bytesUp).toBeGreaterThan(100);
    expect(tunnel.record.tunnel!.bytesDown).toBeGreaterThan(100);
    expect(tunnel.requestHead.length + tunnel.requestBody.length + tunnel.responseHead.length + tunnel.responseBody.length).toBe(0);
  });

  it('two concurrent records on one home both fx.work; the first daemon stays up for the second', async () => {
    const home = freshHome();
    const slow = agentScript('slow.sh', `sleep 1.5\ncurl -sS -o /dev/null https://tools.example.test/echo -H 'x-test-id: second'`);
    const fast = agentScript('fast.sh', `sleep 0.5\ncurl -sS -o /dev/null https://tools.example.test/echo -H 'x-test-id: first'`);
    const first = runCli(['record', '--home', home, '--trace', 'one', '--intercept', '+tools.example.test', ...routing(), '--', fast]);
    await new Promise((r) => setTimeout(r, 300));
    const second = runCli(['record', '--home', home, '--trace', 'two', '--intercept', '+tools.example.test', ...routing(), '--', slow]);
    const [a, b] = await Promise.all([first, second]);
    expect(a.code).toBe(0);
    expect(b.code, b.stderr).toBe(0);
    expect(b.stderr).toContain('using the daemon already running');
    expect(b.stderr).toContain('--intercept, --connect-to, --upstream-ca are ignored');
    expect((await readTrace(home, 'one')).map((e) => e.record.kind)).toEqual(['http']);
    expect((await readTrace(home, 'two')).map((e) => e.record.kind)).toEqual(['http']);
  });

  it('a failing store write: the agent still gets its response, the trace is marked broken, record and ls say so', async () => {
    const home = freshHome();
    const agent = agentScript('faulty.sh', `curl -sS -o ${fx.work}/faulty.out -H 'x-test-id: faulty' https://tools.example.test/echo`);
    const result = await runCli(['record', '--home', home, '--trace', 'faulty', '--no-workspace', '--intercept', '+tools.example.test', ...routing(), '--', agent], {
      env: { MITM_REPLAY_FAULT_EXCHANGE_WRITES: '1' },
    });
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(readFileSync(join(fx.work, 'faulty.out'), 'utf8')).method).toBe('GET');
    expect(result.stderr).toMatch(/WARNING: \d+ store write\(s\) failed, the trace is incomplete/);
    const ls = await runCli(['ls', '--home', home]);
    expect(ls.stdout).toMatch(/^faulty\s.*BROKEN \(\d+ write\(s\) failed\)$/m);
    expect((await readMeta(home, 'faulty'))!.broken!.writeErrors).toBeGreaterThan(0);
  });

  it('bad input: no command, unknown flag, bad --connect-to, bad trace name each exit 125 with one line', async () => {
    const home = freshHome();
    for (const args of [
      ['record', '--home', home],
      ['record', '--home', home, '--bogus', '--', 'true'],
      ['record', '--home', home, '--connect-to', 'a:b', '--', 'true'],
      ['record', '--home', home, '--trace', 'no/slash', '--', 'true'],
      ['record', '--home', home, '--listen', '10.0.0.1:80', '--', 'true'],
    ]) {
      const result = await runCli(args);
      expect(result.code, args.join(' ')).toBe(125);
      expect(result.stderr.trim().split('\n'), result.stderr).toHaveLength(1);
      expect(result.stderr).toMatch(/^mitm-replay: record: /);
    }
  });

  it('a command that does not exist: exit 125 and a clear message', async () => {
    const result = await runCli(['record', '--home', freshHome(), ...routing(), '--', '/nonexistent/agent']);
    expect(result.code).toBe(125);
    expect(result.stderr).toContain("cannot start '/nonexistent/agent'");
  });
});

describe('daemon + env: an agent started by hand', () => {
  it('env --trace registers a session; curl and python httpx record through it; SIGTERM exits 0 with the trace closed', async () => {
    const home = freshHome();
    const daemon = await startCliDaemon(['--intercept', '+tools.example.test', ...routing()], home);
    try {
      const env = await runCli(['env', '--home', home, '--trace', 'by-hand']);
      expect(env.code).toBe(0);
      const vars: Record<string, string> = {};
      for (const line of env.stdout.trim().split('\n')) {
        const match = /^export ([A-Za-z_]+)='(.*)'$/.exec(line)!;
        vars[match[1]!] = match[2]!;
      }
      expect(vars.HTTPS_PROXY).toMatch(/^http:\/\/by-hand:[^@]+@127\.0\.0\.1:\d+$/);
      expect(vars.SSL_CERT_FILE).toBe(join(home, 'certs', 'bundle.pem'));
      expect(vars.NODE_EXTRA_CA_CERTS).toBe(join(home, 'certs', 'ca.pem'));
      expect(vars.OPENAI_BASE_URL).toMatch(/\/__mitm-replay\/b\/by-hand:[^/]+\/https\/api\.openai\.com\/v1$/);
      const childEnv = { ...process.env, ...vars };
      const curl = await run('curl', ['-sS', '-H', 'x-test-id: by-hand-curl', 'https://tools.example.test/echo'], { env: childEnv });
      expect(curl.code, curl.stderr).toBe(0);
      const python = pythonWithHttpx();
      if (python) {
        const py = await run(python, ['-c', "import httpx; r = httpx.post('https://api.openai.com/v1/embeddings', json={'model':'m','input':'x'}, headers={'x-test-id':'by-hand-httpx'}); print(r.status_code)"], { env: childEnv });
        expect(py.stdout.trim(), py.stderr).toBe('200');
      }
      // a wrong token is refused (nothing recorded)
      const bad = await run('curl', ['-sS', '-o', '/dev/null', '-w', '%{http_connect}', '-x', vars.HTTPS_PROXY!.replace(/:[^:@]+@/, ':wrong@'), 'https://tools.example.test/echo'], { env: childEnv });
      expect(bad.stdout).toBe('407');
    } finally {
      daemon.child.kill('SIGTERM');
      const code = await new Promise((r) => daemon.child.once('exit', r));
      expect(code).toBe(0);
    }
    const exchanges = await readTrace(home, 'by-hand');
    const ids = exchanges.map((e) => /x-test-id: (\S+)/.exec(e.requestHead.toString())?.[1]);
    expect(ids).toContain('by-hand-curl');
    if (pythonWithHttpx()) expect(ids).toContain('by-hand-httpx');
    expect(exchanges.every((e) => e.record.state === 'complete')).toBe(true);
  });

  it('restarting the daemon with the same --trace continues it and notes the restart', async () => {
    const home = freshHome();
    for (let round = 0; round < 2; round++) {
      const daemon = await startCliDaemon(['--trace', 'continued', '--intercept', '+tools.example.test', ...routing()], home);
      const curl = await run('curl', ['-sS', '-o', '/dev/null', '-x', `http://127.0.0.1:${daemon.port}`, '--cacert', join(home, 'certs', 'ca.pem'), 'https://tools.example.test/echo']);
      expect(curl.code, curl.stderr).toBe(0);
      daemon.child.kill(round === 0 ? 'SIGKILL' : 'SIGTERM');
      await new Promise((r) => daemon.child.once('exit', r));
    }
    const exchanges = await readTrace(home, 'continued');
    expect(exchanges.map((e) => e.record.seq)).toEqual([0, 1]);
    const meta = (await readMeta(home, 'continued'))!;
    expect(meta.restarts).toHaveLength(1);
  });

  it('env without a running daemon says how to start one', async () => {
    const result = await runCli(['env', '--home', freshHome()]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/no daemon is running.*mitm-replay daemon/);
  });
});

describe('--help on every command', () => {
  for (const command of ['daemon', 'record', 'env', 'trust-ca', 'replay', 'report', 'end', 'compare', 'ls', 'show', 'export', 'import', 'keep', 'gc', 'tier', 'ui']) {
    it(`${command} --help`, async () => {
      const result = await runCli([command, '--help']);
      expect(result.code).toBe(0);
      expect(result.stdout).toMatch(new RegExp(`usage: mitm-replay ${command}`, "i"));
    });
  }
  it('top-level --help and unknown command', async () => {
    expect((await runCli(['--help'])).stdout).toContain('commands:');
    const unknown = await runCli(['frobnicate']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain("unknown command 'frobnicate'");
  });
});
