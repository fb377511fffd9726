import { UsageError, flag, has, parseArgs } from './args.js';
import { DaemonClient, DaemonClientError } from '../daemon-client.js';
import { homePaths, resolveHome } from '../home.js';
import { collectGarbage, expiryFor, loadRetention, loadStructuralOptions, RetentionConfigError, type GcResult } from '../trace/retention.js';
import { isValidTraceName, type TraceMeta } from '../trace/schema.js';
import { TraceStore } from '../trace/store.js';
import { TierError, convertToStructural, type ConversionResult } from '../trace/tiers.js';

export const KEEP_HELP = `usage: mitm-replay keep NAME|last [--release] [--home DIR]

Pins a trace: it never expires and gc never deletes it. A full trace is a complete transcript; pinning it
keeps its payloads beyond the retention policy (HOME/config.json "retention.fullHours", default 72), so
keep only what you must. --release undoes it: the trace expires by the policy again (from its creation).`;

export const GC_HELP = `usage: mitm-replay gc [--json] [--home DIR]

Deletes expired traces (never one being recorded), the workspace blobs no remaining trace refers to and the
body chunks no remaining exchange refers to.
A running daemon does this every hour on its own.`;

/** Runs `work` through the running daemon's control API, or on the store directly when none runs. */
export async function withStoreOrDaemon<T>(home: string, viaDaemon: (client: DaemonClient) => Promise<T>, direct: (store: TraceStore) => Promise<T>): Promise<T> {
  const client = await DaemonClient.find(homePaths(home).stateFile);
  try {
    if (client) return await viaDaemon(client);
    const store = await TraceStore.open(homePaths(home).store);
    try {
      return await direct(store);
    } finally {
      await store.close();
    }
  } catch (err) {
    if (err instanceof DaemonClientError || err instanceof RetentionConfigError || err instanceof TierError) throw new UsageError(err.message);
    throw err;
  }
}

export async function runKeep(argv: string[]): Promise<number> {
  const args = parseArgs('keep', argv, { release: {}, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(KEEP_HELP);
    return 0;
  }
  const [name, extra] = args.positionals;
  if (!name || extra !== undefined) throw new UsageError("keep: give one trace name (or last); see 'mitm-replay keep --help'");
  if (name !== 'last' && !isValidTraceName(name)) throw new UsageError(`keep: invalid trace name '${name}'`);
  const home = resolveHome(flag(args, 'home'));
  const release = has(args, 'release');
  const meta = await withStoreOrDaemon<TraceMeta>(
    home,
    (client) => client.request('POST', `/traces/${encodeURIComponent(name)}/keep`, { release }),
    async (store) => {
      const resolved = name === 'last' ? await store.latestTraceName() : name;
      const found = resolved === undefined ? undefined : await store.getTrace(resolved);
      if (!found) throw new UsageError(`keep: no trace named '${name}' (see 'mitm-replay ls')`);
      const updated: TraceMeta = release ? { ...found, kept: false, expiresAt: expiryFor(loadRetention(home), found.createdAt) } : { ...found, kept: true };
      await store.putTrace(updated);
      return updated;
    },
  );
  if (release) process.stderr.write(`mitm-replay: trace ${meta.name} is no longer pinned; it expires at ${new Date(meta.expiresAt!).toISOString()}\n`);
  else process.stderr.write(`mitm-replay: trace ${meta.name} is pinned and will not expire. WARNING: it is a full trace, so its payloads (complete transcripts) now outlive the retention policy\n`);
  return 0;
}

export async function runGc(argv: string[]): Promise<number> {
  const args = parseArgs('gc', argv, { json: {}, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(GC_HELP);
    return 0;
  }
  if (args.positionals.length > 0) throw new UsageError(`gc: unexpected argument '${args.positionals[0]}'`);
  const home = resolveHome(flag(args, 'home'));
  const result = await withStoreOrDaemon<GcResult>(
    home,
    (client) => client.request('POST', '/gc'),
    (store) => collectGarbage(store, loadRetention(home), new Set(), { sweep: 'always' }),
  );
  if (has(args, 'json')) console.log(JSON.stringify(result));
  else process.stderr.write(`mitm-replay: gc deleted ${result.deletedTraces.length} expired trace(s)${result.deletedTraces.length ? ` (${result.deletedTraces.join(', ')})` : ''}, ${result.deletedBlobs} unreferenced blob(s) and ${result.deletedChunks} unreferenced body chunk(s)\n`);
  return 0;
}

export const TIER_HELP = `usage: mitm-replay tier NAME|last structural [--home DIR]

Converts a full trace to the structural tier, one way: every exchange is rewritten as its shape (JSON strings
as same-length filler, headers by name with values reduced, other bodies by length and content type; SSE
frames and timing kept), the replay reports and the workspace snapshot are dropped, content nothing else
refers to is deleted and the store compacted, so the payloads are gone from disk, not hidden. Structural
traces expire after 90 days (HOME/config.json "retention.structuralDays"). A structural replay matches
requests by their shape.`;

export async function runTier(argv: string[]): Promise<number> {
  const args = parseArgs('tier', argv, { home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(TIER_HELP);
    return 0;
  }
  const [name, tier, extra] = args.positionals;
  if (!name || !tier || extra !== undefined) throw new UsageError("tier: usage: mitm-replay tier NAME structural (see 'mitm-replay tier --help')");
  if (name !== 'last' && !isValidTraceName(name)) throw new UsageError(`tier: invalid trace name '${name}'`);
  if (tier === 'full') throw new UsageError('tier: structural → full is impossible: the payloads are gone (the conversion is one way)');
  if (tier !== 'structural') throw new UsageError(`tier: unknown tier '${tier}' (the tiers are full and structural)`);
  const home = resolveHome(flag(args, 'home'));
  const result = await withStoreOrDaemon<ConversionResult>(
    home,
    (client) => client.request('POST', `/traces/${encodeURIComponent(name)}/tier`, { tier }),
    async (store) => {
      const resolved = name === 'last' ? ((await store.latestTraceName()) ?? name) : name;
      return convertToStructural(store, resolved, loadRetention(home), loadStructuralOptions(home));
    },
  );
  const dropped = [result.deletedReports > 0 ? `${result.deletedReports} replay report(s)` : '', result.droppedWorkspace ? 'the workspace snapshot' : ''].filter(Boolean);
  process.stderr.write(
    `mitm-replay: trace ${result.name} is structural now (${result.exchanges} records reduced to their shape${dropped.length ? `; dropped ${dropped.join(' and ')}` : ''}; ${result.deletedBlobs} blob(s) and ${result.deletedChunks} body chunk(s) deleted; store compacted)\n`,
  );
  return 0;
}
