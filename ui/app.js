// mitm-replay trace viewer: plain browser JavaScript, no framework, no build step (docs/decisions.md).
// Every value shown comes from a recorded trace and is untrusted: it is only ever set as text (textContent,
// attributes), never parsed as HTML. The same script runs served (asking the JSON API under ./api/) and in a
// file written by `export --html` (reading the API's answers embedded in the page; the CSP allows no fetch).
'use strict';
(() => {
  const EXPORTED = window.MITM_REPLAY_EXPORT || null;
  const DATA = EXPORTED ? JSON.parse(document.getElementById('mitm-replay-data').textContent) : null;
  const PAGE = 100; // exchanges per timeline page; the same as the API's and the export's

  async function api(path) {
    if (DATA) {
      if (Object.prototype.hasOwnProperty.call(DATA, path)) return DATA[path];
      throw new Error(`not included in this export (${path})`);
    }
    const response = await fetch(`api/${path}`, { credentials: 'same-origin', headers: { accept: 'application/json' } });
    const body = await response.json().catch(() => ({ error: response.statusText }));
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    return body;
  }

  // ---------------------------------------------------------------------------------------------------
  // DOM helpers (text only)

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'class') el.className = value;
      else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
      // CSSOM, not the style attribute: the CSP (no 'unsafe-inline') blocks inline style attributes
      else if (key === 'style') Object.assign(el.style, value);
      else el.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  const enc = encodeURIComponent;
  const utc = (ms) => (ms === null || ms === undefined ? '-' : new Date(ms).toISOString().slice(0, 19).replace('T', ' '));
  const utcMinutes = (ms) => new Date(ms).toISOString().slice(0, 16).replace('T', ' ');
  function bytes(n) {
    if (n < 1024) return `${n} B`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
    return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  }
  const ms = (n) => (n === null || n === undefined ? '-' : `${Math.round(n)} ms`);
  const badge = (text, kind) => h('span', { class: `badge badge-${kind || text.toLowerCase()}` }, text);
  function link(href, ...children) {
    return h('a', { href }, ...children);
  }
  function section(title, ...children) {
    return h('section', { class: 'panel' }, h('h2', null, title), ...children);
  }
  function errorBox(err) {
    return h('div', { class: 'error', role: 'alert' }, String(err && err.message ? err.message : err));
  }

  /** Replaces an element's children; null, undefined and false are left out (as in h). */
  function fill(target, ...children) {
    target.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  }

  const app = document.getElementById('app');
  function show(...children) {
    fill(app, ...children);
  }

  function header(...crumbs) {
    return h(
      'header',
      { class: 'top' },
      h('span', { class: 'brand' }, 'mitm-replay'),
      crumbs.map((c) => [h('span', { class: 'sep' }, '/'), c]),
      EXPORTED ? h('span', { class: 'note' }, 'exported view (offline)') : null,
    );
  }

  // ---------------------------------------------------------------------------------------------------
  // Traces list

  function expiryText(row) {
    if (row.expiresAt === null) return 'never*';
    return row.expiresAt <= Date.now() ? `expired ${utcMinutes(row.expiresAt)}` : utcMinutes(row.expiresAt);
  }

  async function tracesView() {
    show(header(h('span', null, 'traces')), h('p', null, 'loading…'));
    const rows = await api('traces');
    const filter = h('input', { type: 'search', id: 'filter', placeholder: 'filter: name, command, tier, verdict…', 'aria-label': 'filter traces' });
    const columns = ['NAME', 'CREATED (UTC)', 'TIER', 'EXPIRES (UTC)', 'EXCHANGES', 'BYTES', 'COMMAND', 'EXIT', 'LAST VERDICT'];
    const body = h('tbody');
    const cells = (row) => [
      link(`#/trace/${enc(row.name)}`, row.name),
      utc(row.createdAt),
      row.tier,
      expiryText(row),
      String(row.exchanges),
      bytes(row.bytes),
      row.command === null ? `(${row.source})` : row.command,
      row.exitCode === null ? '-' : String(row.exitCode),
      row.broken ? badge('BROKEN', 'fail') : row.lastVerdict ? badge(row.lastVerdict) : '-',
    ];
    const render = () => {
      const words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
      const shown = rows.filter((row) => {
        const hay = [row.name, row.command || row.source, row.tier, row.lastVerdict || '', expiryText(row)].join(' ').toLowerCase();
        return words.every((w) => hay.includes(w));
      });
      fill(body, ...shown.map((row) => h('tr', { class: 'trace-row', 'data-trace': row.name }, cells(row).map((c, i) => h('td', { class: i === 6 ? 'command' : null }, c)))));
      count.textContent = `${shown.length} of ${rows.length} traces`;
    };
    const count = h('span', { class: 'count' });
    filter.addEventListener('input', render);
    render();
    const pinned = rows.some((r) => r.kept);
    show(
      header(h('span', null, 'traces')),
      section(
        'Traces',
        h('div', { class: 'toolbar' }, filter, count),
        rows.length === 0 ? h('p', null, "no traces yet (record one with 'mitm-replay record -- CMD')") : h('table', { class: 'grid', id: 'traces' }, h('thead', null, h('tr', null, columns.map((c) => h('th', null, c)))), body),
        pinned ? h('p', { class: 'warning' }, 'pinned full traces (never*) keep complete transcripts beyond the retention policy') : null,
      ),
    );
  }

  // ---------------------------------------------------------------------------------------------------
  // One trace: timeline, selected exchange, its replays and compare runs

  const KIND_NAMES = { model: 'model call', tool: 'tool call', tunnel: 'tunnel', error: 'error' };

  function legend() {
    return h(
      'div',
      { class: 'legend' },
      Object.entries(KIND_NAMES).map(([kind, name]) => h('span', null, h('i', { class: `swatch kind-${kind}` }), name)),
      h('span', null, h('i', { class: 'swatch tick-sample' }), 'streamed frame'),
      h('span', null, h('i', { class: 'swatch wait-sample' }), 'waiting for the first byte'),
    );
  }

  function niceStep(span) {
    const raw = span / 6;
    const pow = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1))));
    for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }

  function timeline(page, onSelect) {
    const entries = page.entries;
    const start = entries.length ? Math.min(...entries.map((e) => e.startMs)) : 0;
    const end = entries.length ? Math.max(...entries.map((e) => e.startMs + Math.max(e.endMs, 0))) : 1;
    const span = Math.max(end - start, 1);
    const pct = (t) => `${((t - start) / span) * 100}%`;
    const width = (d) => `${(Math.max(d, 0) / span) * 100}%`;
    const axis = h('div', { class: 'axis' });
    const step = niceStep(span);
    for (let t = 0; t <= span; t += step) axis.append(h('span', { class: 'axis-label', style: { left: `${(t / span) * 100}%` } }, t >= 1000 ? `${(t / 1000).toFixed(t % 1000 ? 1 : 0)} s` : `${t} ms`));
    const rows = entries.map((e) => {
      const bar = h('div', {
        class: `bar kind-${e.kind}`,
        style: { left: pct(e.startMs), width: width(e.endMs) },
        title: `#${e.seq} ${e.label}${e.status ? ` → ${e.status}` : ''}\nstart +${Math.round(e.startMs)} ms, first byte ${ms(e.responseHeadMs)}, end ${ms(e.endMs)}${e.frames.length ? `\n${e.frames.length} streamed frames` : ''}`,
      });
      if (e.responseHeadMs !== null && e.endMs > 0) bar.append(h('span', { class: 'wait', style: { width: `${(Math.min(e.responseHeadMs, e.endMs) / e.endMs) * 100}%` } }));
      for (const f of e.frames) bar.append(h('span', { class: 'tick', style: { left: `${e.endMs > 0 ? (Math.min(f, e.endMs) / e.endMs) * 100 : 0}%` } }));
      const meta = [
        e.status !== null ? String(e.status) : e.kind === 'error' ? 'failed' : '',
        e.model ? e.model : '',
        e.usage ? `${e.usage.input ?? '?'}→${e.usage.output ?? '?'} tok` : '',
        e.toolCalls.length ? `tools: ${e.toolCalls.join(', ')}` : '',
        e.frames.length ? `${e.frames.length} frames` : '',
      ].filter(Boolean);
      const row = h(
        'div',
        { class: 'tl-row', 'data-seq': e.seq, 'data-kind': e.kind, tabindex: 0, role: 'button', 'aria-label': `exchange ${e.seq}` },
        h('div', { class: 'tl-label' }, h('span', { class: 'seq' }, `#${e.seq}`), ' ', h('span', { class: 'what', title: e.url }, e.label), h('span', { class: 'tl-meta' }, meta.join(' · '))),
        h('div', { class: 'tl-track' }, bar),
      );
      const select = () => {
        for (const r of rows) r.classList.toggle('selected', r === row);
        onSelect(e.seq);
      };
      row.addEventListener('click', select);
      row.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter' || ev.key === ' ') {
          ev.preventDefault();
          select();
        }
      });
      return row;
    });
    return h('div', { class: 'timeline', id: 'timeline' }, h('div', { class: 'tl-row tl-axis-row' }, h('div', { class: 'tl-label' }, 'exchange'), h('div', { class: 'tl-track' }, axis)), rows);
  }

  function headBlock(title, head, highlight) {
    const lines = head.replace(/\r?\n$/, '').split(/\r?\n/);
    return h(
      'div',
      { class: 'block' },
      h('h4', null, title),
      h(
        'pre',
        { class: 'head' },
        lines.map((line, i) => {
          const diff = highlight ? highlight(line, i) : false;
          return h('div', { class: `line${diff ? ' diff' : ''}` }, line || ' ');
        }),
      ),
    );
  }

  function pathMatches(path, diffPaths) {
    for (const d of diffPaths) {
      if (d === '$' || path === d || path.startsWith(`${d}.`) || path.startsWith(`${d}[`)) return true;
    }
    return false;
  }

  /** A string value's line with the part from the first differing character marked. */
  function markedLine(line, offset) {
    if (offset === undefined || line.v === undefined) return line.text;
    const end = line.text.endsWith(',') ? line.text.length - 1 : line.text.length;
    let value;
    try {
      value = JSON.parse(line.text.slice(line.v, end));
    } catch {
      return line.text;
    }
    if (typeof value !== 'string' || offset > value.length) return line.text;
    const at = line.v + JSON.stringify(value.slice(0, offset)).length - 1;
    const differing = line.text.slice(at, end - 1);
    return [line.text.slice(0, at), h('mark', { class: differing ? null : 'insert', title: `differs from character ${offset}` }, differing), line.text.slice(end - 1)];
  }

  function bodyBlock(title, body, diffPaths, diffOffsets) {
    const notes = [];
    if (body.truncated) notes.push(`showing the first ${bytes(body.shown)} of ${bytes(body.bytes)}`);
    if (body.jsonTruncated) notes.push('JSON view cut after 20000 lines');
    let content;
    if (body.bytes === 0) content = h('p', { class: 'muted' }, '(empty body)');
    else if (body.json) {
      content = h(
        'pre',
        { class: 'json' },
        body.json.map((line) => {
          const diff = diffPaths && pathMatches(line.path, diffPaths);
          return h('div', { class: `json-line${diff ? ' diff' : ''}`, 'data-path': line.path }, diff && diffOffsets ? markedLine(line, diffOffsets.get(line.path)) : line.text);
        }),
      );
    } else if (body.encoding === 'base64') content = h('pre', { class: 'raw' }, `(${bytes(body.bytes)} of binary data, base64)\n${body.text}`);
    else content = h('pre', { class: 'text' }, body.text);
    return h('div', { class: 'block' }, h('h4', null, title, notes.length ? h('span', { class: 'muted body-note' }, ` (${notes.join('; ')})`) : null), content);
  }

  function visibleRaw(text) {
    return text.replace(/[\0-\x08\x0b-\x1f\x7f]/g, (c) => (c === '\r' ? '\\r' : `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`)).replace(/\n/g, '\\n\n');
  }

  async function exchangePanel(trace, seq, target) {
    fill(target, h('p', null, 'loading…'));
    let detail;
    try {
      detail = await api(`traces/${enc(trace)}/exchanges/${seq}`);
    } catch (err) {
      fill(target, errorBox(err));
      return;
    }
    const r = detail.record;
    const facts = [
      ['kind', KIND_NAMES[detail.kind]],
      ['state', r.state],
      ['route', r.route],
      ['started', utc(r.startedAt)],
      ['request sent', ms(r.timings.requestEndMs)],
      ['first byte', ms(r.timings.responseHeadMs)],
      ['end', ms(r.timings.endMs ?? (r.tunnel ? r.tunnel.durationMs : null))],
    ];
    if (r.tunnel) facts.push(['bytes up', bytes(r.tunnel.bytesUp)], ['bytes down', bytes(r.tunnel.bytesDown)]);
    if (r.error) facts.push(['error', `${r.error.code} (${r.error.phase}): ${r.error.message}`]);
    if (r.request && r.request.flags.length) facts.push(['request flags', r.request.flags.join(', ')]);
    if (r.response && r.response.flags.length) facts.push(['response flags', r.response.flags.join(', ')]);
    if (r.redactions.length) facts.push(['redacted', r.redactions.map((f) => `${f.rule} at ${f.where}`).join(', ')]);
    const model =
      detail.model || detail.usage || detail.toolCalls.length
        ? h(
            'div',
            { class: 'model-box', id: 'model-box' },
            detail.model ? h('span', null, 'model ', h('b', null, detail.model)) : null,
            detail.usage ? h('span', { class: 'usage' }, 'tokens ', h('b', null, `${detail.usage.input ?? '?'} in`), ' / ', h('b', null, `${detail.usage.output ?? '?'} out`)) : null,
            detail.toolCalls.length ? h('span', { class: 'tools' }, 'tool calls ', detail.toolCalls.map((t) => h('code', { class: 'tool-call' }, t))) : null,
          )
        : null;
    const decoded = h('div', { class: 'decoded' });
    if (detail.request) decoded.append(h('div', { class: 'message' }, headBlock('request head', detail.request.head), bodyBlock('request body (decoded)', detail.request.body)));
    if (detail.response) {
      const response = h('div', { class: 'message' }, headBlock('response head', detail.response.head));
      if (detail.frames.length) {
        response.append(
          h(
            'div',
            { class: 'block' },
            h('h4', null, `${detail.frames.length} SSE frames`),
            h(
              'table',
              { class: 'grid frames', id: 'frames' },
              h('thead', null, h('tr', null, ['#', 'at', 'byte offset', 'frame'].map((c) => h('th', null, c)))),
              h('tbody', null, detail.frames.map((f) => h('tr', { class: 'frame' }, h('td', null, String(f.index)), h('td', null, ms(f.offsetMs)), h('td', null, f.byteOffset < 0 ? '-' : String(f.byteOffset)), h('td', null, h('pre', null, f.text))))),
            ),
          ),
        );
      } else response.append(bodyBlock('response body (decoded)', detail.response.body));
      decoded.append(response);
    } else if (r.kind === 'http') decoded.append(h('p', { class: 'muted' }, `(no response${r.error ? `: ${r.error.code}` : ''})`));
    const raw = h('div', { class: 'raw-view', hidden: true });
    let rawLoaded = false;
    const toggle = h('button', { type: 'button', id: 'raw-toggle', 'aria-pressed': 'false' }, 'raw bytes');
    toggle.addEventListener('click', async () => {
      const showRaw = raw.hidden;
      raw.hidden = !showRaw;
      decoded.hidden = showRaw;
      toggle.setAttribute('aria-pressed', String(showRaw));
      toggle.textContent = showRaw ? 'decoded' : 'raw bytes';
      if (showRaw && !rawLoaded) {
        rawLoaded = true;
        fill(raw, h('p', null, 'loading…'));
        try {
          const { parts } = await api(`traces/${enc(trace)}/exchanges/${seq}/raw`);
          fill(raw, 
            ...parts.map((p) =>
              h('div', { class: 'block' }, h('h4', null, `${p.name}: ${bytes(p.bytes)}${p.truncated ? ' (truncated)' : ''}`), h('pre', { class: 'raw' }, p.bytes ? visibleRaw(p.text) : '(empty)')),
            ),
          );
        } catch (err) {
          fill(raw, errorBox(err));
        }
      }
    });
    fill(target, 
      h('h3', null, `#${r.seq} `, r.request ? `${r.request.method} ` : '', detail.url, r.response ? ` → ${r.response.status}` : ''),
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', null, k), h('dd', null, v)])),
      model,
      r.kind === 'http' ? h('div', { class: 'toolbar' }, toggle) : null,
      decoded,
      raw,
    );
  }

  function comparesTable(groups) {
    return groups.map((g) => {
      const row = (arm, t) =>
        h(
          'tr',
          { class: `arm arm-${arm}` },
          h('td', null, arm),
          h('td', null, String(t.runs)),
          h('td', null, `${t.passed}/${t.runs}`),
          h('td', null, `${t.askedUnrecorded}/${t.runs}`),
          h('td', null, `${t.reproduced}/${t.runs}`),
          h('td', null, t.outcomes.map(([key, n]) => `${n}/${t.runs} ${key}`).join(', ')),
        );
      return h(
        'div',
        { class: 'compare', 'data-compare': g.id },
        h('h4', null, `compare ${g.id}, ${utc(g.finishedAt)}`),
        h(
          'table',
          { class: 'grid' },
          h('thead', null, h('tr', null, ['arm', 'runs', 'traffic PASS', 'asked unrecorded', 'reproduced recording', 'outcomes'].map((c) => h('th', null, c)))),
          h('tbody', null, row('control', g.result.control), row('patched', g.result.patched)),
        ),
        h('p', { class: `reading reading-${g.result.reading === null ? 'mixed' : g.result.reading}` }, `reading ${g.result.reading === null ? '(none)' : g.result.reading}: ${g.result.sentence}`),
        h('p', { class: 'muted' }, 'runs: ', g.runs.map((r, i) => [i ? ', ' : '', link(`#/trace/${enc(trace)}/report/${enc(r.runId)}`, `${r.arm} ${r.runId}`)])),
      );
    });
  }
  let trace = '';

  async function traceView(name) {
    show(header(link('#/', 'traces'), h('span', null, name)), h('p', null, 'loading…'));
    const overview = await api(`traces/${enc(name)}`);
    trace = overview.meta.name;
    const meta = overview.meta;
    const detail = h('div', { class: 'exchange', id: 'exchange' }, h('p', { class: 'muted' }, 'select an exchange on the timeline'));
    const timelineHolder = h('div');
    const pager = h('div', { class: 'toolbar pager' });
    let offset = 0;
    const loadPage = async () => {
      fill(timelineHolder, h('p', null, 'loading…'));
      try {
        const page = await api(`traces/${enc(trace)}/timeline?offset=${offset}&limit=${PAGE}`);
        const last = Math.min(offset + PAGE, page.total);
        const prev = h('button', { type: 'button', disabled: offset === 0 }, '← earlier');
        const next = h('button', { type: 'button', disabled: last >= page.total }, 'later →');
        prev.addEventListener('click', () => ((offset = Math.max(0, offset - PAGE)), loadPage()));
        next.addEventListener('click', () => ((offset += PAGE), loadPage()));
        fill(pager, prev, h('span', { class: 'count', id: 'page-count' }, page.total ? `exchanges ${offset + 1}–${last} of ${page.total}` : 'no exchanges'), next);
        fill(timelineHolder, timeline(page, (seq) => exchangePanel(trace, seq, detail)));
      } catch (err) {
        fill(timelineHolder, errorBox(err));
      }
    };
    const expiry = overview.expiresAt === null ? 'never (pinned)' : `${overview.expiresAt <= Date.now() ? 'expired ' : ''}${utcMinutes(overview.expiresAt)} UTC`;
    const facts = [
      ['created', `${utc(meta.createdAt)} UTC`],
      ['finished', meta.finishedAt ? `${utc(meta.finishedAt)} UTC` : '-'],
      ['tier', meta.tier || 'full'],
      ['expires', expiry],
      ['source', meta.source],
      ['command', meta.command ? meta.command.join(' ') : '-'],
      ['cwd', meta.cwd || '-'],
      ['exit code', meta.exitCode === undefined ? '-' : String(meta.exitCode)],
      ['exchanges', String(overview.exchanges)],
    ];
    if (meta.workspace) facts.push(['workspace', `${meta.workspace.files} files, ${bytes(meta.workspace.bytes)}${meta.workspace.diff ? `; the run changed ${meta.workspace.diff.length}` : ''}`]);
    const reports = overview.reports.length
      ? h(
          'table',
          { class: 'grid', id: 'reports' },
          h('thead', null, h('tr', null, ['run', 'finished (UTC)', 'ending', 'verdict'].map((c) => h('th', null, c)))),
          h(
            'tbody',
            null,
            overview.reports
              .slice()
              .reverse()
              .map((r) => h('tr', null, h('td', null, link(`#/trace/${enc(trace)}/report/${enc(r.runId)}`, r.runId), r.compare ? h('span', { class: 'muted' }, ` (compare ${r.compare.arm})`) : null), h('td', null, utc(r.finishedAt)), h('td', null, badge(r.ending)), h('td', { class: 'line' }, r.line))),
          ),
        )
      : h('p', { class: 'muted' }, `not replayed yet (mitm-replay replay ${trace} -- CMD)`);
    show(
      header(link('#/', 'traces'), h('span', null, trace)),
      section(`Trace ${trace}`, h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', null, k), h('dd', null, v)]))),
      section('Timeline', legend(), pager, timelineHolder),
      section('Exchange', detail),
      section('Replays', reports),
      overview.compares.length ? section('Compare runs (control vs patched)', h('div', { id: 'compares' }, comparesTable(overview.compares))) : null,
    );
    await loadPage();
  }

  // ---------------------------------------------------------------------------------------------------
  // A replay report, and one request's side-by-side diff

  const VERDICT_KEYS = ['recorded', 'requests', 'reused', 'exact', 'reordered', 'diverged', 'missing', 'unused'];

  function outcomeOf(r) {
    if (r.outcome === 'exact') return r.reordered ? 'reordered' : 'exact';
    return r.outcome;
  }

  function unifiedDiff(text) {
    return h(
      'pre',
      { class: 'udiff' },
      text
        .replace(/\n$/, '')
        .split('\n')
        .map((line) => h('div', { class: line.startsWith('+') && !line.startsWith('+++') ? 'add' : line.startsWith('-') && !line.startsWith('---') ? 'del' : line.startsWith('@@') ? 'hunk' : '' }, line || ' ')),
    );
  }

  function labels(list) {
    return list && list.length ? h('span', { class: 'labels' }, list.map((l) => h('span', { class: 'label' }, l))) : null;
  }

  async function requestPanel(name, runId, index, target) {
    fill(target, h('p', null, 'loading…'));
    let cmp;
    try {
      cmp = await api(`traces/${enc(name)}/reports/${enc(runId)}/requests/${index}`);
    } catch (err) {
      fill(target, errorBox(err));
      return;
    }
    const d = cmp.divergence;
    const diffPaths = d ? d.json.map((j) => j.path) : [];
    const diffOffsets = new Map(d ? d.json.filter((j) => j.offset !== undefined).map((j) => [j.path, j.offset]) : []);
    const diffHeaders = new Set(d ? d.headers.map((x) => x.name.toLowerCase()) : []);
    const headHighlight = (line, i) => {
      if (i === 0) return Boolean(d && d.requestLine);
      const colon = line.indexOf(':');
      return colon > 0 && diffHeaders.has(line.slice(0, colon).trim().toLowerCase());
    };
    const side = (title, message) =>
      h(
        'div',
        { class: 'side' },
        h('h3', null, title),
        message ? [headBlock('head', message.head, headHighlight), bodyBlock('body (decoded)', message.body, diffPaths, diffOffsets)] : h('p', { class: 'muted' }, title.startsWith('recorded') ? '(no recording to compare with: the endpoint had no unused recording left)' : '(this report was written before reports kept the replayed request)'),
      );
    const r = cmp.request;
    fill(target, 
      h('h3', null, `#${r.index} ${r.endpoint} [${r.position}]: `, badge(outcomeOf(r)), r.divergenceId ? ` ${r.divergenceId}` : ''),
      d ? h('p', { class: 'summary' }, d.summary, ' ', labels(d.labels)) : h('p', { class: 'muted' }, r.outcome === 'missing' ? 'no unused recording of this endpoint was left: the agent asked more than was recorded' : 'matched exactly'),
      d && d.requestLine ? h('p', null, 'request line: ', h('code', { class: 'rec' }, d.requestLine.recorded), ' vs ', h('code', { class: 'rep' }, d.requestLine.replayed)) : null,
      d && d.headers.length
        ? h(
            'table',
            { class: 'grid', id: 'header-diffs' },
            h('thead', null, h('tr', null, ['header', 'recorded', 'replayed', 'likely cause'].map((c) => h('th', null, c)))),
            h('tbody', null, d.headers.map((x) => h('tr', null, h('td', null, x.name), h('td', null, x.recorded ?? '(absent)'), h('td', null, x.replayed ?? '(absent)'), h('td', null, labels(x.labels))))),
          )
        : null,
      d && d.json.length
        ? h(
            'table',
            { class: 'grid', id: 'json-diffs' },
            h('thead', null, h('tr', null, ['JSON path', 'recorded', 'replayed', 'offset', 'likely cause'].map((c) => h('th', null, c)))),
            h(
              'tbody',
              null,
              d.json.map((j) => {
                const jump = h('a', { href: '#', class: 'path' }, j.path);
                jump.addEventListener('click', (ev) => {
                  ev.preventDefault();
                  const line = target.querySelector(`.json-line.diff[data-path="${CSS.escape(j.path)}"]`);
                  if (line) line.scrollIntoView({ block: 'center' });
                });
                return h('tr', { 'data-path': j.path }, h('td', null, jump), h('td', null, j.recorded), h('td', null, j.replayed), h('td', null, j.offset === undefined ? '-' : String(j.offset)), h('td', null, labels(j.labels)));
              }),
            ),
          )
        : null,
      d && d.jsonTruncated ? h('p', { class: 'muted' }, 'more than 50 JSON differences: the first 50 are listed') : null,
      d ? h('p', { class: 'muted' }, `first different byte: head ${d.head.firstDifferentByte ?? '-'}, body ${d.body.firstDifferentByte ?? '-'} (decoded); different bytes: head ${d.head.differentBytes}, body ${d.body.differentBytes}`) : null,
      h('div', { class: 'side-by-side', id: 'side-by-side' }, side(cmp.recorded ? `recorded #${cmp.recorded.seq}` : 'recorded', cmp.recorded), side('replayed', cmp.replayed)),
    );
  }

  async function reportView(name, runId, index) {
    show(header(link('#/', 'traces'), link(`#/trace/${enc(name)}`, name), h('span', null, runId)), h('p', null, 'loading…'));
    const report = await api(`traces/${enc(name)}/reports/${enc(runId)}`);
    const v = report.verdict;
    const numbers = h(
      'div',
      { class: 'verdict', id: 'verdict' },
      VERDICT_KEYS.map((k) => h('div', { class: `num num-${k}${(k === 'diverged' || k === 'missing' || k === 'unused') && v[k] > 0 ? ' bad' : ''}`, 'data-key': k }, h('b', null, String(v[k])), h('span', null, k))),
      h('div', { class: 'num ending' }, badge(v.ending)),
    );
    const o = report.outcome;
    const child = report.child;
    const outcome = h(
      'div',
      { id: 'outcome' },
      h(
        'dl',
        { class: 'facts' },
        [
          ['child exit', `${child.exitCode ?? '-'}${child.signal ? ` (${child.signal})` : ''}`],
          ['recorded exit', String(child.recordedExitCode ?? '-')],
          ['files', o ? o.files : '-'],
          ['workspace', o ? o.workspace : '-'],
          ['egress', v.egress],
          ['mode', `${report.mode}, pace ${report.pace}`],
        ].map(([k, val]) => [h('dt', null, k), h('dd', null, val)]),
      ),
      o && o.differences.length
        ? o.differences.map((f) => h('div', { class: 'file-diff' }, h('h4', null, `${f.path}: recorded ${f.recorded}, replayed ${f.replayed}`), f.unifiedDiff ? unifiedDiff(f.unifiedDiff) : null))
        : h('p', { class: 'muted' }, o ? 'the workspace ended as recorded' : 'no workspace outcome in this report'),
    );
    const panel = h('div', { class: 'request-diff', id: 'request-diff' }, h('p', { class: 'muted' }, 'select a diverged or missing exchange to compare recorded and replayed requests'));
    const open = (i) => {
      for (const tr of table.querySelectorAll('tr.req')) tr.classList.toggle('selected', tr.dataset.index === String(i));
      return requestPanel(name, report.runId, i, panel);
    };
    const rows = report.requests.map((r) => {
      const kind = outcomeOf(r);
      const row = h(
        'tr',
        { class: `req outcome-${kind}`, 'data-index': r.index, 'data-outcome': kind },
        h('td', null, `#${r.index}`),
        h('td', null, r.endpoint),
        h('td', null, String(r.position)),
        h('td', null, badge(kind)),
        h('td', null, r.recordedSeq === null ? '-' : link(`#/trace/${enc(name)}`, `#${r.recordedSeq}`)),
        h('td', { class: 'line' }, r.divergence ? [r.divergenceId, ': ', r.divergence.summary] : r.reordered ? `recorded position ${r.recordedPosition}` : ''),
      );
      if (kind === 'diverged' || kind === 'missing') {
        row.classList.add('clickable');
        row.addEventListener('click', () => {
          location.hash = `#/trace/${enc(name)}/report/${enc(report.runId)}/request/${r.index}`;
        });
      }
      return row;
    });
    const unused = report.unused.map((u) => h('tr', { class: 'req outcome-unused', 'data-outcome': 'unused' }, h('td', null, '-'), h('td', null, u.endpoint), h('td', null, String(u.position)), h('td', null, badge('unused')), h('td', null, `#${u.seq}`), h('td', null, 'recorded, never asked for')));
    const table = h(
      'table',
      { class: 'grid', id: 'requests' },
      h('thead', null, h('tr', null, ['#', 'endpoint', 'position', 'outcome', 'recorded', 'why'].map((c) => h('th', null, c)))),
      h('tbody', null, rows, unused),
    );
    show(
      header(link('#/', 'traces'), link(`#/trace/${enc(name)}`, name), h('span', null, report.runId)),
      section(`Replay ${report.runId} of ${report.trace}`, numbers, h('p', { class: 'line' }, report.line)),
      section('Outcome', outcome),
      section('Exchanges', table, report.tunnels.length ? h('p', { class: 'muted' }, report.tunnels.map((t) => `tunnel ${t.host}:${t.port} ${t.allowed ? 'let through live' : 'refused'}`).join('; ')) : null),
      section('Recorded vs replayed request', panel),
    );
    if (index !== null) {
      await open(index);
      panel.scrollIntoView({ block: 'start' });
    }
  }

  // ---------------------------------------------------------------------------------------------------
  // Routing: #/ (traces), #/trace/NAME, #/trace/NAME/report/RUN[/request/N]

  async function route() {
    delete document.body.dataset.ready;
    const hash = location.hash.replace(/^#/, '');
    if ((!hash || hash === '/') && EXPORTED) {
      location.replace(EXPORTED.route);
      return;
    }
    const parts = hash.split('/').filter(Boolean).map(decodeURIComponent);
    try {
      if (parts[0] === 'trace' && parts[1] && parts.length === 2) await traceView(parts[1]);
      else if (parts[0] === 'trace' && parts[1] && parts[2] === 'report' && parts[3] && parts.length === 4) await reportView(parts[1], parts[3], null);
      else if (parts[0] === 'trace' && parts[1] && parts[2] === 'report' && parts[3] && parts[4] === 'request' && /^\d+$/.test(parts[5] || '')) await reportView(parts[1], parts[3], Number(parts[5]));
      else await tracesView();
    } catch (err) {
      show(header(link('#/', 'traces')), errorBox(err));
    }
    document.body.dataset.ready = hash || '/';
  }

  window.addEventListener('hashchange', route);
  route();
})();
