import { UsageError, flag, has, parseArgs } from './args.js';
import { resolveHome } from '../home.js';
import { openTraceReader, type TraceListing } from '../trace/reader.js';
import { expiresAt, loadRetention, type RetentionPolicy } from '../trace/retention.js';

export const LS_HELP = `usage: mitm-replay ls [--json] [--home DIR]

Lists the traces in the home, oldest first: name, created, tier, expiry (never* for pinned traces),
exchanges, bytes, command, the command's exit code, and the last replay's verdict. Works beside a running
daemon (it asks the daemon).

options:
  --json        one JSON array (meta, summary, lastVerdict per trace)
  --home DIR    the home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --help        this text`;

function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

/** The end of a long command (where the script name is), marked with an ellipsis. */
function tail(text: string, max: number): string {
  return text.length <= max ? text : `\u2026${text.slice(text.length - max + 1)}`;
}

function expiryColumn(meta: TraceListing['meta'], policy: RetentionPolicy, now: number, when: (ms: number) => string): string {
  const at = expiresAt(meta, policy);
  if (at === null) return 'never*';
  return at <= now ? `expired ${when(at)}` : when(at);
}

/** Columns as a plain table: one line a trace, fields separated by two spaces, padded. */
export function formatListing(listings: TraceListing[], policy: RetentionPolicy, now = Date.now()): string {
  const when = (ms: number) => new Date(ms).toISOString().slice(0, 16).replace('T', ' ');
  const rows = listings.map(({ meta, summary, lastVerdict }) => [
    meta.name,
    new Date(meta.createdAt).toISOString().slice(0, 19).replace('T', ' '),
    meta.tier ?? 'full',
    expiryColumn(meta, policy, now, when),
    String(summary.exchanges),
    bytes(summary.bytesUp + summary.bytesDown),
    meta.command ? tail(meta.command.join(' '), 48) : `(${meta.source})`,
    meta.exitCode === undefined ? '-' : String(meta.exitCode),
    meta.broken ? `BROKEN (${meta.broken.writeErrors} write(s) failed)` : (lastVerdict ?? '-'),
  ]);
  const header = ['NAME', 'CREATED (UTC)', 'TIER', 'EXPIRES (UTC)', 'EXCHANGES', 'BYTES', 'COMMAND', 'EXIT', 'LAST VERDICT'];
  // (a broken trace shows BROKEN in the last column: it is not a complete recording)
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const lines = [header, ...rows].map((r) => r.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd());
  if (listings.some(({ meta }) => meta.kept)) lines.push('WARNING: pinned full traces (never*) keep complete transcripts beyond the retention policy');
  return lines.join('\n');
}

export async function runLs(argv: string[]): Promise<number> {
  const args = parseArgs('ls', argv, { json: {}, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(LS_HELP);
    return 0;
  }
  if (args.positionals.length > 0) throw new UsageError(`ls: unexpected argument '${args.positionals[0]}' (see 'mitm-replay ls --help')`);
  const home = resolveHome(flag(args, 'home'));
  const reader = await openTraceReader(home);
  try {
    const listings = await reader.list();
    if (has(args, 'json')) console.log(JSON.stringify(listings, null, 2));
    else console.log(listings.length === 0 ? "no traces yet (record one with 'mitm-replay record -- CMD')" : formatListing(listings, loadRetention(home)));
    return 0;
  } finally {
    await reader.close();
  }
}
