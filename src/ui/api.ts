/**
 * The trace viewer's JSON API: GET paths (relative to `…/ui/api/`) to view data. One implementation, whoever
 * holds the store: the daemon's listener, the small server of `mitm-replay ui`, and `export --html` (which
 * asks it for every path the page will ask for, and embeds the answers).
 */
import type { TraceReader } from '../trace/reader.js';
import type { RetentionPolicy } from '../trace/retention.js';
import { isValidTraceName } from '../trace/schema.js';
import { TIMELINE_PAGE, ViewError, exchangeDetail, exchangeRaw, reportView, requestComparison, timelinePage, traceOverview, traceRows } from './views.js';

export interface ApiAnswer {
  status: number;
  value: unknown;
}

function traceName(text: string): string {
  let name: string;
  try {
    name = decodeURIComponent(text);
  } catch {
    throw new ViewError('malformed trace name', 400);
  }
  if (name !== 'last' && !isValidTraceName(name)) throw new ViewError(`invalid trace name '${name.slice(0, 80)}'`, 400);
  return name;
}

function count(text: string | null, fallback: number, max: number): number {
  if (text === null) return fallback;
  if (!/^\d{1,9}$/.test(text) || Number(text) > max) throw new ViewError(`bad number '${text.slice(0, 20)}'`, 400);
  return Number(text);
}

/** `path` is e.g. `traces/NAME/timeline?offset=100&limit=100`. */
export async function answerApi(reader: TraceReader, policy: RetentionPolicy, path: string): Promise<ApiAnswer> {
  const [route = '', search = ''] = path.split('?', 2);
  const query = new URLSearchParams(search);
  const parts = route.split('/');
  try {
    if (route === 'traces') return { status: 200, value: await traceRows(reader, policy) };
    if (parts[0] !== 'traces' || parts.length < 2) throw new ViewError(`no such API path '${route.slice(0, 80)}'`);
    const name = traceName(parts[1]!);
    const [, , what, id, sub, subId, extra] = parts;
    if (what === undefined) return { status: 200, value: await traceOverview(reader, policy, name) };
    if (what === 'timeline' && id === undefined) {
      return { status: 200, value: await timelinePage(reader, name, count(query.get('offset'), 0, 1e9), count(query.get('limit'), TIMELINE_PAGE, 1000)) };
    }
    if (what === 'exchanges' && id !== undefined && /^\d{1,10}$/.test(id) && subId === undefined) {
      if (sub === undefined) return { status: 200, value: await exchangeDetail(reader, name, Number(id)) };
      if (sub === 'raw') return { status: 200, value: await exchangeRaw(reader, name, Number(id)) };
    }
    if (what === 'reports' && id !== undefined && /^[A-Za-z0-9._-]{1,80}$/.test(id)) {
      if (sub === undefined) return { status: 200, value: await reportView(reader, name, id) };
      if (sub === 'requests' && subId !== undefined && /^\d{1,9}$/.test(subId) && extra === undefined) {
        return { status: 200, value: await requestComparison(reader, name, id, Number(subId)) };
      }
    }
    throw new ViewError(`no such API path '${route.slice(0, 80)}'`);
  } catch (err) {
    if (err instanceof ViewError) return { status: err.status, value: { error: err.message } };
    throw err;
  }
}
