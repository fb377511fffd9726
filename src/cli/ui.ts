import { randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { UsageError, flag, has, parseArgs } from './args.js';
import { DaemonClient } from '../daemon-client.js';
import { homePaths, resolveHome } from '../home.js';
import { openTraceReader, type TraceReader } from '../trace/reader.js';
import { loadRetention } from '../trace/retention.js';
import { isValidTraceName } from '../trace/schema.js';
import { LeasedReader } from '../ui/leased-reader.js';
import { UiService, isLoopbackAddress, uiLoginUrl } from '../ui/server.js';

export const UI_HELP = `usage: mitm-replay ui [NAME|last] [--run ID|last] [--home DIR]

Prints the URL of the trace viewer: the traces (the columns of 'ls'), a trace as a timeline of its
exchanges (decoded requests and responses, SSE frames, model, token usage, tool calls, raw bytes), its replay
reports (each exchange exact / reordered / diverged / missing / unused, with a side-by-side JSON diff of a
diverged request) and its compare runs. NAME opens that trace, --run a replay report of it.

When a daemon runs for the home, it serves the viewer (under /__mitm-replay/ui/ on its loopback listener)
and this command prints the URL and exits. Otherwise this command serves it on an ephemeral loopback port
until Ctrl-C, opening the trace store only while the page reads it (so 'record' and 'ls' still work).
The URL carries the control token once: opening it signs the browser in (an HttpOnly cookie) and redirects
to a URL without it. Loopback only; nothing is fetched from elsewhere.

options:
  --run ID       open this replay run's report (last: the latest) of trace NAME
  --home DIR     the home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --help         this text`;

/** The trace (and report) to open exist: a wrong name is a one-line error, not a blank page. */
async function checkTarget(reader: TraceReader, trace: string | undefined, run: string | undefined): Promise<{ trace?: string; run?: string }> {
  if (trace === undefined) return {};
  const meta = await reader.meta(trace);
  if (!meta) throw new UsageError(`ui: no trace named '${trace}' (see 'mitm-replay ls')`);
  if (run === undefined) return { trace: meta.name };
  const reports = await reader.reports(meta.name);
  const report = run === 'last' ? reports.at(-1) : reports.find((r) => r.runId === run);
  if (!report) throw new UsageError(run === 'last' ? `ui: trace ${meta.name} has not been replayed yet` : `ui: trace ${meta.name} has no replay run '${run}' (see 'mitm-replay report ${meta.name}')`);
  return { trace: meta.name, run: report.runId };
}

/** The loopback address a browser on this machine uses for a daemon listening on `host`. */
function loopbackFor(host: string): string {
  if (isLoopbackAddress(host)) return host;
  if (host === '0.0.0.0') return '127.0.0.1';
  if (host === '::') return '::1';
  throw new UsageError(`ui: the daemon listens on ${host}, not on loopback; the trace viewer is served on loopback only`);
}

export async function runUi(argv: string[]): Promise<number> {
  const args = parseArgs('ui', argv, { run: { value: true }, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(UI_HELP);
    return 0;
  }
  const [trace, extra] = args.positionals;
  if (extra !== undefined) throw new UsageError(`ui: unexpected argument '${extra}' (see 'mitm-replay ui --help')`);
  if (trace !== undefined && trace !== 'last' && !isValidTraceName(trace)) throw new UsageError(`ui: invalid trace name '${trace}'`);
  const run = flag(args, 'run');
  if (run !== undefined && trace === undefined) throw new UsageError('ui: --run needs a trace name (mitm-replay ui NAME --run ID)');
  const home = resolveHome(flag(args, 'home'));
  const paths = homePaths(home);

  const client = await DaemonClient.find(paths.stateFile);
  if (client) {
    const reader = await openTraceReader(home);
    const target = await checkTarget(reader, trace, run).finally(() => reader.close());
    console.log(uiLoginUrl(loopbackFor(client.state.host), client.state.port, client.state.token, target.trace, target.run));
    const lifetime = client.state.ephemeral ? " (it was started by a running 'record' or 'replay' and stops with it)" : '';
    process.stderr.write(`mitm-replay: the daemon (pid ${client.state.pid}) serves the trace viewer${lifetime}; the URL signs one browser in\n`);
    return 0;
  }

  const reader = new LeasedReader(home);
  let server: http.Server | undefined;
  try {
    const target = await checkTarget(reader, trace, run);
    loadRetention(home); // a bad config.json is an error now, not on every page
    const token = randomBytes(24).toString('base64url');
    let port = 0;
    const ui = new UiService({ token, reader, policy: () => loadRetention(home), port: () => port });
    server = http.createServer((req, res) => {
      ui.handle({ method: req.method ?? 'GET', target: req.url ?? '/', header: (name) => req.headers[name] as string | undefined, remoteAddress: req.socket.remoteAddress })
        .then((answer) => {
          res.writeHead(answer.status, answer.headers);
          res.end(answer.body);
        })
        .catch((err: Error) => {
          res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' });
          res.end(`mitm-replay: ${err.message}\n`);
        });
    });
    const listening = server;
    await new Promise<void>((resolve, reject) => {
      listening.once('error', reject);
      listening.listen({ host: '127.0.0.1', port: 0 }, resolve);
    });
    port = (listening.address() as net.AddressInfo).port;
    console.log(uiLoginUrl('127.0.0.1', port, token, target.trace, target.run));
    process.stderr.write(`mitm-replay: serving the trace viewer on 127.0.0.1:${port} until Ctrl-C (no daemon runs for ${home}; the store is opened only while the page reads it)\n`);
    await new Promise<void>((resolve) => {
      const stop = () => resolve();
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    });
    return 0;
  } finally {
    server?.closeAllConnections();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    await reader.close();
  }
}
