/**
 * Workspace snapshots: what the agent's working directory looked like before a recorded run, what the run
 * changed, and the same after a replay, so the two outcomes can be compared.
 *
 * Which paths are in a snapshot:
 * - In a git work tree (and when the root itself is not git-ignored): what
 *   `git ls-files --cached --others --exclude-standard` lists (nested .gitignore, .git/info/exclude and global
 *   excludes apply; tracked files are in even when they match an ignore rule). Nested repositories and
 *   submodules are listed with their own rules. Elsewhere the tree is walked and nothing is ignored.
 * - Directories named in DEFAULT_EXCLUDED_DIRS are left out at any depth (`.git` also as a file), and so is
 *   everything under `skipDirs` (the mitm-replay home), whatever the globs say.
 * - `exclude` globs leave out more; they win over everything, including `include`.
 * - `include` globs add back paths that .gitignore or the default directories left out (the tree is walked
 *   for them). A default-excluded directory is only entered for a pattern that matches it (`node_modules`)
 *   or names it as a segment (`node_modules/foo/**`); `*.env` alone does not reach into `node_modules`.
 * - Regular files, symlinks (not followed) and empty directories are recorded; sockets, fifos and devices are
 *   skipped. Directory modes are kept for empty directories only.
 * - A replay sandbox (a restored snapshot, without .git) is scanned with `restoredFrom`: the git rules captured
 *   with the snapshot (`gitRules`: info/exclude, global excludes, .gitignore files above the workspace) plus the
 *   .gitignore files in the sandbox decide, through a scratch repository, what the agent's new files count as.
 *
 * File contents go through the traffic Redactor before hashing and storing: the stored bytes (and the hash, a
 * sha256 of them) are those of the redacted content, so a secret never reaches the BlobStore and a rescan of
 * an unchanged file gives the same hash.
 */
import { isUtf8 } from 'node:buffer';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promises as fsp, type Dirent, type Stats } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import path from 'node:path';
import type { Redactor } from '../capture/redact.js';
import { compileGlobs, type Glob } from './glob.js';

export interface BlobStore {
  /** Stores content (a no-op when it is already there) and returns the sha256 hex of it. */
  put(content: Buffer): Promise<string>;
  get(hash: string): Promise<Buffer | undefined>;
}

export interface WorkspaceOptions {
  /** absolute directory */
  root: string;
  /** globs re-adding paths excluded by default or by .gitignore (see glob.ts for the syntax) */
  include?: string[];
  /** globs to leave out in addition; they win over `include` */
  exclude?: string[];
  /** absolute directories never snapshotted (the mitm-replay home when it is inside the workspace) */
  skipDirs?: string[];
  /** default 200 MiB; counted over the regular files that would be snapshotted */
  maxBytes?: number;
  /** default 64 KiB: text files up to this size keep content in diffs; larger or binary ones only hash + size */
  textLimit?: number;
  redactor: Redactor;
  /**
   * `root` is a restored copy of this snapshot (a replay sandbox, which has no .git): decide what is ignored
   * with the git rules the snapshot was taken with (its `gitRules` plus the .gitignore files now in `root`),
   * and treat the snapshot's paths as tracked. Without it, a sandbox would be walked with no ignore rules and
   * every ignored file the agent writes (build output, caches, logs) would show up as a difference.
   * `include`, `exclude` and `textLimit` default to the snapshot's.
   */
  restoredFrom?: Snapshot;
}

export const DEFAULT_EXCLUDED_DIRS: string[] = ['.git', 'node_modules', '.venv', 'venv', 'vendor', '__pycache__'];
/** The default-excluded directories that replay links into its sandbox from the recorded workspace. */
export const DEPENDENCY_DIRS: string[] = ['node_modules', '.venv', 'venv', 'vendor'];
export const DEFAULT_MAX_BYTES = 200 * 1024 * 1024;
export const DEFAULT_TEXT_LIMIT = 64 * 1024;

export class WorkspaceTooLargeError extends Error {
  constructor(
    readonly root: string,
    readonly bytes: number,
    readonly limit: number,
    readonly files: number,
    largest: { path: string; bytes: number }[],
  ) {
    const top = largest.length > 0 ? ` (largest: ${largest.map((l) => `${l.path} ${mb(l.bytes)}`).join(', ')})` : '';
    super(
      `workspace ${root} has ${mb(bytes)} in ${files} files to snapshot, over the ${mb(limit)} limit${top}; ` +
        'leave parts out with --exclude GLOB, raise the limit with --max-workspace-mb N, or skip the snapshot with --no-workspace',
    );
    this.name = 'WorkspaceTooLargeError';
  }
}

function mb(bytes: number): string {
  const v = bytes / (1024 * 1024);
  return `${v >= 10 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1)} MB`;
}

export interface SnapshotEntry {
  /** posix, relative to the root */
  path: string;
  kind: 'file' | 'symlink' | 'dir';
  /** permission bits (mode & 0o777) */
  mode: number;
  /** bytes of the stored (possibly redacted) content; on-disk size for `oversize` files; 0 for dirs */
  size: number;
  /** sha256 hex of the stored, possibly redacted, content (files only) */
  hash?: string;
  /** symlink target, verbatim */
  target?: string;
  /** files: NUL in the first 8 KiB or not valid UTF-8 */
  binary?: boolean;
  /** names of the redaction rules that fired in this file */
  redacted?: string[];
  /** scanWorkspace only: a single file larger than maxBytes; not read, only its size is known */
  oversize?: boolean;
}

export interface Snapshot {
  root: string;
  takenAt: number;
  /** sorted by path */
  entries: SnapshotEntry[];
  /** on-disk bytes of the regular files (what maxBytes is checked against) */
  totalBytes: number;
  redactedFiles: string[];
  /** `gitignore`: whether git's ignore rules decided what is in */
  options: { include: string[]; exclude: string[]; textLimit: number; gitignore: boolean };
  /** With `gitignore`: the rules from outside the snapshot, so a restored copy can be scanned the same way. */
  gitRules?: GitRules;
}

/** Ignore rules that live outside the workspace's own files. */
export interface GitRules {
  /** the workspace's path inside its repository ('' at the top level, else ending in '/') */
  prefix: string;
  /** .git/info/exclude followed by the global excludes file (both relative to the repository top level) */
  exclude: string;
  /** .gitignore files of the directories above the workspace, paths relative to the repository top level */
  ancestors: { path: string; content: string }[];
}

/** State of one path on one side of a change. */
export interface FileState {
  kind: 'file' | 'symlink';
  size: number;
  mode: number;
  hash?: string;
  target?: string;
  binary?: boolean;
}

export interface FileChange {
  path: string;
  change: 'added' | 'removed' | 'modified';
  before?: FileState;
  after?: FileState;
  /** text files <= textLimit whose content the BlobStore given to diffSnapshots has: the (redacted) content */
  beforeText?: string;
  afterText?: string;
}

export interface OutcomeComparison {
  same: boolean;
  differences: { path: string; recorded: FileChange | null; replayed: FileChange | null; unifiedDiff?: string }[];
}

// ---------------------------------------------------------------------------------------------------------
// Snapshot
// ---------------------------------------------------------------------------------------------------------

/**
 * Walks the workspace, refuses it (WorkspaceTooLargeError, before reading or storing any content) when the
 * files add up to more than maxBytes, and stores every file's redacted content in `blobs`.
 */
export async function takeSnapshot(options: WorkspaceOptions, blobs: BlobStore): Promise<Snapshot> {
  return snapshot(options, blobs, true);
}

/**
 * Same filters and hashes as takeSnapshot, for the after-run state. Never refuses: a single file over maxBytes
 * is recorded with `oversize: true` and its size only. With `blobs`, every file's redacted content is stored
 * too (so diffSnapshots can show texts); without, nothing is stored.
 */
export async function scanWorkspace(options: WorkspaceOptions, blobs?: BlobStore): Promise<Snapshot> {
  return snapshot(options, blobs, false);
}

interface Found {
  rel: string;
  st: Stats;
}

async function snapshot(options: WorkspaceOptions, blobs: BlobStore | undefined, refuse: boolean): Promise<Snapshot> {
  const root = path.resolve(options.root);
  const maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
  // A sandbox scan defaults to the filters the snapshot was taken with.
  const from = options.restoredFrom?.options;
  const textLimit = options.textLimit ?? from?.textLimit ?? DEFAULT_TEXT_LIMIT;
  const include = options.include ?? from?.include ?? [];
  const exclude = options.exclude ?? from?.exclude ?? [];
  const rootStat = await fsp.stat(root).catch(() => undefined);
  if (!rootStat?.isDirectory()) throw new Error(`workspace ${root} is not a directory`);

  const collector = new Collector(root, compileGlobs(include), compileGlobs(exclude), options.skipDirs ?? [], options.restoredFrom);
  const { files, symlinks, dirs, gitignore, gitRules } = await collector.collect();

  const totalBytes = files.reduce((sum, f) => sum + f.st.size, 0);
  if (refuse && totalBytes > maxBytes) {
    throw new WorkspaceTooLargeError(root, totalBytes, maxBytes, files.length, largestParts(files));
  }

  const entries: SnapshotEntry[] = [];
  for (const d of dirs) entries.push({ path: d.rel, kind: 'dir', mode: d.st.mode & 0o777, size: 0 });

  const put = new Map<string, Promise<void>>(); // one put per distinct content per snapshot
  const budget = new ByteBudget(64 * 1024 * 1024);
  await forEachLimit(files, 16, async ({ rel, st }) => {
    if (st.size > maxBytes) {
      entries.push({ path: rel, kind: 'file', mode: st.mode & 0o777, size: st.size, oversize: true });
      return;
    }
    const cost = await budget.acquire(st.size);
    let raw: Buffer;
    try {
      raw = await fsp.readFile(path.join(root, rel));
    } catch (err) {
      budget.release(cost);
      if (isGone(err)) return; // deleted while we looked
      throw err;
    }
    try {
      const contentType = rel.toLowerCase().endsWith('.json') ? 'application/json' : 'text/plain';
      const { body, fired } = options.redactor.redactBody(raw, 'request', undefined, contentType);
      const hash = sha256(body);
      const entry: SnapshotEntry = { path: rel, kind: 'file', mode: st.mode & 0o777, size: body.length, hash, binary: isBinary(body) };
      if (fired.length > 0) entry.redacted = [...new Set(fired.map((f) => f.rule))].sort();
      if (blobs) {
        let pending = put.get(hash);
        if (!pending) {
          pending = blobs.put(body).then((got) => {
            if (got !== hash) throw new Error(`blob store returned hash ${got} for content hashing to ${hash}`);
          });
          put.set(hash, pending);
        }
        await pending;
      }
      entries.push(entry);
    } finally {
      budget.release(cost);
    }
  });

  await forEachLimit(symlinks, 32, async ({ rel, st }) => {
    let target: string;
    try {
      target = await fsp.readlink(path.join(root, rel));
    } catch (err) {
      if (isGone(err) || (err as NodeJS.ErrnoException).code === 'EINVAL') return;
      throw err;
    }
    entries.push({ path: rel, kind: 'symlink', mode: st.mode & 0o777, size: Buffer.byteLength(target), target });
  });

  entries.sort((a, b) => compare(a.path, b.path));
  const result: Snapshot = {
    root,
    takenAt: Date.now(),
    entries,
    totalBytes,
    redactedFiles: entries.filter((e) => e.redacted).map((e) => e.path),
    options: { include: [...include], exclude: [...exclude], textLimit, gitignore },
  };
  if (gitRules) result.gitRules = gitRules;
  return result;
}

/** Top-level parts (first path segment) by size, for the too-large message. */
function largestParts(files: Found[]): { path: string; bytes: number }[] {
  const sizes = new Map<string, number>();
  for (const f of files) {
    const slash = f.rel.indexOf('/');
    const key = slash < 0 ? f.rel : `${f.rel.slice(0, slash)}/`;
    sizes.set(key, (sizes.get(key) ?? 0) + f.st.size);
  }
  return [...sizes]
    .map(([p, bytes]) => ({ path: p, bytes }))
    .sort((a, b) => b.bytes - a.bytes)
    .slice(0, 3);
}

/** Finds the paths to snapshot and lstat()s them. */
class Collector {
  private readonly candidates = new Map<string, { forced: boolean; emptyDir: boolean }>();
  private readonly skipDirs: string[];
  private gitWorks = true;

  constructor(
    private readonly root: string,
    private readonly include: Glob[],
    private readonly exclude: Glob[],
    skipDirs: string[],
    private readonly restoredFrom: Snapshot | undefined,
  ) {
    this.skipDirs = skipDirs.map((d) => path.resolve(d));
  }

  async collect(): Promise<{ files: Found[]; symlinks: Found[]; dirs: Found[]; gitignore: boolean; gitRules?: GitRules }> {
    let gitignore = false;
    let gitRules: GitRules | undefined;
    if (this.restoredFrom) {
      const from = this.restoredFrom;
      gitRules = from.options.gitignore ? from.gitRules : undefined;
      gitignore = gitRules !== undefined && (await this.rulesWalk(from, gitRules));
      if (!gitignore) gitRules = undefined;
    } else {
      gitRules = (await this.gitRulesOfRoot()) ?? undefined;
      gitignore = gitRules !== undefined && (await this.gitCollect(''));
      if (!gitignore) gitRules = undefined;
    }
    if (!gitignore) {
      this.candidates.clear();
      await this.walk('', false);
    }
    if (this.include.length > 0) await this.includeWalk('', false);

    const files: Found[] = [];
    const symlinks: Found[] = [];
    const dirs: Found[] = [];
    let pending = [...this.candidates.keys()];
    const seen = new Set<string>();
    while (pending.length > 0) {
      const expand: Found[] = [];
      const batch = pending.filter((rel) => !seen.has(rel));
      for (const rel of batch) seen.add(rel);
      await forEachLimit(batch, 32, async (rel) => {
        const info = this.candidates.get(rel)!;
        let st: Stats;
        try {
          st = await fsp.lstat(path.join(this.root, rel));
        } catch (err) {
          if (isGone(err)) return;
          throw err;
        }
        const name = rel.slice(rel.lastIndexOf('/') + 1);
        if (!info.forced && (name === '.git' || (DEFAULT_EXCLUDED_DIRS.includes(name) && !st.isFile()))) return;
        if (st.isFile()) files.push({ rel, st });
        else if (st.isSymbolicLink()) symlinks.push({ rel, st });
        else if (st.isDirectory()) {
          if (info.emptyDir) dirs.push({ rel, st });
          else expand.push({ rel, st }); // a nested repository, submodule or directory git listed whole
        }
      });
      const before = new Set(this.candidates.keys());
      for (const d of expand) if (await this.walk(d.rel, true)) dirs.push(d);
      pending = [...this.candidates.keys()].filter((k) => !before.has(k));
    }
    const result: { files: Found[]; symlinks: Found[]; dirs: Found[]; gitignore: boolean; gitRules?: GitRules } = { files, symlinks, dirs, gitignore };
    if (gitRules) result.gitRules = gitRules;
    return result;
  }

  private skipped(rel: string): boolean {
    const abs = rel === '' ? this.root : path.join(this.root, rel);
    return this.skipDirs.some((d) => abs === d || abs.startsWith(d.endsWith(path.sep) ? d : d + path.sep));
  }

  private excluded(rel: string): boolean {
    return this.exclude.some((g) => g.matchesSelfOrAncestor(rel));
  }

  /** Adds a path found by git or by the walk; drops it when an ancestor is a default-excluded directory. */
  private add(rel: string, emptyDir = false): void {
    if (this.skipped(rel) || this.excluded(rel)) return;
    const segs = rel.split('/');
    for (let i = 0; i < segs.length - 1; i++) if (DEFAULT_EXCLUDED_DIRS.includes(segs[i]!)) return;
    if (!this.candidates.has(rel)) this.candidates.set(rel, { forced: false, emptyDir });
  }

  private addForced(rel: string, emptyDir = false): void {
    this.candidates.set(rel, { forced: true, emptyDir });
  }

  /**
   * When the root is in a git work tree (and not itself ignored, where git would list nothing), the rules that
   * live outside it: info/exclude, the global excludes file, .gitignore files of the directories above it.
   */
  private async gitRulesOfRoot(): Promise<GitRules | null> {
    const info = await runGit(this.root, ['rev-parse', '--is-inside-work-tree', '--show-prefix', '--show-cdup', '--git-path', 'info/exclude']);
    if (info === null) {
      this.gitWorks = false;
      return null;
    }
    const lines = info.stdout.toString('utf8').split('\n');
    if (info.code !== 0 || lines[0] !== 'true' || lines.length < 4) return null;
    const ignored = await runGit(this.root, ['check-ignore', '-q', '.']);
    if (ignored !== null && ignored.code === 0) return null;
    const prefix = lines[1]!;
    const top = path.resolve(this.root, lines[2]!);
    const exclude = [await readText(path.resolve(this.root, lines[3]!))];
    const configured = await runGit(this.root, ['config', '--path', '--get', 'core.excludesFile']);
    const globalFile =
      configured && configured.code === 0 && configured.stdout.toString().trim() !== ''
        ? configured.stdout.toString().trim()
        : path.join(process.env.XDG_CONFIG_HOME || path.join(homedir(), '.config'), 'git', 'ignore');
    exclude.push(await readText(globalFile));
    const ancestors: GitRules['ancestors'] = [];
    const segs = prefix.split('/').filter((x) => x !== '');
    for (let i = 0; i < segs.length; i++) {
      const rel = [...segs.slice(0, i), '.gitignore'].join('/');
      const content = await readText(path.join(top, rel));
      if (content !== '') ancestors.push({ path: rel, content });
    }
    return { prefix, exclude: exclude.filter((x) => x !== '').join('\n'), ancestors };
  }

  /**
   * Walks a restored copy, asking a scratch repository laid out like the original (the captured rules, plus
   * each .gitignore found here copied to the same place) which paths git would ignore. Ignored directories are
   * not entered unless they hold paths of the snapshot, which count as tracked. False when git cannot help.
   */
  private async rulesWalk(from: Snapshot, rules: GitRules): Promise<boolean> {
    if (!this.gitWorks || !(rules.prefix === '' || safeRelative(rules.prefix.replace(/\/$/, '')))) return false;
    const scratch = await fsp.mkdtemp(path.join(tmpdir(), 'mitm-replay-gitrules-'));
    try {
      const init = await runGit(scratch, ['init', '-q', '.']);
      if (init === null || init.code !== 0) return false;
      await fsp.mkdir(path.join(scratch, '.git', 'info'), { recursive: true });
      await fsp.writeFile(path.join(scratch, '.git', 'info', 'exclude'), `${rules.exclude}\n`);
      const place = async (rel: string, content: string | Buffer) => {
        const abs = path.join(scratch, rel);
        await fsp.mkdir(path.dirname(abs), { recursive: true });
        await fsp.writeFile(abs, content);
      };
      for (const a of rules.ancestors) if (safeRelative(a.path) && a.path.endsWith('.gitignore')) await place(a.path, a.content);
      // The recording machine's global excludes are in info/exclude; this machine's must not apply.
      const git = ['-c', `core.excludesFile=${path.join(scratch, 'no-global-excludes')}`, 'check-ignore', '-z', '--stdin'];

      const tracked = new Set(from.entries.map((e) => e.path));
      const trackedDirs = new Set<string>();
      for (const p of tracked) for (let i = p.indexOf('/'); i >= 0; i = p.indexOf('/', i + 1)) trackedDirs.add(p.slice(0, i));
      for (const e of from.entries) if (e.kind !== 'dir') this.add(e.path);

      let level: { rel: string; ignored: boolean }[] = [{ rel: '', ignored: false }];
      while (level.length > 0) {
        const found: { rel: string; dir: boolean }[] = [];
        for (const d of level) {
          const entries = await readDir(d.rel === '' ? this.root : path.join(this.root, d.rel));
          if (entries === null) continue;
          if (entries.length === 0 && d.rel !== '' && !d.ignored) this.add(d.rel, true);
          for (const e of entries) {
            if (e.name === '.git') continue;
            const rel = d.rel === '' ? e.name : `${d.rel}/${e.name}`;
            if (this.skipped(rel) || this.excluded(rel)) continue;
            if (e.isDirectory()) {
              if (!DEFAULT_EXCLUDED_DIRS.includes(e.name)) found.push({ rel, dir: true });
            } else if (e.isFile() || e.isSymbolicLink()) {
              found.push({ rel, dir: false });
              if (e.name === '.gitignore' && e.isFile()) await place(rules.prefix + rel, await fsp.readFile(path.join(this.root, rel)));
            }
          }
        }
        const ask = found.filter((f) => !tracked.has(f.rel));
        let ignored = new Set<string>();
        if (ask.length > 0) {
          const input = Buffer.from(ask.map((f) => `${rules.prefix}${f.rel}${f.dir ? '/' : ''}\0`).join(''));
          const out = await runGit(scratch, git, input);
          if (out === null || (out.code !== 0 && out.code !== 1)) return false;
          ignored = new Set(splitZ(out.stdout).map((p) => p.slice(rules.prefix.length).replace(/\/+$/, '')));
        }
        const next: { rel: string; ignored: boolean }[] = [];
        for (const f of found) {
          const isIgnored = ignored.has(f.rel);
          if (f.dir) {
            if (!isIgnored || trackedDirs.has(f.rel)) next.push({ rel: f.rel, ignored: isIgnored });
          } else if (!isIgnored) this.add(f.rel);
        }
        level = next;
      }
      return true;
    } finally {
      await fsp.rm(scratch, { recursive: true, force: true });
    }
  }

  /** Lists a git work tree at `relDir` with git's ignore rules. False when git cannot list it. */
  private async gitCollect(relDir: string): Promise<boolean> {
    if (!this.gitWorks) return false;
    const cwd = relDir === '' ? this.root : path.join(this.root, relDir);
    const listed = await runGit(cwd, ['ls-files', '-z', '--cached', '--others', '--exclude-standard']);
    if (listed === null || listed.code !== 0) return false;
    const join = (p: string) => (relDir === '' ? p : `${relDir}/${p}`);
    for (const p of splitZ(listed.stdout)) this.add(join(p.replace(/\/+$/, '')));

    // Git lists no directories, so look for empty ones in what it reports as untracked directories.
    const others = await runGit(cwd, ['ls-files', '-z', '--others', '--exclude-standard', '--directory']);
    if (others === null || others.code !== 0) return true;
    const empty: string[] = [];
    for (const p of splitZ(others.stdout)) {
      if (p.endsWith('/')) await this.findEmptyDirs(p.replace(/\/+$/, ''), cwd, empty);
    }
    if (empty.length > 0) {
      const check = await runGit(cwd, ['check-ignore', '-z', '--stdin'], Buffer.from(empty.map((e) => `${e}/\0`).join('')));
      const ignored = new Set(check && check.code === 0 ? splitZ(check.stdout).map((p) => p.replace(/\/+$/, '')) : []);
      for (const e of empty) if (!ignored.has(e)) this.add(join(e), true);
    }
    return true;
  }

  /** Empty directories at or below `rel` (relative to `cwd`, a repository), not entering nested repositories. */
  private async findEmptyDirs(rel: string, cwd: string, out: string[]): Promise<void> {
    const abs = path.join(cwd, rel);
    const relRoot = path.relative(this.root, abs).split(path.sep).join('/');
    if (this.skipped(relRoot) || this.excluded(relRoot)) return;
    const name = rel.slice(rel.lastIndexOf('/') + 1);
    if (DEFAULT_EXCLUDED_DIRS.includes(name)) return;
    const entries = await readDir(abs);
    if (entries === null) return;
    if (entries.length === 0) {
      out.push(rel);
      return;
    }
    if (entries.some((e) => e.name === '.git')) return;
    for (const e of entries) if (e.isDirectory()) await this.findEmptyDirs(`${rel}/${e.name}`, cwd, out);
  }

  /**
   * Plain walk (no ignore rules) of `relDir`; a nested repository found on the way is listed with git.
   * True when the directory is empty (the caller records it).
   */
  private async walk(relDir: string, tryGit: boolean): Promise<boolean> {
    const entries = await readDir(relDir === '' ? this.root : path.join(this.root, relDir));
    if (entries === null) return false;
    if (entries.length === 0) return true;
    if (tryGit && relDir !== '' && entries.some((e) => e.name === '.git') && (await this.gitCollect(relDir))) return false;
    const join = (p: string) => (relDir === '' ? p : `${relDir}/${p}`);
    for (const e of entries) {
      if (e.name === '.git') continue;
      const rel = join(e.name);
      if (this.skipped(rel) || this.excluded(rel)) continue;
      if (e.isDirectory()) {
        if (!DEFAULT_EXCLUDED_DIRS.includes(e.name) && (await this.walk(rel, true))) this.add(rel, true);
      } else if (e.isFile() || e.isSymbolicLink()) {
        this.add(rel);
      }
    }
    return false;
  }

  /** Walks where include globs can match; `forced` when a glob matched this directory or an ancestor. */
  private async includeWalk(relDir: string, forced: boolean): Promise<void> {
    const entries = await readDir(relDir === '' ? this.root : path.join(this.root, relDir));
    if (entries === null) return;
    if (relDir !== '' && forced && entries.length === 0) {
      this.addForced(relDir, true);
      return;
    }
    const join = (p: string) => (relDir === '' ? p : `${relDir}/${p}`);
    for (const e of entries) {
      const rel = join(e.name);
      if (this.skipped(rel) || this.excluded(rel)) continue;
      const direct = this.include.some((g) => g.matches(rel));
      // Default-excluded names need a glob that matches them or spells them out, even inside a matched dir.
      const guarded = e.name === '.git' || (DEFAULT_EXCLUDED_DIRS.includes(e.name) && !e.isFile());
      if (e.isDirectory()) {
        if (direct || (forced && !guarded)) await this.includeWalk(rel, true);
        else if (this.include.some((g) => g.couldMatchBelow(rel) && (!guarded || g.namesSegment(e.name)))) {
          await this.includeWalk(rel, false);
        }
      } else if ((e.isFile() || e.isSymbolicLink()) && (direct || (forced && !guarded))) {
        this.addForced(rel);
      }
    }
  }
}

async function readDir(abs: string): Promise<Dirent[] | null> {
  try {
    return await fsp.readdir(abs, { withFileTypes: true });
  } catch (err) {
    if (isGone(err) || (err as NodeJS.ErrnoException).code === 'ENOTDIR') return null;
    throw err;
  }
}

async function readText(file: string): Promise<string> {
  try {
    return await fsp.readFile(file, 'utf8');
  } catch {
    return '';
  }
}

function splitZ(out: Buffer): string[] {
  return out
    .toString('utf8')
    .split('\0')
    .filter((s) => s !== '');
}

/** Variables that would point git somewhere other than the workspace. */
const GIT_REDIRECTS = ['GIT_DIR', 'GIT_WORK_TREE', 'GIT_INDEX_FILE', 'GIT_OBJECT_DIRECTORY', 'GIT_COMMON_DIR', 'GIT_NAMESPACE', 'GIT_PREFIX'];

/** Runs git; null when git cannot be started. */
function runGit(cwd: string, args: string[], input?: Buffer): Promise<{ code: number | null; stdout: Buffer } | null> {
  const env: NodeJS.ProcessEnv = { ...process.env, GIT_OPTIONAL_LOCKS: '0' };
  for (const k of GIT_REDIRECTS) delete env[k];
  return new Promise((resolve) => {
    let child;
    try {
      // fsmonitor would run a configured program from the workspace's git config.
      child = spawn('git', ['-c', 'core.fsmonitor=false', '-C', cwd, ...args], {
        env,
        stdio: [input ? 'pipe' : 'ignore', 'pipe', 'ignore'],
      });
    } catch {
      resolve(null);
      return;
    }
    const chunks: Buffer[] = [];
    child.stdout!.on('data', (c: Buffer) => chunks.push(c));
    child.on('error', () => resolve(null));
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(chunks) }));
    if (input) {
      child.stdin!.on('error', () => {}); // git may exit before reading everything
      child.stdin!.end(input);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// Diff and comparison
// ---------------------------------------------------------------------------------------------------------

function stateOf(e: SnapshotEntry): FileState {
  const s: FileState = { kind: e.kind === 'symlink' ? 'symlink' : 'file', size: e.size, mode: e.mode };
  if (e.hash !== undefined) s.hash = e.hash;
  if (e.target !== undefined) s.target = e.target;
  if (e.binary !== undefined) s.binary = e.binary;
  return s;
}

/** Same content: kind, hash (size when unhashed), symlink target and executable bits (like git, not the rest of the mode). */
function sameState(a: FileState, b: FileState): boolean {
  if (a.kind !== b.kind || (a.mode & 0o111) !== (b.mode & 0o111)) return false;
  if (a.kind === 'symlink') return a.target === b.target;
  if (a.hash === undefined || b.hash === undefined) return a.hash === b.hash && a.size === b.size;
  return a.hash === b.hash;
}

/**
 * Files and symlinks added, removed or modified from `before` to `after` (empty directories are not reported),
 * sorted by path. Async because texts come from `blobs`: with a store, `beforeText` / `afterText` are filled in
 * for text files up to the snapshot's textLimit whose content the store has (the redacted content).
 */
export async function diffSnapshots(before: Snapshot, after: Snapshot, blobs?: BlobStore): Promise<FileChange[]> {
  const textLimit = before.options.textLimit ?? DEFAULT_TEXT_LIMIT;
  const index = (s: Snapshot) => new Map(s.entries.filter((e) => e.kind !== 'dir').map((e) => [e.path, e]));
  const a = index(before);
  const b = index(after);
  const changes: { change: FileChange; from?: SnapshotEntry; to?: SnapshotEntry }[] = [];
  for (const [p, from] of a) {
    const to = b.get(p);
    if (!to) changes.push({ change: { path: p, change: 'removed', before: stateOf(from) }, from });
    else if (!sameState(stateOf(from), stateOf(to))) {
      changes.push({ change: { path: p, change: 'modified', before: stateOf(from), after: stateOf(to) }, from, to });
    }
  }
  for (const [p, to] of b) if (!a.has(p)) changes.push({ change: { path: p, change: 'added', after: stateOf(to) }, to });
  changes.sort((x, y) => compare(x.change.path, y.change.path));

  if (blobs) {
    const text = async (e: SnapshotEntry | undefined): Promise<string | undefined> => {
      if (!e || e.kind !== 'file' || e.binary !== false || e.hash === undefined || e.size > textLimit) return undefined;
      return (await blobs.get(e.hash))?.toString('utf8');
    };
    await forEachLimit(changes, 16, async ({ change, from, to }) => {
      const bt = await text(from);
      const at = await text(to);
      if (bt !== undefined) change.beforeText = bt;
      if (at !== undefined) change.afterText = at;
    });
  }
  return changes.map((c) => c.change);
}

/**
 * Recorded vs replayed changes (both against the same initial snapshot). Same when the same paths changed the
 * same way to the same content (hash, symlink target, executable bits). For each difference, `unifiedDiff`
 * goes from the recorded result to the replayed result of a text file when both texts are known (an unchanged
 * side's result is the initial text; a removed file's is empty).
 */
export function compareDiffs(recorded: FileChange[], replayed: FileChange[]): OutcomeComparison {
  const r = new Map(recorded.map((c) => [c.path, c]));
  const p = new Map(replayed.map((c) => [c.path, c]));
  const paths = [...new Set([...r.keys(), ...p.keys()])].sort(compare);
  const differences: OutcomeComparison['differences'] = [];
  for (const path of paths) {
    const rc = r.get(path) ?? null;
    const pc = p.get(path) ?? null;
    if (rc && pc && rc.change === pc.change && sameResult(rc, pc)) continue;
    const diff: OutcomeComparison['differences'][number] = { path, recorded: rc, replayed: pc };
    const initial = rc?.beforeText ?? pc?.beforeText;
    const resultText = (c: FileChange | null): string | undefined =>
      c === null ? initial : c.change === 'removed' ? '' : c.afterText;
    const rt = resultText(rc);
    const pt = resultText(pc);
    if (rt !== undefined && pt !== undefined && rt !== pt) diff.unifiedDiff = unifiedDiff(rt, pt, `recorded/${path}`, `replayed/${path}`);
    differences.push(diff);
  }
  return { same: differences.length === 0, differences };
}

function sameResult(a: FileChange, b: FileChange): boolean {
  if (a.change === 'removed') return true;
  return a.after !== undefined && b.after !== undefined && sameState(a.after, b.after);
}

// ---------------------------------------------------------------------------------------------------------
// Restore
// ---------------------------------------------------------------------------------------------------------

/** A relative posix path with no empty, `.` or `..` segment. */
function safeRelative(p: string): boolean {
  if (p === '' || p.startsWith('/') || p.includes('\0') || /^[A-Za-z]:/.test(p)) return false;
  return p.split('/').every((s) => s !== '' && s !== '.' && s !== '..');
}

/**
 * Recreates the snapshot in `target`, which must not exist or be an empty directory: files (content, mode),
 * symlinks, empty directories. Refuses entries whose path would leave `target` (absolute, `..`, or below a
 * symlink or file of the snapshot). Then, with `linkDependenciesFrom` (the recorded root), each DEPENDENCY_DIRS
 * directory that exists there and is not in the snapshot is symlinked into `target`, at the top level and in
 * every directory of the snapshot; `linked` lists them (relative paths, sorted).
 */
export async function restoreSnapshot(
  snapshot: Snapshot,
  blobs: BlobStore,
  target: string,
  options?: { linkDependenciesFrom?: string | null },
): Promise<{ linked: string[] }> {
  const dest = path.resolve(target);
  const byPath = new Map<string, SnapshotEntry>();
  for (const e of snapshot.entries) {
    if (typeof e.path !== 'string' || !safeRelative(e.path)) {
      throw new Error(`refusing to restore ${JSON.stringify(e.path)}: the path escapes the target directory`);
    }
    if (byPath.has(e.path)) throw new Error(`refusing to restore: ${JSON.stringify(e.path)} appears twice in the snapshot`);
    byPath.set(e.path, e);
  }
  // Directories implied by the entries; none of them may be a symlink or a file of the snapshot.
  const dirs = new Set<string>();
  for (const e of snapshot.entries) {
    const segs = e.path.split('/');
    for (let i = 1; i < segs.length; i++) {
      const parent = segs.slice(0, i).join('/');
      const pe = byPath.get(parent);
      if (pe && pe.kind !== 'dir') {
        throw new Error(`refusing to restore ${JSON.stringify(e.path)}: its parent ${JSON.stringify(parent)} is a ${pe.kind} in the snapshot`);
      }
      dirs.add(parent);
    }
    if (e.kind === 'dir') dirs.add(e.path);
  }

  await fsp.mkdir(dest, { recursive: true });
  if ((await fsp.readdir(dest)).length > 0) throw new Error(`refusing to restore into ${dest}: the directory is not empty`);

  for (const d of [...dirs].sort(compare)) await fsp.mkdir(path.join(dest, d), { recursive: true });

  const files = snapshot.entries.filter((e) => e.kind === 'file');
  await forEachLimit(files, 16, async (e) => {
    if (e.hash === undefined) throw new Error(`cannot restore ${e.path}: the snapshot has no content for it`);
    const data = await blobs.get(e.hash);
    if (!data) throw new Error(`cannot restore ${e.path}: blob ${e.hash} is missing from the store`);
    const abs = path.join(dest, e.path);
    await fsp.writeFile(abs, data, { flag: 'wx', mode: 0o600 }); // wx: never follow anything already there
    await fsp.chmod(abs, e.mode & 0o777);
  });
  for (const e of snapshot.entries) {
    if (e.kind === 'symlink') await fsp.symlink(e.target ?? '', path.join(dest, e.path));
  }
  // Deepest first, so a read-only directory is set after everything inside it exists.
  for (const e of snapshot.entries.filter((x) => x.kind === 'dir').sort((x, y) => compare(y.path, x.path))) {
    await fsp.chmod(path.join(dest, e.path), e.mode & 0o777);
  }

  const linked: string[] = [];
  const from = options?.linkDependenciesFrom;
  if (from) {
    const source = path.resolve(from);
    const occupied = (rel: string) => byPath.has(rel) || dirs.has(rel);
    for (const dir of ['', ...[...dirs].sort(compare)]) {
      for (const name of DEPENDENCY_DIRS) {
        const rel = dir === '' ? name : `${dir}/${name}`;
        if (occupied(rel)) continue;
        const src = path.join(source, rel);
        const st = await fsp.stat(src).catch(() => undefined);
        if (!st?.isDirectory()) continue;
        const at = path.join(dest, rel);
        if (await fsp.lstat(at).then(() => true, () => false)) continue;
        await fsp.symlink(src, at, 'dir');
        linked.push(rel);
      }
    }
  }
  return { linked: linked.sort(compare) };
}

// ---------------------------------------------------------------------------------------------------------
// Unified diff
// ---------------------------------------------------------------------------------------------------------

type Op = { op: ' ' | '-' | '+'; line: string };

/**
 * Unified diff of two texts with 3 lines of context ('' when they are equal). Lines are compared with their
 * terminators, and a last line without a newline gets the usual `\ No newline at end of file` marker.
 * Linear-space Myers (middle snake), so fine for texts of many thousands of lines.
 */
export function unifiedDiff(a: string, b: string, labelA: string, labelB: string): string {
  if (a === b) return '';
  const la = splitLines(a);
  const lb = splitLines(b);
  // Lines as integers: comparisons in the inner loop are then cheap.
  const ids = new Map<string, number>();
  const id = (l: string) => {
    let v = ids.get(l);
    if (v === undefined) ids.set(l, (v = ids.size));
    return v;
  };
  const ia = Int32Array.from(la, id);
  const ib = Int32Array.from(lb, id);
  const ops: Op[] = [];
  diffRange(ia, 0, ia.length, ib, 0, ib.length, (op, i) => ops.push({ op, line: op === '+' ? lb[i]! : la[i]! }));

  const CONTEXT = 3;
  const out: string[] = [`--- ${labelA}\n`, `+++ ${labelB}\n`];
  // Positions (0-based) in a and b at each op.
  const posA: number[] = [];
  const posB: number[] = [];
  let x = 0;
  let y = 0;
  for (const o of ops) {
    posA.push(x);
    posB.push(y);
    if (o.op !== '+') x++;
    if (o.op !== '-') y++;
  }
  let i = 0;
  while (i < ops.length) {
    if (ops[i]!.op === ' ') {
      i++;
      continue;
    }
    // A hunk: from CONTEXT lines before the first change to CONTEXT lines after the last change that is no
    // more than 2*CONTEXT equal lines away from the next.
    const start = Math.max(0, i - CONTEXT);
    let end = i;
    for (;;) {
      while (end < ops.length && ops[end]!.op !== ' ') end++;
      let run = 0;
      while (end + run < ops.length && ops[end + run]!.op === ' ') run++;
      if (end + run < ops.length && run <= 2 * CONTEXT) {
        end += run;
        continue;
      }
      end = Math.min(ops.length, end + Math.min(run, CONTEXT));
      break;
    }
    let countA = 0;
    let countB = 0;
    for (let k = start; k < end; k++) {
      if (ops[k]!.op !== '+') countA++;
      if (ops[k]!.op !== '-') countB++;
    }
    out.push(`@@ -${range(posA[start]!, countA)} +${range(posB[start]!, countB)} @@\n`);
    for (let k = start; k < end; k++) {
      const { op, line } = ops[k]!;
      if (line.endsWith('\n')) out.push(op + line);
      else out.push(`${op}${line}\n\\ No newline at end of file\n`);
    }
    i = end;
  }
  return out.join('');
}

function range(start0: number, count: number): string {
  if (count === 0) return `${start0},0`;
  if (count === 1) return `${start0 + 1}`;
  return `${start0 + 1},${count}`;
}

function splitLines(text: string): string[] {
  if (text === '') return [];
  const lines = text.split(/(?<=\n)/);
  return lines;
}

/** Emits the ops turning a[aLo, aHi) into b[bLo, bHi), in order. */
function diffRange(
  a: Int32Array,
  aLo: number,
  aHi: number,
  b: Int32Array,
  bLo: number,
  bHi: number,
  emit: (op: ' ' | '-' | '+', index: number) => void,
): void {
  // Common prefix and suffix.
  while (aLo < aHi && bLo < bHi && a[aLo] === b[bLo]) emit(' ', aLo++), bLo++;
  let suffix = 0;
  while (aHi - suffix > aLo && bHi - suffix > bLo && a[aHi - suffix - 1] === b[bHi - suffix - 1]) suffix++;
  const aEnd = aHi - suffix;
  const bEnd = bHi - suffix;
  if (aLo === aEnd) for (let j = bLo; j < bEnd; j++) emit('+', j);
  else if (bLo === bEnd) for (let i = aLo; i < aEnd; i++) emit('-', i);
  else {
    const split = middleSnake(a, aLo, aEnd, b, bLo, bEnd);
    if (split === null) {
      for (let i = aLo; i < aEnd; i++) emit('-', i);
      for (let j = bLo; j < bEnd; j++) emit('+', j);
    } else {
      diffRange(a, aLo, aLo + split[0], b, bLo, bLo + split[1], emit);
      diffRange(a, aLo + split[0], aEnd, b, bLo + split[1], bEnd, emit);
    }
  }
  for (let k = 0; k < suffix; k++) emit(' ', aEnd + k);
}

/** Myers' middle snake (forward and reverse searches meeting), as in diff-match-patch's bisect. */
function middleSnake(a: Int32Array, aLo: number, aHi: number, b: Int32Array, bLo: number, bHi: number): [number, number] | null {
  const n = aHi - aLo;
  const m = bHi - bLo;
  const maxD = Math.ceil((n + m) / 2);
  const vOffset = maxD;
  const vLength = 2 * maxD + 2;
  const v1 = new Int32Array(vLength).fill(-1);
  const v2 = new Int32Array(vLength).fill(-1);
  v1[vOffset + 1] = 0;
  v2[vOffset + 1] = 0;
  const delta = n - m;
  const front = delta % 2 !== 0;
  let k1start = 0;
  let k1end = 0;
  let k2start = 0;
  let k2end = 0;
  for (let d = 0; d < maxD; d++) {
    for (let k1 = -d + k1start; k1 <= d - k1end; k1 += 2) {
      const k1Offset = vOffset + k1;
      let x1 = k1 === -d || (k1 !== d && v1[k1Offset - 1]! < v1[k1Offset + 1]!) ? v1[k1Offset + 1]! : v1[k1Offset - 1]! + 1;
      let y1 = x1 - k1;
      while (x1 < n && y1 < m && a[aLo + x1] === b[bLo + y1]) x1++, y1++;
      v1[k1Offset] = x1;
      if (x1 > n) k1end += 2;
      else if (y1 > m) k1start += 2;
      else if (front) {
        const k2Offset = vOffset + delta - k1;
        if (k2Offset >= 0 && k2Offset < vLength && v2[k2Offset] !== -1) {
          if (x1 >= n - v2[k2Offset]!) return [x1, y1];
        }
      }
    }
    for (let k2 = -d + k2start; k2 <= d - k2end; k2 += 2) {
      const k2Offset = vOffset + k2;
      let x2 = k2 === -d || (k2 !== d && v2[k2Offset - 1]! < v2[k2Offset + 1]!) ? v2[k2Offset + 1]! : v2[k2Offset - 1]! + 1;
      let y2 = x2 - k2;
      while (x2 < n && y2 < m && a[aHi - x2 - 1] === b[bHi - y2 - 1]) x2++, y2++;
      v2[k2Offset] = x2;
      if (x2 > n) k2end += 2;
      else if (y2 > m) k2start += 2;
      else if (!front) {
        const k1Offset = vOffset + delta - k2;
        if (k1Offset >= 0 && k1Offset < vLength && v1[k1Offset] !== -1) {
          const x1 = v1[k1Offset]!;
          const y1 = vOffset + x1 - k1Offset;
          if (x1 >= n - x2) return [x1, y1];
        }
      }
    }
  }
  return null;
}

// ---------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------

function sha256(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/** NUL in the first 8 KiB, or not valid UTF-8. */
export function isBinary(data: Buffer): boolean {
  const head = data.subarray(0, 8192);
  return head.includes(0) || !isUtf8(data);
}

function isGone(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ENOENT';
}

/** Code-unit order: stable across locales. */
function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Runs `fn` over `items` with at most `limit` in flight; stops starting new ones after a failure. */
async function forEachLimit<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failed = false;
  const worker = async () => {
    while (!failed && next < items.length) {
      const item = items[next++]!;
      try {
        await fn(item);
      } catch (err) {
        failed = true;
        throw err;
      }
    }
  };
  const results = await Promise.allSettled(Array.from({ length: Math.min(limit, items.length) }, worker));
  const rejected = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (rejected) throw rejected.reason;
}

/** Bounds the bytes of file content held at once; a file larger than the budget waits until it runs alone. */
class ByteBudget {
  private available: number;
  private readonly waiters: { n: number; resolve: () => void }[] = [];
  constructor(private readonly limit: number) {
    this.available = limit;
  }
  async acquire(bytes: number): Promise<number> {
    const n = Math.min(Math.max(bytes, 1), this.limit);
    if (this.waiters.length === 0 && this.available >= n) {
      this.available -= n;
      return n;
    }
    await new Promise<void>((resolve) => this.waiters.push({ n, resolve }));
    return n;
  }
  release(n: number): void {
    this.available += n;
    while (this.waiters.length > 0 && this.available >= this.waiters[0]!.n) {
      const w = this.waiters.shift()!;
      this.available -= w.n;
      w.resolve();
    }
  }
}

/**
 * In-memory BlobStore, e.g. for the after-replay scan: `fallback` answers gets it cannot (the trace store, for
 * the initial snapshot's blobs); contents over `maxBlobBytes` are hashed but not kept.
 */
export class MemoryBlobStore implements BlobStore {
  readonly blobs = new Map<string, Buffer>();
  constructor(private readonly opts: { fallback?: BlobStore; maxBlobBytes?: number } = {}) {}
  async put(content: Buffer): Promise<string> {
    const hash = sha256(content);
    if (content.length <= (this.opts.maxBlobBytes ?? Infinity) && !this.blobs.has(hash)) this.blobs.set(hash, Buffer.from(content));
    return hash;
  }
  async get(hash: string): Promise<Buffer | undefined> {
    return this.blobs.get(hash) ?? (await this.opts.fallback?.get(hash));
  }
}
