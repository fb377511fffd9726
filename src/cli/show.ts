import { UsageError, flag, has, parseArgs } from './args.js';
import { resolveHome } from '../home.js';
import { inspectExchange } from '../trace/inspect.js';
import { openTraceReader, type TraceReader } from '../trace/reader.js';
import { isValidTraceName, type ExchangeRecord, type StoredExchange } from '../trace/schema.js';

export const SHOW_HELP = `usage: mitm-replay show NAME|last [--exchange N] [--raw] [--json] [--home DIR]

Lists a trace's exchanges: seq, method, origin and path, status, request/response bytes, duration, streamed
frames, model and token usage where the body says so, and the tools a response calls.
  --exchange N   print exchange N decoded: heads, JSON pretty-printed, SSE frames one per line,
                 compressed bodies decoded
  --raw          print the stored bytes (of exchange N, or of every exchange)
  --json         the records (or, with --exchange, the record and decoded bodies) as JSON
  --home DIR     the home (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --help         this text`;

function originPath(r: ExchangeRecord): string {
  const { scheme, host, port } = r.origin;
  const defaultPort = (scheme === 'https' && port === 443) || (scheme === 'http' && port === 80);
  return `${scheme}://${host}${defaultPort ? '' : `:${port}`}${r.request?.target.split('?')[0] ?? ''}`;
}

async function exchangeLine(reader: TraceReader, trace: string, r: ExchangeRecord): Promise<string> {
  if (r.kind === 'tunnel') return `#${r.seq}  TUNNEL ${r.origin.host}:${r.origin.port}  up ${r.tunnel?.bytesUp ?? 0} B  down ${r.tunnel?.bytesDown ?? 0} B  ${Math.round(r.tunnel?.durationMs ?? 0)} ms (not decrypted)`;
  if (r.kind === 'error') return `#${r.seq}  ERROR ${r.origin.host}:${r.origin.port}  ${r.error?.code}: ${r.error?.message}`;
  const parts = [
    `#${r.seq}`,
    `${r.request?.method ?? '?'} ${originPath(r)}`,
    r.response ? String(r.response.status) : r.error ? `failed (${r.error.code})` : 'no response',
    `req ${(r.request?.headLength ?? 0) + (r.request?.bodyLength ?? 0)} B`,
    `resp ${(r.response?.headLength ?? 0) + (r.response?.bodyLength ?? 0)} B`,
    `${Math.round(r.timings.endMs ?? 0)} ms`,
  ];
  if (r.state !== 'complete') parts.push(r.state);
  const ex = await reader.exchange(trace, r.seq);
  if (ex && r.response) {
    const insight = inspectExchange(ex);
    if (insight.frames.length > 0) parts.push(`${insight.frames.length} frames`);
    if (insight.model) parts.push(`model ${insight.model}`);
    if (insight.usage) parts.push(`tokens ${insight.usage.input ?? '?'} in / ${insight.usage.output ?? '?'} out`);
    if (insight.toolCalls.length > 0) parts.push(`tools: ${insight.toolCalls.join(', ')}`);
  }
  return parts.join('  ');
}

function prettyBody(body: Buffer, frames: string[]): string {
  if (frames.length > 0) return frames.map((f) => f.replace(/\r?\n/g, ' | ')).join('\n');
  const text = body.toString('utf8');
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return /[\0-\x08\x0e-\x1f]/.test(text) ? `(${body.length} bytes of binary data; --raw prints them)` : text;
  }
}

function decodedView(ex: StoredExchange): string {
  const insight = inspectExchange(ex);
  const head = (b: Buffer) => b.toString('latin1').trimEnd();
  const lines = [head(ex.requestHead), '', prettyBody(insight.requestBody, []), '', '---', ''];
  if (ex.responseHead.length > 0) lines.push(head(ex.responseHead), '', prettyBody(insight.responseBody, insight.frames));
  else lines.push(`(no response: ${ex.record.error?.code ?? 'unknown'} ${ex.record.error?.message ?? ''})`);
  if (ex.record.redactions.length > 0) lines.push('', `redacted: ${ex.record.redactions.map((f) => `${f.rule} at ${f.where}`).join(', ')}`);
  return lines.join('\n');
}

export async function runShow(argv: string[]): Promise<number> {
  const args = parseArgs('show', argv, { exchange: { value: true }, raw: {}, json: {}, home: { value: true }, help: {} });
  if (has(args, 'help')) {
    console.log(SHOW_HELP);
    return 0;
  }
  const [trace, extra] = args.positionals;
  if (!trace || extra !== undefined) throw new UsageError("show: give one trace name (or last); see 'mitm-replay show --help'");
  if (trace !== 'last' && !isValidTraceName(trace)) throw new UsageError(`show: invalid trace name '${trace}'`);
  const seqText = flag(args, 'exchange');
  if (seqText !== undefined && !/^\d+$/.test(seqText)) throw new UsageError(`show: --exchange takes an exchange number (the # column), not '${seqText}'`);
  const reader = await openTraceReader(resolveHome(flag(args, 'home')));
  try {
    const meta = await reader.meta(trace);
    if (!meta) throw new UsageError(`show: no trace named '${trace}' (see 'mitm-replay ls')`);
    const records = await reader.records(meta.name);
    const selected = seqText === undefined ? records : records.filter((r) => r.seq === Number(seqText));
    if (seqText !== undefined && selected.length === 0) throw new UsageError(`show: trace ${meta.name} has no exchange #${seqText} (it has ${records.length})`);
    if (has(args, 'raw')) {
      for (const r of selected) {
        const ex = await reader.exchange(meta.name, r.seq);
        if (ex) process.stdout.write(Buffer.concat([ex.requestHead, ex.requestBody, ex.responseHead, ex.responseBody]));
      }
      return 0;
    }
    if (seqText !== undefined) {
      const ex = (await reader.exchange(meta.name, Number(seqText)))!;
      if (has(args, 'json')) {
        const insight = inspectExchange(ex);
        console.log(JSON.stringify({ record: ex.record, request: insight.requestBody.toString('utf8'), response: insight.responseBody.toString('utf8'), frames: insight.frames }, null, 2));
      } else console.log(decodedView(ex));
      return 0;
    }
    if (has(args, 'json')) {
      console.log(JSON.stringify({ meta, exchanges: records }, null, 2));
      return 0;
    }
    console.log(`trace ${meta.name}: ${records.length} records, created ${new Date(meta.createdAt).toISOString()}${meta.command ? `, command ${meta.command.join(' ')}` : ''}${meta.exitCode === undefined ? '' : `, exit ${meta.exitCode}`}`);
    for (const r of records) console.log(await exchangeLine(reader, meta.name, r));
    return 0;
  } finally {
    await reader.close();
  }
}
