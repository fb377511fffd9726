import { writeFileSync } from 'node:fs';
import { UsageError, flag, has, parseArgs, type FlagSpec, type ParsedArgs } from './args.js';
import { DAEMON_FLAGS, DAEMON_FLAGS_HELP, daemonOptionsFrom } from './daemon-options.js';
import { connectDaemon, exitCodeOf, runChild, sessionEnvironment, type Backend, type DaemonAccess } from './launch.js';
import { REPLAY_WORKSPACE_FLAGS, REPLAY_WORKSPACE_HELP, prepareReplayWorkspace, removeSandbox, replayOutcome } from '../launch/run-workspace.js';
import type { TraceMeta } from '../trace/schema.js';
import { StoreFormatError } from '../trace/store.js';
import { DaemonError } from '../daemon.js';
import { DaemonClientError } from '../daemon-client.js';
import { InterceptListError, parseInterceptList } from '../proxy/intercept.js';
import { replayExitCode, type CompareTag, type ReplayReport } from '../replay/verdict.js';
import { repeatCount, tally, tallyLine } from '../replay/tally.js';
import { isValidTraceName } from '../trace/schema.js';

export const REPLAY_HELP = `usage: mitm-replay replay [NAME|last] [--diagnostic] [--json FILE] [--pace fast|recorded] [--allow-live HOSTS] [daemon options] -- CMD [ARGS...]

Runs CMD with the same environment 'record' sets, but answers its requests from trace NAME (default: last)
with no upstream connection at all. CMD runs in a fresh sandbox holding the workspace snapshot the
recording started from (your working tree is never touched). Prints the run ID and one verdict line:
  verdict: recorded=6 requests=6 reused=6 exact=6 reordered=0 diverged=0 missing=0 unused=0 egress=blocked child-exit=0 recorded-exit=0 files=same -> PASS
The traffic decides the ending; the outcome part (exit codes, files) is reported beside it.
Exit code: 0 on PASS; 1 on FAIL, or DIAGNOSTIC with anything diverged, missing or unused; 2 for its own
errors (no such trace, bad arguments). CMD's exit code does not decide it (both it and the recorded one
are in the report).

options:
  --diagnostic             serve the recorded response at a diverged request's position (labelled with
                           x-mitm-replay-divergence) instead of refusing it; the verdict is DIAGNOSTIC
  --json FILE              write the full report (JSON, schema in docs/replay-report.md) to FILE
  --repeat N               replay N times, each in its own sandbox, and print a tally
  --pace fast|recorded     send recorded stream chunks as fast as the client reads (default) or with the
                           recorded gaps
  --allow-live HOSTS       hosts (comma-separated, * patterns) that were tunnelled, not intercepted, and may
                           go live; every other connection is refused
  --no-base-url            do not set OPENAI_BASE_URL / ANTHROPIC_BASE_URL
${REPLAY_WORKSPACE_HELP}
${DAEMON_FLAGS_HELP.split('\n').filter((l) => !l.includes('--trace NAME')).join('\n')}
  --help                   this text`;

const { trace: _trace, ...DAEMON_FLAGS_WITHOUT_TRACE } = DAEMON_FLAGS;

export const REPLAY_FLAGS: Record<string, FlagSpec> = {
  ...DAEMON_FLAGS_WITHOUT_TRACE,
  diagnostic: {},
  json: { value: true },
  pace: { value: true },
  'allow-live': { value: true },
  'no-base-url': {},
  ...REPLAY_WORKSPACE_FLAGS,
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

/** Everything one replay run needs that does not change between runs (repeats, compare arms). */
export interface ReplayContext {
  args: ParsedArgs;
  access: DaemonAccess;
  meta: TraceMeta;
  options: ReplayFlags;
  home: string;
}

/**
 * One replay run: prepare its own workspace (sandbox), open a replay session, run the command, compare the
 * outcome, end the session. The report is stored with the trace.
 */
export async function replayOnce(ctx: ReplayContext, command: string[], compare?: CompareTag): Promise<ReplayReport> {
  const { args, access, meta, options, home } = ctx;
  const workspace = await prepareReplayWorkspace(args, meta, access.blobs, home);
  let backend: Backend;
  try {
    if (workspace.note) process.stderr.write(`mitm-replay: ${workspace.note}\n`);
    backend = await access.openSession({
      mode: 'replay',
      trace: meta.name,
      diagnostic: options.diagnostic,
      pace: options.pace,
      allowLive: options.allowLive,
      cwd: workspace.cwd,
      ownerPid: process.pid,
      keepsDaemonAlive: true,
    });
  } catch (err) {
    if (workspace.sandbox) removeSandbox(workspace.sandbox, workspace.sandboxPreexisted ?? false);
    if (err instanceof DaemonError || err instanceof DaemonClientError) throw new UsageError(`replay: ${err.message}`);
    throw err;
  }
  const env = sessionEnvironment(backend.session, home, !has(args, 'no-base-url'));
  let exit: { code: number | null; signal: NodeJS.Signals | null };
  try {
    exit = await runChild(command, env, workspace.cwd);
  } catch (err) {
    await backend.end({}).catch(() => undefined);
    if (workspace.sandbox) removeSandbox(workspace.sandbox, workspace.sandboxPreexisted ?? false);
    throw new UsageError(`replay: cannot start '${command[0]}': ${(err as Error).message}`);
  }
  const exitCode = exitCodeOf(exit);
  const outcome = await replayOutcome(workspace, meta, exitCode, access.blobs, has(args, 'keep'));
  const ended = await backend.end({ exitCode, signal: exit.signal ?? undefined, outcome, compare });
  if (ended.mode !== 'replay') throw new Error('expected a replay session');
  return ended.report;
}

/** Connects to the daemon and loads the trace; `run` gets the context; the daemon is released afterwards. */
export async function withReplayContext<T>(command: string, args: ParsedArgs, traceArg: string | undefined, run: (ctx: ReplayContext) => Promise<T>): Promise<T> {
  const options = replayFlags(command, args, traceArg);
  const home = daemonOptionsFrom(args, command, 0).home;
  let access: DaemonAccess;
  try {
    access = await connectDaemon(args, command);
  } catch (err) {
    if (err instanceof DaemonError || err instanceof DaemonClientError || err instanceof StoreFormatError) throw new UsageError(`${command}: ${err.message}`);
    throw err;
  }
  try {
    if (access.note) process.stderr.write(`mitm-replay: ${access.note}\n`);
    const meta = await access.getTrace(options.trace);
    if (!meta) throw new UsageError(`${command}: no trace named '${options.trace}' (record one with 'mitm-replay record -- CMD')`);
    return await run({ args, access, meta, options, home });
  } finally {
    await access.close();
  }
}

function printRun(report: ReplayReport): void {
  process.stderr.write(`mitm-replay: replay run ${report.runId} of trace ${report.trace}\n${report.line}\n`);
  if (report.outcome?.sandbox) process.stderr.write(`mitm-replay: sandbox kept at ${report.outcome.sandbox}\n`);
}

export async function runReplay(argv: string[]): Promise<number> {
  const args = parseArgs('replay', argv, { ...REPLAY_FLAGS, repeat: { value: true } });
  if (has(args, 'help')) {
    console.log(REPLAY_HELP);
    return 0;
  }
  if (args.positionals.length > 1) throw new UsageError(`replay: unexpected argument '${args.positionals[1]}': put the command after '--' (mitm-replay replay NAME -- CMD ARGS)`);
  if (!args.rest || args.rest.length === 0) throw new UsageError('replay: no command given; usage: mitm-replay replay [NAME|last] [options] -- CMD [ARGS...]');
  const command = args.rest;
  const repeat = repeatCount('replay', args);
  const jsonFile = flag(args, 'json');
  return withReplayContext('replay', args, args.positionals[0], async (ctx) => {
    const reports: ReplayReport[] = [];
    for (let i = 0; i < repeat; i++) {
      const report = await replayOnce(ctx, command);
      printRun(report);
      reports.push(report);
    }
    if (jsonFile) writeFileSync(jsonFile, `${JSON.stringify(repeat === 1 ? reports[0] : { runs: reports, tally: tally(reports) }, null, 2)}\n`);
    if (repeat > 1) process.stderr.write(`${tallyLine(tally(reports))}\n`);
    return reports.every((r) => replayExitCode(r.verdict) === 0) ? 0 : 1;
  });
}
