import { execFileSync } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { chmodSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildRuleSet, Redactor } from '../src/capture/redact.js';
import { Glob } from '../src/launch/glob.js';
import {
  compareDiffs,
  DEFAULT_EXCLUDED_DIRS,
  DEPENDENCY_DIRS,
  diffSnapshots,
  MemoryBlobStore,
  restoreSnapshot,
  scanWorkspace,
  takeSnapshot,
  unifiedDiff,
  WorkspaceTooLargeError,
  type BlobStore,
  type Snapshot,
  type WorkspaceOptions,
} from '../src/launch/workspace.js';

const redactor = new Redactor(buildRuleSet());
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) {
    // Read-only directories from mode tests must be writable again before removal.
    try {
      execFileSync('chmod', ['-R', 'u+rwx', d]);
    } catch {
      /* already gone */
    }
    rmSync(d, { recursive: true, force: true });
  }
});

function tempDir(tag = 'ws'): string {
  const d = mkdtempSync(join(tmpdir(), `mitm-replay-${tag}-`));
  dirs.push(d);
  return d;
}

/** Writes files: value string/Buffer = content; { link } = symlink; { mode } with content; null = empty dir. */
type Spec = Record<string, string | Buffer | { link: string } | { content: string; mode: number } | null>;
function build(root: string, spec: Spec): void {
  for (const [rel, v] of Object.entries(spec)) {
    const abs = join(root, rel);
    if (v === null) {
      mkdirSync(abs, { recursive: true });
      continue;
    }
    mkdirSync(dirname(abs), { recursive: true });
    if (typeof v === 'string' || Buffer.isBuffer(v)) writeFileSync(abs, v);
    else if ('link' in v) symlinkSync(v.link, abs);
    else {
      writeFileSync(abs, v.content);
      chmodSync(abs, v.mode);
    }
  }
}

/** path -> description of everything under root (content, mode, symlink target, empty dirs). */
function tree(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (rel: string) => {
    const abs = rel === '' ? root : join(root, rel);
    const names = readdirSync(abs);
    if (names.length === 0 && rel !== '') out[rel + '/'] = `dir ${(lstatSync(abs).mode & 0o777).toString(8)}`;
    for (const name of names) {
      const r = rel === '' ? name : `${rel}/${name}`;
      const st = lstatSync(join(root, r));
      if (st.isSymbolicLink()) out[r] = `link -> ${readlinkSync(join(root, r))}`;
      else if (st.isDirectory()) walk(r);
      else out[r] = `file ${(st.mode & 0o777).toString(8)} ${readFileSync(join(root, r)).toString('base64')}`;
    }
  };
  walk('');
  return out;
}

class TestBlobs implements BlobStore {
  readonly map = new Map<string, Buffer>();
  puts = 0;
  newPuts = 0;
  async put(content: Buffer): Promise<string> {
    const hash = execFileSync('sha256sum', { input: content }).toString().slice(0, 64);
    this.puts++;
    if (!this.map.has(hash)) {
      this.newPuts++;
      this.map.set(hash, Buffer.from(content));
    }
    return hash;
  }
  async get(hash: string): Promise<Buffer | undefined> {
    return this.map.get(hash);
  }
}

/** A faster store for bigger trees (same contract, node:crypto hash). */
class MapBlobs implements BlobStore {
  readonly map = new Map<string, Buffer>();
  newPuts = 0;
  async put(content: Buffer): Promise<string> {
    const { createHash } = await import('node:crypto');
    const hash = createHash('sha256').update(content).digest('hex');
    if (!this.map.has(hash)) {
      this.newPuts++;
      this.map.set(hash, Buffer.from(content));
    }
    return hash;
  }
  async get(hash: string): Promise<Buffer | undefined> {
    return this.map.get(hash);
  }
}

const opts = (root: string, extra: Partial<WorkspaceOptions> = {}): WorkspaceOptions => ({ root, redactor, ...extra });
const paths = (s: Snapshot) => s.entries.map((e) => (e.kind === 'dir' ? `${e.path}/` : e.path));

const git = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString();
function gitRepo(spec: Spec, gitignore: string): string {
  const root = tempDir('git');
  git(root, 'init', '-q');
  build(root, { '.gitignore': gitignore, ...spec });
  git(root, 'add', '-A');
  git(root, '-c', 'user.email=t@t', '-c', 'user.name=t', 'commit', '-q', '-m', 'init');
  return root;
}

const ALNUM = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
const randomAlnum = (n: number) => Array.from({ length: n }, () => ALNUM[randomInt(ALNUM.length)]).join('');

describe('takeSnapshot / restoreSnapshot', () => {
  it('restores an identical tree: contents, modes, symlinks, empty directories', async () => {
    const root = tempDir();
    build(root, {
      'README.md': '# hello\n',
      'bin/run.sh': { content: '#!/bin/sh\necho hi\n', mode: 0o755 },
      'secret-ro.txt': { content: 'read only\n', mode: 0o400 },
      'src/a/b/c.ts': 'export const c = 1;\n',
      'src/image.bin': Buffer.from([0, 1, 2, 255, 254, 0]),
      'src/latin1.txt': Buffer.from([0x63, 0x61, 0x66, 0xe9]), // not UTF-8 -> binary
      'link-to-readme': { link: 'README.md' },
      'src/dangling': { link: '../nowhere/at/all' },
      'src/dir-link': { link: 'a' },
      'empty/nested/': null,
      'out/': null,
    });
    const blobs = new TestBlobs();
    const snap = await takeSnapshot(opts(root), blobs);
    expect(paths(snap)).toEqual([
      'README.md',
      'bin/run.sh',
      'empty/nested/',
      'link-to-readme',
      'out/',
      'secret-ro.txt',
      'src/a/b/c.ts',
      'src/dangling',
      'src/dir-link',
      'src/image.bin',
      'src/latin1.txt',
    ]);
    const byPath = new Map(snap.entries.map((e) => [e.path, e]));
    expect(byPath.get('bin/run.sh')).toMatchObject({ kind: 'file', mode: 0o755, binary: false });
    expect(byPath.get('src/image.bin')!.binary).toBe(true);
    expect(byPath.get('src/latin1.txt')!.binary).toBe(true);
    expect(byPath.get('src/dir-link')).toMatchObject({ kind: 'symlink', target: 'a' });
    expect(snap.options.gitignore).toBe(false);
    expect(snap.redactedFiles).toEqual([]);
    expect(snap.totalBytes).toBe(8 + 18 + 10 + 20 + 6 + 4);

    const target = join(tempDir('restore'), 'sandbox');
    const { linked } = await restoreSnapshot(snap, blobs, target);
    expect(linked).toEqual([]);
    expect(tree(target)).toEqual(tree(root));

    // A restored tree snapshots to the same entries.
    const again = await scanWorkspace(opts(target));
    expect(again.entries).toEqual(snap.entries);
  });

  it('refuses a target that is not empty', async () => {
    const root = tempDir();
    build(root, { 'a.txt': 'a\n' });
    const blobs = new TestBlobs();
    const snap = await takeSnapshot(opts(root), blobs);
    const target = tempDir('restore');
    writeFileSync(join(target, 'x'), 'x');
    await expect(restoreSnapshot(snap, blobs, target)).rejects.toThrow(/not empty/);
  });

  it('refuses entries that would escape the target', async () => {
    const blobs = new TestBlobs();
    const hash = await blobs.put(Buffer.from('pwned\n'));
    const base = { root: '/x', takenAt: 0, totalBytes: 6, redactedFiles: [], options: { include: [], exclude: [], textLimit: 65536, gitignore: false } };
    const file = (p: string) => ({ path: p, kind: 'file' as const, mode: 0o644, size: 6, hash, binary: false });
    const outside = tempDir('outside');
    for (const bad of ['../evil.txt', 'a/../../evil.txt', '/tmp/evil.txt', 'a/./b', 'a//b', '', '..']) {
      const target = join(tempDir('restore'), 't');
      await expect(restoreSnapshot({ ...base, entries: [file(bad)] }, blobs, target), bad).rejects.toThrow(/escapes the target/);
    }
    // Through a symlink of the snapshot itself.
    const target = join(tempDir('restore'), 't');
    const viaLink = { ...base, entries: [{ path: 'l', kind: 'symlink' as const, mode: 0o777, size: 0, target: outside }, file('l/evil.txt')] };
    await expect(restoreSnapshot(viaLink, blobs, target)).rejects.toThrow(/parent "l" is a symlink/);
    expect(readdirSync(outside)).toEqual([]);
  });

  it('links dependency directories from the recorded workspace, top-level and nested; not with null', async () => {
    const root = tempDir();
    build(root, {
      'package.json': '{"name":"x"}\n',
      'node_modules/left-pad/index.js': 'module.exports = 1;\n',
      'packages/a/index.js': 'a\n',
      'packages/a/node_modules/dep/index.js': 'dep\n',
      '.venv/bin/python': 'py\n',
      'vendor/lib.go': 'package lib\n',
      '__pycache__/x.pyc': 'pyc',
    });
    const blobs = new TestBlobs();
    const snap = await takeSnapshot(opts(root), blobs);
    expect(paths(snap)).toEqual(['package.json', 'packages/a/index.js']);
    expect(DEPENDENCY_DIRS).toEqual(['node_modules', '.venv', 'venv', 'vendor']);

    const target = join(tempDir('restore'), 'sandbox');
    const { linked } = await restoreSnapshot(snap, blobs, target, { linkDependenciesFrom: root });
    expect(linked).toEqual(['.venv', 'node_modules', 'packages/a/node_modules', 'vendor']);
    expect(readlinkSync(join(target, 'node_modules'))).toBe(join(root, 'node_modules'));
    expect(readFileSync(join(target, 'packages/a/node_modules/dep/index.js'), 'utf8')).toBe('dep\n');
    expect(() => lstatSync(join(target, '__pycache__'))).toThrow(); // not a dependency dir

    const plain = join(tempDir('restore'), 'sandbox');
    expect((await restoreSnapshot(snap, blobs, plain, { linkDependenciesFrom: null })).linked).toEqual([]);
    expect(readdirSync(plain).sort()).toEqual(['package.json', 'packages']);

    // The recorded workspace is gone: nothing to link, no error.
    const gone = join(tempDir('restore'), 'sandbox');
    expect((await restoreSnapshot(snap, blobs, gone, { linkDependenciesFrom: join(root, 'missing') })).linked).toEqual([]);
  });
});

describe('what is in a snapshot', () => {
  it('skips .git, node_modules and the other default directories at any depth', async () => {
    expect(DEFAULT_EXCLUDED_DIRS).toEqual(['.git', 'node_modules', '.venv', 'venv', 'vendor', '__pycache__']);
    const root = gitRepo(
      {
        'src/main.py': 'print(1)\n',
        'src/__pycache__/main.cpython-312.pyc': 'x',
        'node_modules/a/index.js': 'a\n',
        'web/node_modules/b/index.js': 'b\n',
        'venv/lib/site.py': 'v\n',
        'vendor': 'a file named vendor is kept\n',
      },
      '', // nothing ignored: the defaults alone must keep these out
    );
    const snap = await takeSnapshot(opts(root), new TestBlobs());
    expect(snap.options.gitignore).toBe(true);
    expect(paths(snap)).toEqual(['.gitignore', 'src/main.py', 'vendor']);

    // The same without git.
    rmSync(join(root, '.git'), { recursive: true, force: true });
    build(root, { '.git/config': '[core]\n' });
    const walked = await takeSnapshot(opts(root), new TestBlobs());
    expect(walked.options.gitignore).toBe(false);
    expect(paths(walked)).toEqual(['.gitignore', 'src/main.py', 'vendor']);
  });

  it('respects .gitignore in a git work tree, and --include adds ignored paths back', async () => {
    const root = gitRepo(
      {
        'src/app.ts': 'app\n',
        'src/sub/.gitignore': 'local.txt\n',
        'src/sub/local.txt': 'ignored by a nested .gitignore\n',
        'src/sub/kept.txt': 'kept\n',
      },
      '*.log\nbuild/\n.env\n',
    );
    build(root, {
      'debug.log': 'ignored\n',
      'build/out.js': 'ignored dir\n',
      'build/deep/x.js': 'ignored dir\n',
      '.env': 'A=1\n',
      'notes.txt': 'untracked, not ignored\n',
      'new/empty/': null,
      'src/empty/': null,
      'build/empty/': null,
      'node_modules/pkg/index.js': 'dep\n',
      'node_modules/pkg/.env': 'dep env\n',
    });
    // Tracked although ignored: git ls-files --cached lists it.
    build(root, { 'forced.log': 'tracked\n' });
    git(root, 'add', '-f', 'forced.log');

    const snap = await takeSnapshot(opts(root), new TestBlobs());
    expect(paths(snap)).toEqual(['.gitignore', 'forced.log', 'new/empty/', 'notes.txt', 'src/app.ts', 'src/empty/', 'src/sub/.gitignore', 'src/sub/kept.txt']);

    const inc = await takeSnapshot(opts(root, { include: ['.env', '*.log', 'build/deep'] }), new TestBlobs());
    expect(paths(inc)).toEqual([
      '.env',
      '.gitignore',
      'build/deep/x.js',
      'debug.log',
      'forced.log',
      'new/empty/',
      'notes.txt',
      'src/app.ts',
      'src/empty/',
      'src/sub/.gitignore',
      'src/sub/kept.txt',
    ]);
    expect(inc.options.include).toEqual(['.env', '*.log', 'build/deep']);

    // A whole ignored directory, and a default directory named by the pattern.
    const dirs = await takeSnapshot(opts(root, { include: ['build', 'node_modules/pkg/index.js', 'src/sub/local.txt'] }), new TestBlobs());
    expect(paths(dirs)).toEqual(
      expect.arrayContaining(['build/out.js', 'build/deep/x.js', 'build/empty/', 'node_modules/pkg/index.js', 'src/sub/local.txt']),
    );
    expect(paths(dirs)).not.toContain('node_modules/pkg/.env');
  });

  it('lists nested repositories with their own ignore rules', async () => {
    const root = gitRepo({ 'a.txt': 'a\n' }, '');
    const nested = join(root, 'tools');
    mkdirSync(nested);
    git(nested, 'init', '-q');
    build(nested, { '.gitignore': 'cache/\n', 'tool.py': 'x\n', 'cache/big.bin': 'c' });
    const snap = await takeSnapshot(opts(root), new TestBlobs());
    expect(paths(snap)).toEqual(['.gitignore', 'a.txt', 'tools/.gitignore', 'tools/tool.py']);
  });

  it('works in a subdirectory of a repository, and walks a workspace that the enclosing repository ignores', async () => {
    const repo = gitRepo({ 'packages/app/src/a.ts': 'a\n', 'packages/app/x.tmp': 't', 'packages/.gitignore': '/app/generated/\n', 'other/b.ts': 'b\n' }, '*.tmp\nscratch/\n');
    build(repo, { 'packages/app/generated/g.ts': 'gen\n', 'packages/app/y.tmp': 'ignored' });
    git(repo, 'add', '-f', 'packages/app/x.tmp'); // tracked although ignored
    const app = join(repo, 'packages/app');
    const snap = await takeSnapshot(opts(app), new TestBlobs());
    expect(snap.options.gitignore).toBe(true);
    expect(paths(snap)).toEqual(['src/a.ts', 'x.tmp']);
    expect(snap.gitRules).toMatchObject({ prefix: 'packages/app/' });
    expect(snap.gitRules!.ancestors.map((a) => a.path)).toEqual(['.gitignore', 'packages/.gitignore']);

    build(repo, { 'scratch/ws/file.txt': 'f\n', 'scratch/ws/more/y.log': 'y\n' });
    const ignoredWs = await takeSnapshot(opts(join(repo, 'scratch/ws')), new TestBlobs());
    expect(ignoredWs.options.gitignore).toBe(false);
    expect(paths(ignoredWs)).toEqual(['file.txt', 'more/y.log']);
  });

  it('applies --exclude (basename anywhere, anchored paths, directories) and it wins over --include', async () => {
    const root = tempDir();
    build(root, {
      'a.txt': 'a',
      'data/big.csv': '1,2',
      'data/keep.md': 'k',
      'src/x.tmp': 't',
      'src/deep/y.tmp': 't',
      'src/deep/z.ts': 'z',
      'docs/data/other.csv': 'o',
    });
    const snap = await takeSnapshot(opts(root, { exclude: ['*.tmp', 'data/*.csv', 'docs'] }), new TestBlobs());
    expect(paths(snap)).toEqual(['a.txt', 'data/keep.md', 'src/deep/z.ts']);
    const both = await takeSnapshot(opts(root, { include: ['src/x.tmp'], exclude: ['*.tmp'] }), new TestBlobs());
    expect(paths(both)).not.toContain('src/x.tmp');
  });

  it('never snapshots skipDirs (the mitm-replay home), even with --include', async () => {
    const root = tempDir();
    build(root, { 'a.txt': 'a', '.mitm-replay/certs/ca-key.pem': 'KEY', '.mitm-replay/traces/t.json': '{}' });
    const o = opts(root, { skipDirs: [join(root, '.mitm-replay')], include: ['.mitm-replay', '*.pem'] });
    expect(paths(await takeSnapshot(o, new TestBlobs()))).toEqual(['a.txt']);
  });

  it('skips sockets and fifos', async () => {
    const root = tempDir();
    build(root, { 'a.txt': 'a' });
    execFileSync('mkfifo', [join(root, 'pipe')]);
    expect(paths(await takeSnapshot(opts(root), new TestBlobs()))).toEqual(['a.txt']);
  });

  it('refuses a workspace over maxBytes with a one-line message, before storing anything', async () => {
    const root = tempDir();
    build(root, { 'data/blob.bin': randomBytes(3000), 'a.txt': 'x'.repeat(100), 'node_modules/huge.bin': randomBytes(50_000) });
    const blobs = new TestBlobs();
    const err = await takeSnapshot(opts(root, { maxBytes: 2048 }), blobs).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkspaceTooLargeError);
    const message = (err as Error).message;
    expect(message).not.toContain('\n');
    expect(message).toContain(root);
    expect(message).toMatch(/3\.0 KB|0\.0 MB|MB/);
    expect(message).toContain('--exclude');
    expect(message).toContain('--max-workspace-mb');
    expect(message).toContain('--no-workspace');
    expect(message).toContain('data/');
    expect((err as WorkspaceTooLargeError).bytes).toBe(3100);
    expect((err as WorkspaceTooLargeError).limit).toBe(2048);
    expect(blobs.puts).toBe(0);
    // Under the limit (node_modules does not count).
    await expect(takeSnapshot(opts(root, { maxBytes: 3100 }), blobs)).resolves.toBeTruthy();
    // scanWorkspace does not refuse: a single oversize file is recorded by size only.
    const scan = await scanWorkspace(opts(root, { maxBytes: 2048 }));
    expect(scan.entries.find((e) => e.path === 'data/blob.bin')).toMatchObject({ oversize: true, size: 3000 });
    expect(scan.entries.find((e) => e.path === 'data/blob.bin')!.hash).toBeUndefined();
  });

  it('prints the limit in MB for realistic sizes', () => {
    const e = new WorkspaceTooLargeError('/w', 312 * 1024 * 1024, 200 * 1024 * 1024, 4000, [{ path: 'data/', bytes: 300 * 1024 * 1024 }]);
    expect(e.message).toBe(
      'workspace /w has 312 MB in 4000 files to snapshot, over the 200 MB limit (largest: data/ 300 MB); ' +
        'leave parts out with --exclude GLOB, raise the limit with --max-workspace-mb N, or skip the snapshot with --no-workspace',
    );
  });
});

describe('redaction and storage', () => {
  it('redacts a .env key: the store never sees the key, redactedFiles names the file', async () => {
    const key = 'sk-proj-' + randomAlnum(40);
    const root = tempDir();
    build(root, {
      '.env': `OPENAI_API_KEY=${key}\nDEBUG=1\n`,
      'config/settings.json': JSON.stringify({ openai: { apiKey: key }, model: 'gpt-4o' }),
      'clean.txt': 'nothing here\n',
    });
    const blobs = new TestBlobs();
    const snap = await takeSnapshot(opts(root), blobs);
    expect(snap.redactedFiles).toEqual(['.env', 'config/settings.json']);
    const env = snap.entries.find((e) => e.path === '.env')!;
    expect(env.redacted).toEqual(['openai-key']);
    const needle = Buffer.from(key);
    const fragment = Buffer.from(key.slice(8, 30));
    for (const stored of blobs.map.values()) {
      expect(stored.includes(needle)).toBe(false);
      expect(stored.includes(fragment)).toBe(false);
    }
    const storedEnv = blobs.map.get(env.hash!)!.toString();
    expect(storedEnv).toBe('OPENAI_API_KEY=[REDACTED:openai-key]\nDEBUG=1\n');
    expect(env.size).toBe(Buffer.byteLength(storedEnv));

    // Rescanning the unchanged workspace gives the same hashes: no spurious change.
    const after = await scanWorkspace(opts(root));
    expect(await diffSnapshots(snap, after, blobs)).toEqual([]);
    // Restoring writes the redacted content.
    const target = join(tempDir('restore'), 't');
    await restoreSnapshot(snap, blobs, target);
    expect(readFileSync(join(target, '.env'), 'utf8')).toBe(storedEnv);
  });

  it('stores identical contents once, and nothing new for an unchanged workspace', async () => {
    const root = tempDir();
    build(root, { 'a.txt': 'same content\n', 'b/c.txt': 'same content\n', 'd.txt': 'other\n' });
    const blobs = new TestBlobs();
    const snap = await takeSnapshot(opts(root), blobs);
    expect(blobs.newPuts).toBe(2);
    expect(blobs.puts).toBe(2); // one put per distinct content within a snapshot
    const [a, c] = ['a.txt', 'b/c.txt'].map((p) => snap.entries.find((e) => e.path === p)!.hash);
    expect(a).toBe(c);
    await takeSnapshot(opts(root), blobs);
    expect(blobs.newPuts).toBe(2);
  });

  it('snapshots a few thousand small files quickly', async () => {
    const root = tempDir('perf');
    for (let d = 0; d < 50; d++) {
      mkdirSync(join(root, `dir${d}`));
      for (let f = 0; f < 60; f++) writeFileSync(join(root, `dir${d}`, `file${f}.ts`), `export const v${d}_${f} = ${d * f};\n`.repeat(10));
    }
    const blobs = new MapBlobs();
    const t0 = performance.now();
    const snap = await takeSnapshot(opts(root), blobs);
    const ms = performance.now() - t0;
    expect(snap.entries.length).toBe(3000);
    expect(ms).toBeLessThan(3000); // typically a few hundred ms; loose for loaded CI machines
    const t1 = performance.now();
    const scan = await scanWorkspace(opts(root));
    expect(scan.entries.length).toBe(3000);
    expect(performance.now() - t1).toBeLessThan(3000);
  });
});

describe('diffSnapshots / compareDiffs', () => {
  async function recordRun(mutate: (root: string) => void, spec: Spec) {
    const root = tempDir();
    build(root, spec);
    const blobs = new TestBlobs();
    const before = await takeSnapshot(opts(root), blobs);
    mutate(root);
    const after = await scanWorkspace(opts(root), blobs);
    return { root, blobs, before, after, diff: await diffSnapshots(before, after, blobs) };
  }

  const initial: Spec = {
    'keep.txt': 'unchanged\n',
    'edit.txt': 'one\ntwo\nthree\n',
    'gone.txt': 'bye\n',
    'img.bin': Buffer.from([0, 1, 2]),
    'script.sh': 'echo\n',
    'link': { link: 'keep.txt' },
  };
  const agent = (root: string) => {
    writeFileSync(join(root, 'edit.txt'), 'one\n2\nthree\n');
    rmSync(join(root, 'gone.txt'));
    writeFileSync(join(root, 'new.txt'), 'fresh\n');
    writeFileSync(join(root, 'img.bin'), Buffer.from([0, 1, 3]));
    chmodSync(join(root, 'script.sh'), 0o755);
    rmSync(join(root, 'link'));
    symlinkSync('edit.txt', join(root, 'link'));
  };

  it('reports added, removed and modified files with texts', async () => {
    const { diff } = await recordRun(agent, initial);
    expect(diff.map((c) => [c.path, c.change])).toEqual([
      ['edit.txt', 'modified'],
      ['gone.txt', 'removed'],
      ['img.bin', 'modified'],
      ['link', 'modified'],
      ['new.txt', 'added'],
      ['script.sh', 'modified'],
    ]);
    const by = new Map(diff.map((c) => [c.path, c]));
    expect(by.get('edit.txt')).toMatchObject({ beforeText: 'one\ntwo\nthree\n', afterText: 'one\n2\nthree\n' });
    expect(by.get('gone.txt')).toMatchObject({ beforeText: 'bye\n' });
    expect(by.get('gone.txt')!.after).toBeUndefined();
    expect(by.get('new.txt')).toMatchObject({ afterText: 'fresh\n', after: { kind: 'file', size: 6 } });
    expect(by.get('img.bin')!.beforeText).toBeUndefined(); // binary: hash and size only
    expect(by.get('img.bin')!.after!.binary).toBe(true);
    expect(by.get('link')).toMatchObject({ before: { kind: 'symlink', target: 'keep.txt' }, after: { kind: 'symlink', target: 'edit.txt' } });
    expect(by.get('script.sh')!.after!.mode & 0o111).not.toBe(0);
  });

  it('keeps only hash and size for text files over textLimit', async () => {
    const root = tempDir();
    build(root, { 'big.txt': 'x'.repeat(100) });
    const blobs = new TestBlobs();
    const before = await takeSnapshot(opts(root, { textLimit: 50 }), blobs);
    writeFileSync(join(root, 'big.txt'), 'y'.repeat(100));
    const after = await scanWorkspace(opts(root, { textLimit: 50 }), blobs);
    const [c] = await diffSnapshots(before, after, blobs);
    expect(c).toMatchObject({ path: 'big.txt', change: 'modified', before: { size: 100 }, after: { size: 100 } });
    expect(c!.beforeText).toBeUndefined();
    expect(c!.afterText).toBeUndefined();
    // Without a store: no texts at all, same changes.
    const [plain] = await diffSnapshots(before, await scanWorkspace(opts(root)));
    expect(plain).toMatchObject({ path: 'big.txt', change: 'modified' });
  });

  it('compareDiffs: the same outcome is the same; a different one gets a unified diff', async () => {
    const recorded = await recordRun(agent, initial);
    const replayedSame = await recordRun(agent, initial);
    expect(compareDiffs(recorded.diff, replayedSame.diff)).toEqual({ same: true, differences: [] });

    const replayedOther = await recordRun((root) => {
      agent(root);
      writeFileSync(join(root, 'edit.txt'), 'one\nTWO\nthree\n');
      writeFileSync(join(root, 'gone.txt'), 'bye\n'); // not removed this time
      writeFileSync(join(root, 'extra.txt'), 'extra\n');
    }, initial);
    const cmp = compareDiffs(recorded.diff, replayedOther.diff);
    expect(cmp.same).toBe(false);
    expect(cmp.differences.map((d) => d.path)).toEqual(['edit.txt', 'extra.txt', 'gone.txt']);
    const by = new Map(cmp.differences.map((d) => [d.path, d]));
    expect(by.get('edit.txt')!.unifiedDiff).toBe(
      ['--- recorded/edit.txt', '+++ replayed/edit.txt', '@@ -1,3 +1,3 @@', ' one', '-2', '+TWO', ' three', ''].join('\n'),
    );
    expect(by.get('extra.txt')).toMatchObject({ recorded: null, replayed: { change: 'added' } });
    expect(by.get('extra.txt')!.unifiedDiff).toBeUndefined(); // no initial text: the file did not exist
    expect(by.get('gone.txt')).toMatchObject({ recorded: { change: 'removed' }, replayed: null });
    expect(by.get('gone.txt')!.unifiedDiff).toBe(['--- recorded/gone.txt', '+++ replayed/gone.txt', '@@ -0,0 +1 @@', '+bye', ''].join('\n'));
  });
});

describe('replay sandbox', () => {
  it('scans a restored copy with the recorded git rules, so ignored output is no difference', async () => {
    const repo = gitRepo(
      { 'ws/src/main.ts': 'main\n', 'ws/.gitignore': 'build/\n*.log\n', 'ws/sub/.gitignore': 'cache/\n', 'ws/sub/s.txt': 's\n' },
      '*.tmp\n',
    );
    writeFileSync(join(repo, '.git/info/exclude'), 'private/\n');
    build(repo, { 'ws/forced.log': 'tracked\n', 'ws/node_modules/dep/index.js': 'dep\n' });
    git(repo, 'add', '-f', 'ws/forced.log');
    const root = join(repo, 'ws');
    const blobs = new TestBlobs();
    const before = await takeSnapshot(opts(root), blobs);
    expect(paths(before)).toEqual(['.gitignore', 'forced.log', 'src/main.ts', 'sub/.gitignore', 'sub/s.txt']);
    expect(before.gitRules).toMatchObject({ prefix: 'ws/', ancestors: [{ path: '.gitignore', content: '*.tmp\n' }] });
    expect(before.gitRules!.exclude).toContain('private/');

    const agentRun = (dir: string) =>
      build(dir, {
        'build/out.js': 'o',
        'run.log': 'l',
        'a.tmp': 't',
        'private/p.txt': 'p',
        'sub/cache/c': 'c',
        'sub/new.txt': 'n\n',
        'forced.log': 'tracked, changed\n',
        'src/main.ts': 'main v2\n',
        'out/empty/': null,
      });
    agentRun(root);
    const recordedDiff = await diffSnapshots(before, await scanWorkspace(opts(root), blobs), blobs);
    expect(recordedDiff.map((c) => [c.path, c.change])).toEqual([
      ['forced.log', 'modified'],
      ['src/main.ts', 'modified'],
      ['sub/new.txt', 'added'],
    ]);

    const sandbox = join(tempDir('sandbox'), 's');
    const { linked } = await restoreSnapshot(before, blobs, sandbox, { linkDependenciesFrom: root });
    expect(linked).toEqual(['node_modules']);
    agentRun(sandbox);
    const replayBlobs = new MemoryBlobStore({ fallback: blobs, maxBlobBytes: 64 * 1024 });
    const after = await scanWorkspace(opts(sandbox, { restoredFrom: before }), replayBlobs);
    expect(after.options.gitignore).toBe(true);
    expect(paths(after)).toEqual(['.gitignore', 'forced.log', 'out/empty/', 'src/main.ts', 'sub/.gitignore', 'sub/new.txt', 'sub/s.txt']);
    const replayedDiff = await diffSnapshots(before, after, replayBlobs);
    expect(compareDiffs(recordedDiff, replayedDiff)).toEqual({ same: true, differences: [] });
    expect(replayedDiff.find((c) => c.path === 'src/main.ts')).toMatchObject({ beforeText: 'main\n', afterText: 'main v2\n' });

    // Without the recorded rules the sandbox is walked with none: the ignored output shows up as differences.
    const naive = await diffSnapshots(before, await scanWorkspace(opts(sandbox)));
    expect(compareDiffs(recordedDiff, naive).differences.map((d) => d.path)).toEqual(['a.tmp', 'build/out.js', 'private/p.txt', 'run.log', 'sub/cache/c']);
  });
});

describe('unifiedDiff', () => {
  it('formats hunks like diff -u, with the no-newline marker', () => {
    expect(unifiedDiff('a\n', 'a\n', 'x', 'y')).toBe('');
    const a = Array.from({ length: 20 }, (_, i) => `line ${i + 1}\n`).join('');
    const b = a.replace('line 2\n', 'line two\n').replace('line 18\n', '').concat('tail');
    expect(unifiedDiff(a, b, 'a', 'b')).toBe(
      [
        '--- a',
        '+++ b',
        '@@ -1,5 +1,5 @@',
        ' line 1',
        '-line 2',
        '+line two',
        ' line 3',
        ' line 4',
        ' line 5',
        '@@ -15,6 +15,6 @@',
        ' line 15',
        ' line 16',
        ' line 17',
        '-line 18',
        ' line 19',
        ' line 20',
        '+tail',
        '\\ No newline at end of file',
        '',
      ].join('\n'),
    );
    expect(unifiedDiff('', 'x\n', 'a', 'b')).toBe('--- a\n+++ b\n@@ -0,0 +1 @@\n+x\n');
    expect(unifiedDiff('x', 'x\n', 'a', 'b')).toBe('--- a\n+++ b\n@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+x\n');
  });

  it('produces minimal diffs that patch(1) applies, on random inputs', () => {
    const work = tempDir('diff');
    const gen = (n: number) => Array.from({ length: n }, () => `${'abcde'[randomInt(5)]}\n`).join('') + (randomInt(3) === 0 ? 'end' : '');
    for (let round = 0; round < 60; round++) {
      const a = gen(randomInt(0, 40));
      const b = randomInt(2) === 0 ? gen(randomInt(0, 40)) : a.replace(/c\n/g, () => (randomInt(2) ? 'C\n' : ''));
      writeFileSync(join(work, 'a'), a);
      writeFileSync(join(work, 'b'), b);
      const mine = unifiedDiff(a, b, 'a', 'b');
      if (a === b) {
        expect(mine).toBe('');
        continue;
      }
      writeFileSync(join(work, 'p'), mine);
      execFileSync('patch', ['-s', '-o', join(work, 'out'), join(work, 'a'), join(work, 'p')]);
      expect(readFileSync(join(work, 'out'), 'utf8')).toBe(b);
      // As few changed lines as GNU diff --minimal.
      let gnu = '';
      try {
        execFileSync('diff', ['-u', '-d', join(work, 'a'), join(work, 'b')]);
      } catch (e) {
        gnu = (e as { stdout: Buffer }).stdout.toString();
      }
      const changed = (d: string) => d.split('\n').filter((l) => /^[-+](?![-+]{2} )/.test(l)).length;
      expect(changed(mine)).toBe(changed(gnu));
    }
  });

  it('handles large texts', () => {
    const a = Array.from({ length: 5000 }, (_, i) => `row ${i}\n`).join('');
    const b = Array.from({ length: 5000 }, (_, i) => `row ${i % 7 === 0 ? 'x' : ''}${i}\n`).join('');
    const t0 = performance.now();
    const d = unifiedDiff(a, b, 'a', 'b');
    expect(performance.now() - t0).toBeLessThan(2000);
    expect(d.split('\n').filter((l) => l.startsWith('+row x')).length).toBe(715);
  });
});

describe('Glob', () => {
  it('matches basenames anywhere, anchored paths, ** and directories', () => {
    const g = (p: string) => new Glob(p);
    expect(g('*.log').matches('a/b/c.log')).toBe(true);
    expect(g('*.log').matches('c.log')).toBe(true);
    expect(g('.env').matches('.env')).toBe(true);
    expect(g('data/*.csv').matches('data/x.csv')).toBe(true);
    expect(g('data/*.csv').matches('sub/data/x.csv')).toBe(false);
    expect(g('/build').matches('build')).toBe(true);
    expect(g('/build').matches('src/build')).toBe(false);
    expect(g('./build').matches('src/build')).toBe(false);
    expect(g('build').matches('src/build')).toBe(true);
    expect(g('./build/').matchesSelfOrAncestor('build/a/b')).toBe(true);
    expect(g('src/**/*.ts').matches('src/a.ts')).toBe(true);
    expect(g('src/**/*.ts').matches('src/a/b/c.ts')).toBe(true);
    expect(g('src/**/*.ts').matches('lib/a.ts')).toBe(false);
    expect(g('file?.txt').matches('file1.txt')).toBe(true);
    expect(g('file?.txt').matches('file10.txt')).toBe(false);
    expect(g('a.b').matches('axb')).toBe(false);
    expect(g('build/deep').couldMatchBelow('build')).toBe(true);
    expect(g('build/deep').couldMatchBelow('src')).toBe(false);
    expect(g('*.env').couldMatchBelow('anything')).toBe(true);
    expect(g('node_modules/x/**').namesSegment('node_modules')).toBe(true);
    expect(() => g('')).toThrow(/empty/);
    expect(() => g('../x')).toThrow(/\.\./);
  });
});
