#!/usr/bin/env node
/**
 * Makes the fixture store that test/store-migration.test.ts migrates: the PREVIOUS store format's code (a commit
 * of this repository) records real traces, and the store it wrote is copied into the repository. Nothing in the
 * fixture is written by hand.
 *
 *   node scripts/make-store-fixture.mjs --commit 1f16689 --out test/fixtures/store-v1
 *
 * What it does: exports that commit into a temp dir (git archive), installs and builds it (npm ci), starts a
 * loopback HTTPS upstream (bench/upstream-child.mjs, with a throwaway CA), then with the OLD code's CLI:
 * records `chat-v1` (test/fixtures/long-agent.py: SSE, a tool call, large resent conversations) in a workspace,
 * replays it once (so a replay report is stored), records `shape-v1` and converts it to the structural tier.
 * It writes manifest.json beside the store: the commit, its format version, and per exchange the SHA-256 of
 * every byte section as the old code reads them back, so the test can check a migration loses nothing.
 * The CA and its key stay in the temp dir, which is removed. Loopback only. Needs git, npm, python3 with httpx.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { createBenchCa } from '../bench/ca.mjs';
import { BenchProcesses } from '../bench/harness.mjs';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
const flag = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
if (args.includes('--help') || !flag('--commit') || !flag('--out')) {
  console.error('usage: node scripts/make-store-fixture.mjs --commit REV --out DIR   (REV: a commit with the previous store format)');
  process.exit(args.includes('--help') ? 0 : 2);
}
const commit = execFileSync('git', ['-C', repo, 'rev-parse', '--verify', `${flag('--commit')}^{commit}`], { encoding: 'utf8' }).trim();
const out = resolve(flag('--out'));
const procs = new BenchProcesses('[make-store-fixture]');

function run(cmd, argv, options = {}) {
  const result = spawnSync(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8', ...options });
  if (result.status !== 0) throw new Error(`${cmd} ${argv.join(' ')} exited ${result.status}:\n${result.stderr}`);
  return result;
}

try {
  const tmp = procs.tempDir('mitm-replay-fixture-');
  const old = join(tmp, 'old');
  mkdirSync(old);
  console.error(`exporting ${commit.slice(0, 12)} and building it (npm ci)…`);
  execFileSync('bash', ['-c', `git -C "${repo}" archive ${commit} | tar -x -C "${old}"`]);
  run('npm', ['ci', '--no-audit', '--no-fund'], { cwd: old });
  const { FORMAT_VERSION } = await import(pathToFileURL(join(old, 'dist/trace/schema.js')).href);

  const ca = createBenchCa(['127.0.0.1', 'api.openai.com', 'tools.example.test']);
  const caFile = join(tmp, 'upstream-ca.pem');
  writeFileSync(caFile, ca.caCertPem);
  const upstream = await procs.startUpstream({ certPem: ca.certPem, keyPem: ca.keyPem });
  const home = join(tmp, 'home');
  mkdirSync(home, { mode: 0o700 });
  const workspace = join(tmp, 'workspace');
  mkdirSync(workspace);
  writeFileSync(join(workspace, 'README.md'), '# a project the agent works in\n');
  const agent = join(repo, 'test/fixtures/long-agent.py');
  // Debian's python3 has httpx (python3-httpx); another python3 first on PATH may not
  const python = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
  const cli = (argv) => run(process.execPath, [join(old, 'bin/mitm-replay'), argv[0], '--home', home, ...argv.slice(1)], { cwd: workspace, env: { ...process.env, OPENAI_API_KEY: 'sk-fixture-0000000000000000000000' } });
  const routing = ['--intercept', '+tools.example.test', '--connect-to', `::127.0.0.1:${upstream.port}`, '--upstream-ca', caFile];

  console.error('recording chat-v1 and shape-v1 with the old code…');
  cli(['record', '--trace', 'chat-v1', ...routing, '--', python, agent]);
  cli(['replay', 'chat-v1', '--', python, agent]);
  cli(['record', '--trace', 'shape-v1', '--no-workspace', ...routing, '--', python, agent]);
  cli(['tier', 'shape-v1', 'structural']);

  // what the old code reads back, section by section
  const { TraceStore } = await import(pathToFileURL(join(old, 'dist/trace/store.js')).href);
  const store = await TraceStore.open(join(home, 'traces'));
  const sha = (b) => createHash('sha256').update(b).digest('hex');
  const traces = {};
  for (const meta of await store.listTraces()) {
    const exchanges = [];
    for await (const ex of store.exchanges(meta.name)) {
      exchanges.push({ seq: ex.record.seq, state: ex.record.state, requestHead: sha(ex.requestHead), requestBody: sha(ex.requestBody), requestBodyLength: ex.requestBody.length, responseHead: sha(ex.responseHead), responseBody: sha(ex.responseBody) });
    }
    traces[meta.name] = { tier: meta.tier, workspace: meta.workspace?.snapshot ?? null, reports: (await store.listReports(meta.name)).length, exchanges };
  }
  await store.close();

  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  // LevelDB's own LOCK and info LOG are not part of the data
  cpSync(join(home, 'traces'), join(out, 'traces'), { recursive: true, filter: (src) => !/[/\\](LOCK|LOG(\.old)?)$/.test(src) });
  writeFileSync(
    join(out, 'manifest.json'),
    `${JSON.stringify({ madeBy: 'scripts/make-store-fixture.mjs', commit, formatVersion: FORMAT_VERSION, agent: 'test/fixtures/long-agent.py', traces }, null, 2)}\n`,
  );
  if (existsSync(join(out, 'traces', 'LOCK'))) throw new Error('LOCK copied');
  console.error(`wrote ${out} (format ${FORMAT_VERSION}; files: ${readdirSync(join(out, 'traces')).join(', ')})`);
} finally {
  procs.shuttingDown = true;
  procs.cleanup();
}
