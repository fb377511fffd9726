import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { isAbsolute, join, relative, resolve } from 'node:path';
import { Redactor } from '../capture/redact.js';
import type { FlagSpec, ParsedArgs } from '../cli/args.js';
import { UsageError, flag, flagAll, has } from '../cli/args.js';
import type { ReplayOutcome } from '../replay/verdict.js';
import type { TraceMeta, WorkspaceMeta } from '../trace/schema.js';
import {
  DEFAULT_TEXT_LIMIT,
  MemoryBlobStore,
  compareDiffs,
  diffSnapshots,
  restoreSnapshot,
  scanWorkspace,
  takeSnapshot,
  type BlobStore,
  type FileChange,
  type Snapshot,
  type WorkspaceOptions,
} from './workspace.js';

/** Glue between the workspace module and the `record` / `replay` commands. */

export const RECORD_WORKSPACE_FLAGS: Record<string, FlagSpec> = {
  workspace: { value: true },
  'no-workspace': {},
  include: { value: true, repeat: true },
  exclude: { value: true, repeat: true },
  'max-workspace-mb': { value: true },
};

export const RECORD_WORKSPACE_HELP = `  --workspace DIR          directory to snapshot before CMD and diff after (default: the cwd)
  --no-workspace           take no snapshot
  --include GLOB           also snapshot paths that .gitignore or the defaults leave out (repeatable)
  --exclude GLOB           leave these paths out of the snapshot (repeatable)
  --max-workspace-mb N     refuse a workspace larger than N MB (default 200)`;

export const REPLAY_WORKSPACE_FLAGS: Record<string, FlagSpec> = {
  'in-place': {},
  keep: {},
  'no-link': {},
  'same-path': {},
};

export const REPLAY_WORKSPACE_HELP = `  --in-place               restore nothing and run CMD in the cwd (default: a fresh sandbox holding the
                           recorded workspace snapshot)
  --keep                   keep the sandbox and print its path
  --no-link                do not symlink node_modules, .venv, venv, vendor from the recorded workspace
  --same-path              restore into the recorded path (it must be free), so prompts with the cwd match`;

export interface RecordWorkspace {
  options: WorkspaceOptions;
  before: Snapshot;
  meta: WorkspaceMeta;
}

/** The snapshot options `record` was asked for (undefined with --no-workspace), checked; the caller adds the
 * trace's redactor once the trace exists. */
export function recordWorkspaceOptions(args: ParsedArgs, home: string): Omit<WorkspaceOptions, 'redactor'> | undefined {
  if (has(args, 'no-workspace')) {
    if (['workspace', 'include', 'exclude', 'max-workspace-mb'].some((n) => has(args, n))) throw new UsageError('record: --no-workspace cannot be combined with --workspace, --include, --exclude or --max-workspace-mb');
    return undefined;
  }
  const root = resolve(flag(args, 'workspace') ?? process.cwd());
  if (!existsSync(root)) throw new UsageError(`record: --workspace ${root} does not exist`);
  const limit = flag(args, 'max-workspace-mb');
  if (limit !== undefined && !/^\d+(\.\d+)?$/.test(limit)) throw new UsageError(`record: --max-workspace-mb must be a number of megabytes, not '${limit}'`);
  return {
    root,
    include: flagAll(args, 'include'),
    exclude: flagAll(args, 'exclude'),
    skipDirs: [home],
    maxBytes: limit === undefined ? undefined : Math.round(Number(limit) * 1024 * 1024),
  };
}

/** Snapshots the workspace into the store (content-addressed, redacted) before the command runs. */
export async function captureWorkspace(options: WorkspaceOptions, blobs: BlobStore): Promise<RecordWorkspace> {
  const before = await takeSnapshot(options, blobs);
  const snapshot = await blobs.put(Buffer.from(JSON.stringify(before)));
  const files = before.entries.filter((e) => e.kind === 'file');
  return {
    options,
    before,
    meta: {
      root: options.root,
      snapshot,
      files: files.length,
      bytes: before.totalBytes,
      redactedFiles: before.redactedFiles,
      include: options.include ?? [],
      exclude: options.exclude ?? [],
    },
  };
}

/** What the run changed: the workspace now against its snapshot. */
export async function workspaceChanges(options: WorkspaceOptions, before: Snapshot, blobs: BlobStore): Promise<FileChange[]> {
  const after = await scanWorkspace(options, blobs);
  return diffSnapshots(before, after, blobs);
}

/**
 * A blob store for states that are compared but not kept (a replay's after-state): new contents stay in memory
 * (texts up to the diff limit), recorded contents are read from the trace store.
 */
function scratchBlobs(stored: BlobStore): BlobStore {
  return new MemoryBlobStore({ fallback: stored, maxBlobBytes: DEFAULT_TEXT_LIMIT });
}

export interface ReplayWorkspace {
  /** where the child runs */
  cwd: string;
  kind: ReplayOutcome['workspace'];
  /** what to diff against after the run (null: nothing to compare) */
  options: WorkspaceOptions | null;
  before: Snapshot | null;
  sandbox: string | null;
  /** the sandbox directory existed (empty) before: empty it afterwards rather than removing it */
  sandboxPreexisted?: boolean;
  note: string | null;
}

/** The recorded cwd relative to the recorded workspace root, so the child starts in the same place. */
function childCwd(meta: TraceMeta, root: string): string {
  const recordedRoot = meta.workspace!.root;
  const inner = meta.cwd ? relative(recordedRoot, meta.cwd) : '';
  return inner && !inner.startsWith('..') && !isAbsolute(inner) ? join(root, inner) : root;
}

function isFree(path: string): boolean {
  return !existsSync(path) || readdirSync(path).length === 0;
}

/**
 * Prepares where a replay runs: a fresh sandbox with the recorded snapshot (default), the recorded path itself
 * (--same-path), or the cwd (--in-place, or a trace without a snapshot).
 */
export async function prepareReplayWorkspace(args: ParsedArgs, meta: TraceMeta, blobs: BlobStore, home: string): Promise<ReplayWorkspace> {
  const redactor = new Redactor(meta.redaction);
  if (!meta.workspace || has(args, 'in-place')) {
    if (has(args, 'same-path')) throw new UsageError(`replay: --same-path needs a trace with a workspace snapshot${meta.workspace ? ' (and not --in-place)' : ''}`);
    const cwd = process.cwd();
    const note = meta.workspace ? null : `trace ${meta.name} has no workspace snapshot; replaying in the current directory ${cwd}`;
    if (!meta.workspace) return { cwd, kind: 'none', options: null, before: null, sandbox: null, note };
    const options: WorkspaceOptions = { root: cwd, include: meta.workspace.include, exclude: meta.workspace.exclude, skipDirs: [home], redactor, maxBytes: Number.MAX_SAFE_INTEGER };
    // The before-state of an in-place run is only compared, never stored: keep its texts in memory.
    const before = await scanWorkspace(options, scratchBlobs(blobs));
    return { cwd, kind: 'in-place', options, before, sandbox: null, note: null };
  }
  const stored = await blobs.get(meta.workspace.snapshot);
  if (!stored) throw new UsageError(`replay: the workspace snapshot of trace ${meta.name} is missing from the store; replay with --in-place`);
  const snapshot = JSON.parse(stored.toString('utf8')) as Snapshot;
  let root: string;
  let sandboxPreexisted = false;
  if (has(args, 'same-path')) {
    root = meta.workspace.root;
    if (!isFree(root)) throw new UsageError(`replay: --same-path: ${root} is not free (it exists and is not empty); move it away or replay without --same-path`);
    sandboxPreexisted = existsSync(root);
    mkdirSync(root, { recursive: true });
  } else {
    root = mkdtempSync(join(tmpdir(), 'mitm-replay-sandbox-'));
  }
  const { linked } = await restoreSnapshot(snapshot, blobs, root, { linkDependenciesFrom: has(args, 'no-link') ? null : meta.workspace.root });
  // The sandbox has no .git: scan it with the git rules the snapshot captured, so ignored files stay ignored.
  const options: WorkspaceOptions = { root, skipDirs: [home], redactor, maxBytes: Number.MAX_SAFE_INTEGER, restoredFrom: snapshot };
  const note = linked.length > 0 ? `linked ${linked.join(', ')} from ${meta.workspace.root}` : null;
  return { cwd: childCwd(meta, root), kind: 'sandbox', options, before: snapshot, sandbox: root, sandboxPreexisted, note };
}

/** How the replayed run ended compared with the recording (exit codes, files). */
export async function replayOutcome(workspace: ReplayWorkspace, meta: TraceMeta, childExit: number, blobs: BlobStore, keep: boolean): Promise<ReplayOutcome> {
  const outcome: ReplayOutcome = { childExit, recordedExit: meta.exitCode ?? null, files: 'none', workspace: workspace.kind, differences: [] };
  if (workspace.options && workspace.before && meta.workspace?.diff) {
    const replayed = await workspaceChanges(workspace.options, workspace.before, scratchBlobs(blobs));
    const comparison = compareDiffs(meta.workspace.diff, replayed);
    outcome.files = comparison.same ? 'same' : `different:${comparison.differences.length}`;
    outcome.differences = comparison.differences.map((d) => ({
      path: d.path,
      recorded: d.recorded?.change ?? 'unchanged',
      replayed: d.replayed?.change ?? 'unchanged',
      unifiedDiff: d.unifiedDiff,
    }));
  }
  if (workspace.sandbox) {
    if (keep) outcome.sandbox = workspace.sandbox;
    else removeSandbox(workspace.sandbox, workspace.sandboxPreexisted ?? false);
  }
  return outcome;
}

/** Removes a sandbox this replay made (for --same-path into an existing empty directory, only its contents). */
export function removeSandbox(path: string, keepDirectory: boolean): void {
  if (!keepDirectory) {
    rmSync(path, { recursive: true, force: true });
    return;
  }
  for (const name of readdirSync(path)) rmSync(join(path, name), { recursive: true, force: true });
}
