import { writeFileSync, renameSync } from 'node:fs';
import { UsageError, flag, has, parseArgs } from './args.js';
import { resolveHome } from '../home.js';
import { BundleError, exportBundle } from '../trace/bundle.js';
import { openTraceReader } from '../trace/reader.js';
import { isValidTraceName } from '../trace/schema.js';

export const EXPORT_HELP = `usage: mitm-replay export NAME|last --bundle FILE [--home DIR]

Writes one portable file holding the trace exactly (every exchange's stored bytes and chunks, metadata,
replay reports, workspace snapshot, redaction manifest), with a content hash checked on import, so a
replay on another machine gives the same verdict: 'mitm-replay import FILE' there.
(HAR export, --har FILE, is not implemented yet.)

options:
  --bundle FILE   where to write the bundle
  --home DIR      the home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --help          this text`;

export async function runExport(argv: string[]): Promise<number> {
  const args = parseArgs('export', argv, { bundle: { value: true }, har: { value: true }, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(EXPORT_HELP);
    return 0;
  }
  const [name, extra] = args.positionals;
  if (!name || extra !== undefined) throw new UsageError("export: give one trace name (or last); see 'mitm-replay export --help'");
  if (name !== 'last' && !isValidTraceName(name)) throw new UsageError(`export: invalid trace name '${name}'`);
  if (has(args, 'har')) throw new UsageError('export: --har is not implemented yet; use --bundle FILE');
  const file = flag(args, 'bundle');
  if (!file) throw new UsageError("export: say where to write it: --bundle FILE");
  const reader = await openTraceReader(resolveHome(flag(args, 'home')));
  try {
    const { bytes, meta, exchanges } = await exportBundle(reader, name);
    // Written whole, then renamed: a crash never leaves a half bundle under the final name.
    const temp = `${file}.${process.pid}.tmp`;
    writeFileSync(temp, bytes);
    renameSync(temp, file);
    process.stderr.write(`mitm-replay: exported trace ${meta.name} (${exchanges} records, ${bytes.length} bytes) to ${file}\n`);
    return 0;
  } catch (err) {
    if (err instanceof BundleError) throw new UsageError(`export: ${err.message}`);
    throw err;
  } finally {
    await reader.close();
  }
}
