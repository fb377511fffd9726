import { UsageError, flag, has, parseArgs } from './args.js';
import { traceNameFlag } from './daemon-options.js';
import { DaemonClient } from '../daemon-client.js';
import { homePaths, resolveHome } from '../home.js';
import { childEnvironment, exportLines } from '../launch/child-env.js';

export const ENV_HELP = `usage: mitm-replay env [--home DIR] [--trace NAME] [--no-base-url]

Prints 'export ...' lines that point a shell (and everything started from it) at the running daemon:
  eval "$(mitm-replay env --trace my-run)"
With --trace, registers a session with the daemon so this shell's traffic records into trace NAME
(an existing name is refused); without it, traffic records into the daemon's own trace.
Needs a running daemon ('mitm-replay daemon'); 'mitm-replay record -- CMD' needs none.

options:
  --home DIR       the daemon's home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --trace NAME     record into this trace through a new session
  --no-base-url    do not set OPENAI_BASE_URL / ANTHROPIC_BASE_URL
  --help           this text`;

export async function runEnv(argv: string[]): Promise<number> {
  const args = parseArgs('env', argv, { home: { value: true }, trace: { value: true }, 'no-base-url': {}, help: {} });
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
  if (trace !== undefined) {
    const session = await client.createSession({ trace, source: 'env' });
    proxyUrl = session.proxyUrl;
    baseUrlPrefix = session.baseUrlPrefix;
  }
  const env = childEnvironment({ proxyUrl, baseUrlPrefix: has(args, 'no-base-url') ? null : baseUrlPrefix, paths });
  console.log(exportLines(env));
  return 0;
}
