import { writeFileSync } from 'node:fs';
import { UsageError, flag, has, parseArgs, type FlagSpec, type ParsedArgs } from './args.js';
import { DAEMON_FLAGS, DAEMON_FLAGS_HELP, daemonOptionsFrom } from './daemon-options.js';
import { connectBackend, exitCodeOf, runChild, type Backend } from './launch.js';
import { DaemonError } from '../daemon.js';
import { DaemonClientError } from '../daemon-client.js';
import { homePaths } from '../home.js';
import { childEnvironment } from '../launch/child-env.js';
import { InterceptListError, parseInterceptList } from '../proxy/intercept.js';
import { replayExitCode } from '../replay/verdict.js';
import { isValidTraceName } from '../trace/schema.js';

export const REPLAY_HELP = `usage: mitm-replay replay [NAME|last] [--diagnostic] [--json FILE] [--pace fast|recorded] [--allow-live HOSTS] [daemon options] -- CMD [ARGS...]

Runs CMD with the same environment 'record' sets, but answers its requests from trace NAME (default: last)
with no upstream connection at all, then prints the run ID and one verdict line on stderr:
  verdict: recorded=6 requests=6 reused=6 exact=6 reordered=0 diverged=0 missing=0 unused=0 egress=blocked -> PASS
Exit code: 0 on PASS; 1 on FAIL, or DIAGNOSTIC with anything diverged, missing or unused; 2 for its own
errors (no such trace, bad arguments). CMD's exit code does not decide it (both it and the recorded one
are in the report).

options:
  --diagnostic             serve the recorded response at a diverged request's position (labelled with
                           x-mitm-replay-divergence) instead of refusing it; the verdict is DIAGNOSTIC
  --json FILE              write the full report (JSON, schema in docs/replay-report.md) to FILE
  --pace fast|recorded     send recorded stream chunks as fast as the client reads (default) or with the
                           recorded gaps
  --allow-live HOSTS       hosts (comma-separated, * patterns) that were tunnelled, not intercepted, and may
                           go live; every other connection is refused
  --no-base-url            do not set OPENAI_BASE_URL / ANTHROPIC_BASE_URL
${DAEMON_FLAGS_HELP.split('\n').filter((l) => !l.includes('--trace NAME')).join('\n')}
  --help                   this text`;

/** Exit code for replay's own errors. */
export const REPLAY_USAGE_FAILURE = 2;

const { trace: _trace, ...DAEMON_FLAGS_WITHOUT_TRACE } = DAEMON_FLAGS;

export const REPLAY_FLAGS: Record<string, FlagSpec> = {
  ...DAEMON_FLAGS_WITHOUT_TRACE,
  diagnostic: {},
  json: { value: true },
  pace: { value: true },
  'allow-live': { value: true },
  'no-base-url': {},
};

export interface ReplayFlags {
  trace: string;
  diagnostic: boolean;
  pace: 'fast' | 'recorded';
  allowLive: string[];
}

/** Trace name (positional, default `last`) and replay options, checked; bad values are one-line UsageErrors. */
export function replayFlags(command: string, args: ParsedArgs, traceArg: string | undefined): ReplayFlags {
  const trace = traceArg ?? 'last';
  if (!isValidTraceName(trace) && trace !== 'last') throw new UsageError(`${command}: invalid trace name '${trace}': use 1-64 characters of A-Z a-z 0-9 . _ - (or last)`);
  const pace = flag(args, 'pace') ?? 'fast';
  if (pace !== 'fast' && pace !== 'recorded') throw new UsageError(`${command}: --pace must be fast or recorded, not '${pace}'`);
  let allowLive: string[] = [];
  const live = flag(args, 'allow-live');
  if (live !== undefined) {
    if (live.includes('+')) throw new UsageError(`${command}: --allow-live takes host names or patterns, without '+'`);
    try {
      allowLive = parseInterceptList(live);
    } catch (err) {
      if (err instanceof InterceptListError) throw new UsageError(`${command}: ${err.message.replace('--intercept', '--allow-live')}`);
      throw err;
    }
  }
  return { trace, diagnostic: has(args, 'diagnostic'), pace, allowLive };
}

export async function runReplay(argv: string[]): Promise<number> {
  const args = parseArgs('replay', argv, REPLAY_FLAGS);
  if (has(args, 'help')) {
    console.log(REPLAY_HELP);
    return 0;
  }
  if (args.positionals.length > 1) throw new UsageError(`replay: unexpected argument '${args.positionals[1]}': put the command after '--' (mitm-replay replay NAME -- CMD ARGS)`);
  if (!args.rest || args.rest.length === 0) throw new UsageError('replay: no command given; usage: mitm-replay replay [NAME|last] [options] -- CMD [ARGS...]');
  const options = replayFlags('replay', args, args.positionals[0]);
  const jsonFile = flag(args, 'json');
  let backend: Backend;
  try {
    backend = await connectBackend(args, 'replay', {
      mode: 'replay',
      trace: options.trace,
      diagnostic: options.diagnostic,
      pace: options.pace,
      allowLive: options.allowLive,
      cwd: process.cwd(),
      ownerPid: process.pid,
      keepsDaemonAlive: true,
    });
  } catch (err) {
    if (err instanceof DaemonError || err instanceof DaemonClientError) throw new UsageError(`replay: ${err.message}`);
    throw err;
  }
  if (backend.note) process.stderr.write(`mitm-replay: ${backend.note}\n`);
  const env = {
    ...process.env,
    ...childEnvironment({
      proxyUrl: backend.session.proxyUrl,
      baseUrlPrefix: has(args, 'no-base-url') ? null : backend.session.baseUrlPrefix,
      paths: homePaths(daemonOptionsFrom(args, 'replay', 0).home),
    }),
  };
  let exitCode: number;
  let signal: string | undefined;
  try {
    const exit = await runChild(args.rest, env);
    exitCode = exitCodeOf(exit);
    signal = exit.signal ?? undefined;
  } catch (err) {
    await backend.end({}).catch(() => undefined);
    await backend.close();
    throw new UsageError(`replay: cannot start '${args.rest[0]}': ${(err as Error).message}`);
  }
  const ended = await backend.end({ exitCode, signal });
  await backend.close();
  if (ended.mode !== 'replay') throw new Error('expected a replay session');
  const { report } = ended;
  process.stderr.write(`mitm-replay: replay run ${report.runId} of trace ${report.trace}\n${report.line}\n`);
  if (jsonFile) writeFileSync(jsonFile, `${JSON.stringify(report, null, 2)}\n`);
  return replayExitCode(report.verdict);
}
