import { UsageError, has, parseArgs } from './args.js';
import { DAEMON_FLAGS, DAEMON_FLAGS_HELP, daemonOptionsFrom } from './daemon-options.js';
import { Daemon } from '../daemon.js';

export const DAEMON_HELP = `usage: mitm-replay daemon [options]

Runs the recording proxy in the foreground (systemd- and container-friendly). Point an agent at it with
HTTPS_PROXY=http://127.0.0.1:8877 and SSL_CERT_FILE=HOME/certs/bundle.pem, or use 'mitm-replay env'.
Traffic without session credentials is recorded into --trace NAME (default: a new trace); restarting with
the same --trace continues that trace. SIGINT/SIGTERM shut down cleanly.

options:
${DAEMON_FLAGS_HELP}
  --help                   this text`;

export async function runDaemon(argv: string[]): Promise<number> {
  const args = parseArgs('daemon', argv, DAEMON_FLAGS);
  if (has(args, 'help')) {
    console.log(DAEMON_HELP);
    return 0;
  }
  if (args.positionals.length > 0 || args.rest) throw new UsageError(`daemon: unexpected argument '${args.positionals[0] ?? '--'}' (see 'mitm-replay daemon --help')`);
  const options = daemonOptionsFrom(args, 'daemon', 8877);
  // Listen for signals before starting: a SIGTERM that arrives during start-up still shuts down cleanly.
  const stopRequested = new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
  const daemon = await Daemon.start(options);
  process.stderr.write(`mitm-replay daemon listening on ${daemon.url} (home ${options.home}); anonymous traffic records into trace ${daemon.anonymousTraceName}\n`);
  await stopRequested;
  await daemon.stop();
  return 0;
}
