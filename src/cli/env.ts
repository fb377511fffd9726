import { UsageError, flag, has, parseArgs } from './args.js';
import { traceNameFlag } from './daemon-options.js';
import { DaemonClient, DaemonClientError } from '../daemon-client.js';
import { replayFlags } from './replay.js';
import { homePaths, resolveHome } from '../home.js';
import { childEnvironment, exportLines } from '../launch/child-env.js';

export const ENV_HELP = `usage: mitm-replay env [--home DIR] [--trace NAME | --replay NAME [--diagnostic] [--pace fast|recorded] [--allow-live HOSTS]] [--no-base-url]

Prints 'export ...' lines that point a shell (and everything started from it) at the running daemon:
  eval "$(mitm-replay env --trace my-run)"
With --trace, registers a session with the daemon so this shell's traffic records into trace NAME
(an existing name is refused); without it, traffic records into the daemon's own trace.
With --replay, opens a replay session of trace NAME (or last) instead: the shell's requests are answered
from the trace with no network; 'mitm-replay end ID' (ID is printed as MITM_REPLAY_RUN) prints the verdict.
Needs a running daemon ('mitm-replay daemon'); 'mitm-replay record -- CMD' needs none.

options:
  --home DIR       the daemon's home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --trace NAME     record into this trace through a new session
  --replay NAME    replay this trace (or last) through a new session; see 'mitm-replay replay --help'
                   for --diagnostic, --pace and --allow-live
  --no-base-url    do not set OPENAI_BASE_URL / ANTHROPIC_BASE_URL
  --help           this text`;

export async function runEnv(argv: string[]): Promise<number> {
  const args = parseArgs('env', argv, {
    home: { value: true },
    trace: { value: true },
    replay: { value: true },
    diagnostic: {},
    pace: { value: true },
    'allow-live': { value: true },
    'no-base-url': {},
    help: {},
  });
  if (has(args, 'help')) {
    console.log(ENV_HELP);
    return 0;
  }
  if (args.positionals.length > 0 || args.rest) throw new UsageError(`env: unexpected argument '${args.positionals[0] ?? '--'}' (see 'mitm-replay env --help')`);
  const home = resolveHome(flag(args, 'home'));
  const trace = traceNameFlag(args, 'env');
  const paths = homePaths(home);
  const client = await DaemonClient.find(paths.stateFile);
  if (!client) throw new UsageError(`env: no daemon is running for ${home}; start one with 'mitm-replay daemon --home ${home}' (or use 'mitm-replay record -- CMD')`);
  let proxyUrl = client.url;
  let baseUrlPrefix = `${client.url.replace(/^http:/, 'https:')}/__mitm-replay/b/-`;
  const replay = flag(args, 'replay');
  if (replay !== undefined && trace !== undefined) throw new UsageError('env: give --trace (record) or --replay (replay), not both');
  if (replay === undefined && ['diagnostic', 'pace', 'allow-live'].some((n) => has(args, n))) throw new UsageError('env: --diagnostic, --pace and --allow-live need --replay NAME');
  let runId: string | undefined;
  try {
    if (trace !== undefined) {
      const session = await client.createSession({ trace, source: 'env' });
      proxyUrl = session.proxyUrl;
      baseUrlPrefix = session.baseUrlPrefix;
    } else if (replay !== undefined) {
      const options = replayFlags('env', args, replay);
      const session = await client.createSession({ mode: 'replay', ...options, cwd: process.cwd() });
      proxyUrl = session.proxyUrl;
      baseUrlPrefix = session.baseUrlPrefix;
      runId = session.id;
    }
  } catch (err) {
    if (err instanceof DaemonClientError) throw new UsageError(`env: ${err.message}`);
    throw err;
  }
  const env = childEnvironment({ proxyUrl, baseUrlPrefix: has(args, 'no-base-url') ? null : baseUrlPrefix, paths });
  if (runId !== undefined) env.MITM_REPLAY_RUN = runId;
  console.log(exportLines(env));
  if (runId !== undefined) console.log(`# replay run ${runId}: end it with 'mitm-replay end ${runId}' to see the verdict`);
  return 0;
}
