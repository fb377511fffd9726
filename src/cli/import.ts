import { readFileSync } from 'node:fs';
import { UsageError, flag, has, parseArgs } from './args.js';
import { DaemonClient, DaemonClientError } from '../daemon-client.js';
import { homePaths, resolveHome, ensureHome } from '../home.js';
import { BundleError, importBundle, parseBundle, serializeBundle, type Bundle } from '../trace/bundle.js';
import { HarImportError, harToBundle, parseHarText } from '../trace/har-import.js';
import { basename } from 'node:path';
import { TraceStore } from '../trace/store.js';
import { expiryFor, loadRetention } from '../trace/retention.js';
import { isValidTraceName } from '../trace/schema.js';

export const IMPORT_HELP = `usage: mitm-replay import FILE [--trace NAME] [--force] [--home DIR]
       mitm-replay import --har FILE [--trace NAME] [--force] [--home DIR]

Imports a bundle made by 'mitm-replay export NAME --bundle FILE' after checking its content hash (a
truncated or modified bundle is refused). The trace keeps its name unless --trace gives another; a
different trace of that name is not overwritten without --force. Importing the same bundle twice changes
nothing. With --har, FILE is a HAR (browser devtools, mitmproxy, Polly.JS, or 'mitm-replay export --har'):
it becomes a replayable trace, redacted with the built-in rules; the import summary states what HAR could
not carry (chunk timing, raw header order, ...). The trace is named --trace NAME, else after the file.

options:
  --har           FILE is a HAR, not a bundle
  --trace NAME    import under this name
  --force         replace a different trace of the same name
  --home DIR      the home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --help          this text`;

export async function runImport(argv: string[]): Promise<number> {
  const args = parseArgs('import', argv, { trace: { value: true }, force: {}, har: {}, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(IMPORT_HELP);
    return 0;
  }
  const [file, extra] = args.positionals;
  if (!file || extra !== undefined) throw new UsageError("import: give one bundle file; see 'mitm-replay import --help'");
  const name = flag(args, 'trace');
  if (name !== undefined && !isValidTraceName(name)) throw new UsageError(`import: invalid trace name '${name}'`);
  let bytes: Buffer;
  try {
    bytes = readFileSync(file);
  } catch (err) {
    throw new UsageError(`import: cannot read ${file}: ${(err as Error).message}`);
  }
  try {
    let bundle: Bundle;
    if (has(args, 'har')) {
      const imported = harToBundle(parseHarText(bytes.toString('utf8'), file), name ?? traceNameFromFile(file));
      bundle = imported.bundle;
      for (const limit of imported.limits) process.stderr.write(`mitm-replay: HAR limit: ${limit}\n`);
      bytes = serializeBundle(bundle);
    } else bundle = parseBundle(bytes, file);
    const home = resolveHome(flag(args, 'home'));
    const paths = ensureHome(home);
    const client = await DaemonClient.find(paths.stateFile);
    let result: { name: string; exchanges: number; unchanged: boolean };
    if (client) {
      const query = new URLSearchParams({ ...(name ? { trace: name } : {}), ...(has(args, 'force') ? { force: '1' } : {}) });
      result = JSON.parse((await client.requestRaw('POST', `/import?${query.toString()}`, bytes, 120_000)).toString('utf8'));
    } else {
      const store = await TraceStore.open(homePaths(home).store);
      try {
        result = await importBundle(store, bundle, { name, force: has(args, 'force'), expiresAt: expiryFor(loadRetention(home), Date.now()) });
      } finally {
        await store.close();
      }
    }
    process.stderr.write(
      result.unchanged
        ? `mitm-replay: trace ${result.name} is already here, identical; nothing changed\n`
        : `mitm-replay: imported trace ${result.name} (${result.exchanges} records) from ${file}\n`,
    );
    return 0;
  } catch (err) {
    if (err instanceof BundleError || err instanceof DaemonClientError || err instanceof HarImportError) throw new UsageError(`import: ${err.message}`);
    throw err;
  }
}

/** `devtools-export.har` → `devtools-export` (characters a trace name cannot hold become `-`). */
function traceNameFromFile(file: string): string {
  const base = basename(file).replace(/\.har$/i, '').replace(/[^A-Za-z0-9._-]/g, '-').slice(0, 64);
  return base === '' || base === 'last' ? 'imported-har' : base;
}
