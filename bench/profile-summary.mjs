/**
 * Summarises a .cpuprofile (V8 / `node --cpu-prof` / inspector format): top functions by self time, top
 * project (dist/) functions by inclusive time, and self time per file. Usable on its own:
 *   node bench/profile-summary.mjs bench/profiles/keep-alive.cpuprofile [topN]
 */
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

function shortUrl(url) {
  if (!url) return '';
  const dist = url.indexOf('/dist/');
  if (dist >= 0) return url.slice(dist + 1);
  const nm = url.lastIndexOf('/node_modules/');
  if (nm >= 0) return url.slice(nm + 1);
  return url.replace(/^file:\/\//, '');
}

function frameKey(frame) {
  const name = frame.functionName || '(anonymous)';
  const url = shortUrl(frame.url);
  return url ? `${name} ${url}:${frame.lineNumber + 1}` : name;
}

export function summarizeProfile(profile, topN = 15) {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const selfUs = new Map(); // node id → µs
  const { samples = [], timeDeltas = [] } = profile;
  for (let i = 0; i < samples.length; i++) {
    // timeDeltas[i] is the time before sample i; attribute the following interval to sample i
    const dt = timeDeltas[i + 1] ?? 0;
    selfUs.set(samples[i], (selfUs.get(samples[i]) ?? 0) + Math.max(0, dt));
  }
  const parent = new Map();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);

  let total = 0;
  let idle = 0;
  const self = new Map();
  const files = new Map();
  for (const [id, us] of selfUs) {
    const node = byId.get(id);
    const key = frameKey(node.callFrame);
    if (node.callFrame.functionName === '(idle)') {
      idle += us;
      continue;
    }
    total += us;
    self.set(key, (self.get(key) ?? 0) + us);
    const file = shortUrl(node.callFrame.url) || node.callFrame.functionName || '(native)';
    files.set(file, (files.get(file) ?? 0) + us);
  }

  // Inclusive time for project code: each sample counts once per distinct function on its stack.
  const inclusive = new Map();
  for (const [id, us] of selfUs) {
    if (byId.get(id).callFrame.functionName === '(idle)') continue;
    const seen = new Set();
    for (let cur = id; cur !== undefined; cur = parent.get(cur)) {
      const frame = byId.get(cur).callFrame;
      if (!frame.url.includes('/dist/')) continue;
      const key = frameKey(frame);
      if (seen.has(key)) continue;
      seen.add(key);
      inclusive.set(key, (inclusive.get(key) ?? 0) + us);
    }
  }

  const top = (map) =>
    [...map.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, topN)
      .map(([key, us]) => ({ key, ms: us / 1000, pct: total > 0 ? (100 * us) / total : 0 }));
  return { busyMs: total / 1000, idleMs: idle / 1000, self: top(self), inclusive: top(inclusive), files: top(files) };
}

export function formatSummary(title, summary) {
  const lines = [`### ${title}: ${summary.busyMs.toFixed(0)} ms busy, ${summary.idleMs.toFixed(0)} ms idle`, '', 'Top self time:', ''];
  for (const row of summary.self) lines.push(`  ${row.pct.toFixed(1).padStart(5)}%  ${row.ms.toFixed(1).padStart(8)} ms  ${row.key}`);
  lines.push('', 'Self time by file:', '');
  for (const row of summary.files.slice(0, 10)) lines.push(`  ${row.pct.toFixed(1).padStart(5)}%  ${row.ms.toFixed(1).padStart(8)} ms  ${row.key}`);
  lines.push('', 'Project (dist/) functions, inclusive time:', '');
  for (const row of summary.inclusive) lines.push(`  ${row.pct.toFixed(1).padStart(5)}%  ${row.ms.toFixed(1).padStart(8)} ms  ${row.key}`);
  return lines.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const file = process.argv[2];
  if (!file) {
    console.error('usage: node bench/profile-summary.mjs FILE.cpuprofile [topN]');
    process.exit(2);
  }
  const summary = summarizeProfile(JSON.parse(readFileSync(file, 'utf8')), Number(process.argv[3] ?? 15));
  console.log(formatSummary(file, summary));
}
