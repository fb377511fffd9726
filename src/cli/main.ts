import { UsageError } from './args.js';
import { runDaemon } from './daemon.js';
import { runEnv } from './env.js';
import { runCompare } from './compare.js';
import { runEnd } from './end.js';
import { runExport } from './export.js';
import { runImport } from './import.js';
import { runLs } from './ls.js';
import { runGc, runKeep, runTier } from './retention.js';
import { runShow } from './show.js';
import { runRecord } from './record.js';
import { runReplay } from './replay.js';
import { runReport } from './report.js';
import { runTrustCa } from './trust-ca.js';
import { runUi } from './ui.js';
import { VERSION } from '../daemon.js';
import { DaemonError } from '../daemon.js';
import { DaemonClientError } from '../daemon-client.js';
import { StoreFormatError, StoreLockedError } from '../trace/store.js';

const HELP = `usage: mitm-replay <command> [options]

Records an AI agent's HTTP(S) traffic byte for byte through a local TLS-intercepting proxy.

commands:
  daemon     run the recording proxy in the foreground
  record     run a command with its traffic recorded into a trace:  mitm-replay record -- CMD ARGS
  replay     run a command against a trace, with no network:  mitm-replay replay NAME -- CMD ARGS
  report     show a replay's verdict and divergences again
  ls         list the traces
  show       list a trace's exchanges, or print one decoded
  ui         the trace viewer in a browser: timelines, decoded exchanges, replay diffs
  export     write a trace to a portable bundle file (--bundle FILE), HAR (--har) or one HTML page (--html)
  import     import a bundle made by export
  keep       pin a trace so it never expires (--release undoes it)
  gc         delete expired traces and unreferenced blobs
  tier       convert a trace to the structural tier (its shape only, no payloads)
  compare    replay a control and a patched command against one recording: did the patch fix it?
  env        print 'export ...' lines that point a shell at the running daemon (to record or replay)
  end        end a session opened with 'env' (prints a replay's verdict)
  trust-ca   install (or --uninstall) the local CA into system / NSS trust stores

'mitm-replay <command> --help' describes each command.`;

const COMMANDS: Record<string, (argv: string[]) => Promise<number>> = {
  daemon: runDaemon,
  record: runRecord,
  replay: runReplay,
  report: runReport,
  ls: runLs,
  show: runShow,
  ui: runUi,
  export: runExport,
  import: runImport,
  keep: runKeep,
  gc: runGc,
  tier: runTier,
  compare: runCompare,
  env: runEnv,
  end: runEnd,
  'trust-ca': runTrustCa,
};

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
    console.log(HELP);
    return command === undefined ? 2 : 0;
  }
  if (command === '--version' || command === '-V') {
    console.log(VERSION);
    return 0;
  }
  const run = COMMANDS[command];
  if (!run) {
    process.stderr.write(`mitm-replay: unknown command '${command}' (commands: ${Object.keys(COMMANDS).join(', ')}; see 'mitm-replay --help')\n`);
    return 2;
  }
  try {
    return await run(rest);
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`mitm-replay: ${err.message}\n`);
      return 2;
    }
    if (err instanceof DaemonError || err instanceof DaemonClientError || err instanceof StoreLockedError || err instanceof StoreFormatError || (err as Error).name === 'RedactionRulesError') {
      process.stderr.write(`mitm-replay: ${command}: ${(err as Error).message}\n`);
      return 1;
    }
    throw err;
  }
}
