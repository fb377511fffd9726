/**
 * `export NAME --html FILE`: the trace viewer's page for one trace (timeline, every exchange, its replay
 * reports and compare runs) as one self-contained file. The API is asked for every path the page can ask
 * for; the answers are embedded, so the file needs no server and references nothing outside itself.
 */
import type { TraceReader } from '../trace/reader.js';
import type { RetentionPolicy } from '../trace/retention.js';
import type { TraceMeta } from '../trace/schema.js';
import { answerApi } from './api.js';
import { pageHtml } from './page.js';
import { TIMELINE_PAGE, ViewError, traceRows, type TraceOverview } from './views.js';
import type { ReplayReport } from '../replay/verdict.js';

export interface HtmlExport {
  html: string;
  meta: TraceMeta;
  exchanges: number;
  reports: number;
}

/** `runId` (or `last`) opens the file at that replay report instead of the trace. */
export async function exportHtml(reader: TraceReader, policy: RetentionPolicy, name: string, runId?: string): Promise<HtmlExport> {
  const meta = await reader.meta(name);
  if (!meta) throw new ViewError(`no trace named '${name}' (see 'mitm-replay ls')`);
  const data: Record<string, unknown> = {};
  const ask = async <T>(path: string): Promise<T> => {
    const answer = await answerApi(reader, policy, path);
    if (answer.status !== 200) throw new ViewError((answer.value as { error: string }).error, answer.status);
    data[path] = answer.value;
    return answer.value as T;
  };
  const trace = encodeURIComponent(meta.name);
  data.traces = await traceRows(reader, policy, meta.name);
  const overview = await ask<TraceOverview>(`traces/${trace}`);
  for (let offset = 0; offset < overview.exchanges || offset === 0; offset += TIMELINE_PAGE) await ask(`traces/${trace}/timeline?offset=${offset}&limit=${TIMELINE_PAGE}`);
  for (const record of await reader.records(meta.name)) {
    await ask(`traces/${trace}/exchanges/${record.seq}`);
    await ask(`traces/${trace}/exchanges/${record.seq}/raw`);
  }
  for (const { runId: run } of overview.reports) {
    const report = await ask<ReplayReport>(`traces/${trace}/reports/${encodeURIComponent(run)}`);
    for (const request of report.requests) {
      if (request.outcome !== 'exact') await ask(`traces/${trace}/reports/${encodeURIComponent(run)}/requests/${request.index}`);
    }
  }
  let route = `#/trace/${trace}`;
  if (runId !== undefined) {
    const report = runId === 'last' ? overview.reports.at(-1) : overview.reports.find((r) => r.runId === runId);
    if (!report) throw new ViewError(runId === 'last' ? `trace ${meta.name} has not been replayed yet` : `trace ${meta.name} has no replay run '${runId}'`);
    route += `/report/${encodeURIComponent(report.runId)}`;
  }
  const html = pageHtml({ mode: 'export', data, route, title: `mitm-replay: ${meta.name}` });
  return { html, meta, exchanges: overview.exchanges, reports: overview.reports.length };
}
