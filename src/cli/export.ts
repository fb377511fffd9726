import { writeFileSync, renameSync } from 'node:fs';
import { UsageError, flag, has, parseArgs } from './args.js';
import { resolveHome } from '../home.js';
import { BundleError, exportBundle } from '../trace/bundle.js';
import { openTraceReader, readWholeTrace } from '../trace/reader.js';
import { traceToHar } from '../trace/har.js';
import { isValidTraceName } from '../trace/schema.js';
import { loadRetention } from '../trace/retention.js';
import { exportHtml } from '../ui/export-html.js';
import { ViewError } from '../ui/views.js';

export const EXPORT_HELP = `usage: mitm-replay export NAME|last (--bundle FILE | --har FILE | --html FILE [--run ID|last]) [--home DIR]

--bundle writes one portable file holding the trace exactly (every exchange's stored bytes and chunks,
metadata, replay reports, workspace snapshot, redaction manifest), with a content hash checked on import,
so a replay on another machine gives the same verdict: 'mitm-replay import FILE' there.
--har writes HAR 1.2 for browser devtools and mitmproxy: bodies decoded, base64 for binary, streamed frames
and chunk timing under the documented '_mitmReplay' extension (docs/har.md).
--html writes the trace viewer's page for the trace ('mitm-replay ui') as one self-contained HTML file to
attach to a bug report: timeline, every exchange decoded (bodies shown up to 1 MiB), replay reports with
their request diffs, compare runs. It needs no server and loads nothing from anywhere.

options:
  --bundle FILE   where to write the bundle
  --har FILE      where to write the HAR
  --html FILE     where to write the HTML page
  --run ID        with --html: open the page at this replay run's report (last: the latest)
  --home DIR      the home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --help          this text`;

/** Written whole, then renamed: a crash never leaves half a file under the final name. */
function writeWhole(file: string, bytes: Buffer): void {
  const temp = `${file}.${process.pid}.tmp`;
  // owner-only: a trace is a full transcript; sharing it is a deliberate act
  writeFileSync(temp, bytes, { mode: 0o600 });
  renameSync(temp, file);
}

export async function runExport(argv: string[]): Promise<number> {
  const args = parseArgs('export', argv, { bundle: { value: true }, har: { value: true }, html: { value: true }, run: { value: true }, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(EXPORT_HELP);
    return 0;
  }
  const [name, extra] = args.positionals;
  if (!name || extra !== undefined) throw new UsageError("export: give one trace name (or last); see 'mitm-replay export --help'");
  if (name !== 'last' && !isValidTraceName(name)) throw new UsageError(`export: invalid trace name '${name}'`);
  const bundleFile = flag(args, 'bundle');
  const harFile = flag(args, 'har');
  const htmlFile = flag(args, 'html');
  const runId = flag(args, 'run');
  if (!bundleFile && !harFile && !htmlFile) throw new UsageError('export: say where to write it: --bundle FILE, --har FILE or --html FILE');
  if (runId !== undefined && !htmlFile) throw new UsageError('export: --run goes with --html (the page opens at that report)');
  const home = resolveHome(flag(args, 'home'));
  const reader = await openTraceReader(home);
  try {
    if (bundleFile) {
      const { bytes, meta, exchanges } = await exportBundle(reader, name);
      writeWhole(bundleFile, bytes);
      process.stderr.write(`mitm-replay: exported trace ${meta.name} (${exchanges} records, ${bytes.length} bytes) to ${bundleFile}\n`);
    }
    if (harFile) {
      const whole = await readWholeTrace(reader, name);
      if (!whole) throw new BundleError(`no trace named '${name}' (see 'mitm-replay ls')`);
      const { meta, exchanges } = whole;
      const har = traceToHar(meta, exchanges) as { log: { entries: unknown[] } };
      writeWhole(harFile, Buffer.from(`${JSON.stringify(har, null, 2)}\n`));
      process.stderr.write(`mitm-replay: exported trace ${meta.name} as HAR (${har.log.entries.length} entries) to ${harFile}\n`);
    }
    if (htmlFile) {
      const page = await exportHtml(reader, loadRetention(home), name, runId);
      const bytes = Buffer.from(page.html);
      writeWhole(htmlFile, bytes);
      process.stderr.write(`mitm-replay: exported trace ${page.meta.name} as HTML (${page.exchanges} exchanges, ${page.reports} replay reports, ${bytes.length} bytes) to ${htmlFile}\n`);
    }
    return 0;
  } catch (err) {
    if (err instanceof BundleError || err instanceof ViewError) throw new UsageError(`export: ${err.message}`);
    throw err;
  } finally {
    await reader.close();
  }
}
