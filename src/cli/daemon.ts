import { UsageError, flag, has, parseArgs } from './args.js';
import { DAEMON_FLAGS, DAEMON_FLAGS_HELP, daemonOptionsFrom } from './daemon-options.js';
import { replayFlags } from './replay.js';
import { Daemon } from '../daemon.js';

export const DAEMON_HELP = `usage: mitm-replay daemon [options]

Runs the recording proxy in the foreground (systemd- and container-friendly). Point an agent at it with
HTTPS_PROXY=http://127.0.0.1:8877 and SSL_CERT_FILE=HOME/certs/bundle.pem, or use 'mitm-replay env'.
Traffic without session credentials is recorded into --trace NAME (default: a new trace); restarting with
the same --trace continues that trace. With --replay NAME, anonymous traffic is answered from trace NAME
instead (no network); the verdict is printed when the daemon stops. SIGINT/SIGTERM shut down cleanly.

options:
${DAEMON_FLAGS_HELP}
  --replay NAME            anonymous traffic replays trace NAME (or last); with --diagnostic, --pace and
                           --allow-live as for 'mitm-replay replay'
  --help                   this text`;

export async function runDaemon(argv: string[]): Promise<number> {
  const args = parseArgs('daemon', argv, { ...DAEMON_FLAGS, replay: { value: true }, diagnostic: {}, pace: { value: true }, 'allow-live': { value: true } });
  if (has(args, 'help')) {
    console.log(DAEMON_HELP);
    return 0;
  }
  if (args.positionals.length > 0 || args.rest) throw new UsageError(`daemon: unexpected argument '${args.positionals[0] ?? '--'}' (see 'mitm-replay daemon --help')`);
  const options = daemonOptionsFrom(args, 'daemon', 8877);
  const replay = flag(args, 'replay');
  if (replay === undefined && ['diagnostic', 'pace', 'allow-live'].some((n) => has(args, n))) throw new UsageError('daemon: --diagnostic, --pace and --allow-live need --replay NAME');
  if (replay !== undefined) {
    if (options.trace !== undefined) throw new UsageError('daemon: give --trace (record) or --replay (replay), not both');
    options.replay = replayFlags('daemon', args, replay);
  }
  // Listen for signals before starting: a SIGTERM that arrives during start-up still shuts down cleanly.
  const stopRequested = new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
  const daemon = await Daemon.start(options);
  const anonymous = options.replay ? `replays trace ${options.replay.trace}` : `records into trace ${daemon.anonymousTraceName}`;
  process.stderr.write(`mitm-replay daemon listening on ${daemon.url} (home ${options.home}); anonymous traffic ${anonymous}\n`);
  await stopRequested;
  await daemon.stop();
  const report = daemon.finalReplayReport;
  if (report) process.stderr.write(`mitm-replay: replay run ${report.runId} of trace ${report.trace}\n${report.line}\n`);
  return 0;
}
