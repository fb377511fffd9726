/**
 * The trace viewer end to end: real recordings and replays (the CLI against the test upstream), served by
 * `mitm-replay ui` or by the daemon, rendered in headless Chromium (Debian's, driven by playwright-core).
 * The browser may reach loopback only: every other request is aborted and fails the test. Screenshots of
 * each view go to test-output/ui/ for a reviewer.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import type { ReplayReport } from '../src/replay/verdict.js';
import { useUpstreamFixture } from './helpers/cli-fixture.js';
import { BIN, CHROMIUM, ROOT, haveChromium, pythonWithHttpx, runCli, startCliDaemon } from './helpers/cli.js';

const fx = useUpstreamFixture('ui');
const agent = join(ROOT, 'test', 'fixtures', 'openai-agent.mjs');
const SHOTS = join(ROOT, 'test-output', 'ui');
const env = { OPENAI_API_KEY: 'sk-proj-uitest000000000000000000000000', OPENAI_BASE_URL: '', AGENT_OUT: 'answer.txt' };

let browser: Browser | null = null;
let home: string;
let runId: string;

beforeAll(async () => {
  if (!haveChromium()) return;
  mkdirSync(SHOTS, { recursive: true });
  home = fx.freshHome();
  const dir = mkdtempSync(join(fx.work, 'run-'));
  const rec = await runCli(['record', '--home', home, '--trace', 'viewed', ...fx.routing(), '--', process.execPath, agent], { cwd: dir, env });
  expect(rec.code, rec.stderr).toBe(0);
  // a changed prompt: the first request diverges at messages[0].content, and answer.txt is never written
  const json = join(fx.work, 'diverged.json');
  const rep = await runCli(['replay', 'viewed', '--home', home, '--json', json, ...fx.routing(), '--', process.execPath, agent], { cwd: dir, env: { ...env, AGENT_VARIANT: '!' } });
  expect(rep.code, rep.stderr).toBe(1);
  runId = (JSON.parse(readFileSync(json, 'utf8')) as ReplayReport).runId;
  const cmp = await runCli(['compare', 'viewed', '--home', home, '--control', `${process.execPath} ${agent}`, ...fx.routing(), '--', 'env', 'AGENT_VARIANT=?', process.execPath, agent], { cwd: dir, env });
  expect(cmp.stderr).toContain('reading 2: patched diverges from the recording at exchange 1');
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
}, 180_000);

afterAll(async () => {
  await browser?.close();
});

/** Console errors (a CSP violation is one) and uncaught exceptions of a context's pages. */
function watchErrors(context: BrowserContext): string[] {
  const errors: string[] = [];
  context.on('console', (message) => {
    if (message.type() === 'error') errors.push(message.text());
  });
  context.on('weberror', (error) => errors.push(String(error.error())));
  return errors;
}

/** A browser context that can reach loopback only; `offsite` collects anything else it tried. */
async function loopbackContext(): Promise<{ context: BrowserContext; offsite: string[]; errors: string[] }> {
  const context = await browser!.newContext({ viewport: { width: 1400, height: 1000 } });
  const errors = watchErrors(context);
  const offsite: string[] = [];
  await context.route('**/*', (route) => {
    const url = new URL(route.request().url());
    if (url.protocol === 'http:' && (url.hostname === '127.0.0.1' || url.hostname === '[::1]')) return route.continue();
    offsite.push(url.href);
    return route.abort();
  });
  return { context, offsite, errors };
}

async function ready(page: Page, hash: string): Promise<void> {
  await page.waitForFunction((h) => document.body.dataset.ready === h, hash, { timeout: 15_000 });
}

/** Runs `mitm-replay ui ARGS` and resolves with the URL it prints (it keeps serving until killed). */
async function serveUi(args: string[]): Promise<{ child: ChildProcess; url: string; stderr: () => string }> {
  const child = spawn(process.execPath, [BIN, 'ui', ...args], { env: { ...process.env, MITM_REPLAY_LOG_LEVEL: 'warn' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (c: Buffer) => {
      stdout += c.toString();
      const line = /^(http:\/\/\S+)\n/m.exec(stdout);
      if (line) resolve(line[1]!);
    });
    child.once('exit', (code) => reject(new Error(`ui exited (${code}) before printing a URL: ${stderr}`)));
  });
  return { child, url, stderr: () => stderr };
}

function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get(url, { headers }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
      })
      .on('error', reject);
  });
}

describe('mitm-replay ui in a browser', () => {
  it('without a daemon: serves the trace list and a timeline with every exchange and streamed frame', async () => {
    if (!browser) return;
    const ui = await serveUi(['viewed', '--home', home]);
    const { context, offsite, errors } = await loopbackContext();
    try {
      expect(ui.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/__mitm-replay\/ui\/login\?token=[\w-]+#\/trace\/viewed$/);
      const page = await context.newPage();
      await page.goto(ui.url);
      await ready(page, '/trace/viewed');
      // the token is gone from the address bar after the sign-in redirect
      expect(page.url()).not.toContain('token');
      expect(page.url()).toMatch(/\/__mitm-replay\/ui\/#\/trace\/viewed$/);
      // the same exchanges `show` lists: 2 model calls, the second streamed in 6 SSE frames
      await expect.poll(() => page.locator('#timeline .tl-row[data-seq]').count()).toBe(2);
      expect(await page.locator('#timeline .bar.kind-model').count()).toBe(2);
      expect(await page.locator('.tl-row[data-seq="1"] .tick').count()).toBe(6);
      expect(await page.locator('#timeline .tick').count()).toBe(6);
      expect(await page.locator('#page-count').textContent()).toBe('exchanges 1–2 of 2');
      expect(await page.locator('#compares .arm').count()).toBe(2);
      expect(await page.locator('#compares .reading').textContent()).toContain('reading 2: patched diverges from the recording at exchange 1');
      await page.screenshot({ path: join(SHOTS, 'trace-timeline.png'), fullPage: true });

      await page.locator('.tl-row[data-seq="0"]').click();
      await expect.poll(() => page.locator('#model-box').textContent()).toContain('12 in');
      expect(await page.locator('#exchange .json-line').first().textContent()).toBe('{');
      await page.locator('.tl-row[data-seq="1"]').click();
      await expect.poll(() => page.locator('#frames tr.frame').count()).toBe(6);
      expect(await page.locator('#model-box .tool-call').textContent()).toBe('get_weather');
      expect(await page.locator('#exchange').textContent()).toContain('[REDACTED:header:authorization]');
      await page.screenshot({ path: join(SHOTS, 'exchange-decoded.png'), fullPage: true });
      await page.locator('#raw-toggle').click();
      await expect.poll(() => page.locator('.raw-view').textContent()).toContain('POST /v1/chat/completions HTTP/1.1\\r\\n');
      expect(await page.locator('.raw-view').textContent()).toContain('data: [DONE]');
      expect(await page.locator('.raw-view').textContent()).not.toContain('sk-proj-uitest');
      await page.screenshot({ path: join(SHOTS, 'exchange-raw.png'), fullPage: true });

      // the traces list: the columns of ls, filterable
      await page.goto(ui.url.replace(/login\?token=.*$/, '#/'));
      await ready(page, '/');
      expect(await page.locator('#traces th').allTextContents()).toEqual(['NAME', 'CREATED (UTC)', 'TIER', 'EXPIRES (UTC)', 'EXCHANGES', 'BYTES', 'COMMAND', 'EXIT', 'LAST VERDICT']);
      const row = page.locator('#traces tr.trace-row');
      expect(await row.count()).toBe(1);
      expect(await row.locator('td').nth(2).textContent()).toBe('full');
      expect(await row.locator('td').nth(3).textContent()).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d$/);
      expect(await row.locator('td').nth(4).textContent()).toBe('2');
      expect(await row.locator('td').nth(8).textContent()).toBe('FAIL');
      await page.screenshot({ path: join(SHOTS, 'traces.png'), fullPage: true });
      await page.locator('#filter').fill('no-such-thing');
      expect(await row.count()).toBe(0);
      await page.locator('#filter').fill('view');
      expect(await row.count()).toBe(1);
      // the viewer holds the store only while the page reads it: another command can open it meanwhile
      await sleep(1500);
      const ls = await runCli(['ls', '--home', home]);
      expect(ls.code, ls.stderr).toBe(0);
      await page.reload();
      await ready(page, '/');
      expect(await row.count()).toBe(1);
      expect(offsite).toEqual([]);
      expect(errors).toEqual([]);
    } finally {
      await context.close();
      ui.child.kill('SIGINT');
      expect(await new Promise((r) => ui.child.once('exit', r))).toBe(0);
    }
  });

  it('access: the token signs in once (HttpOnly, SameSite=Strict, path-scoped cookie); no cookie, a foreign Host or Origin: refused', async () => {
    if (!browser) return;
    const ui = await serveUi(['--home', home]);
    try {
      const base = ui.url.replace(/login\?token=.*$/, '');
      const apiUrl = `${base}api/traces`;
      expect((await get(apiUrl)).status).toBe(401);
      expect((await get(`${base}login?token=wrong`)).status).toBe(401);
      const login = await get(ui.url);
      expect(login.status).toBe(303);
      expect(login.headers.location).toBe('/__mitm-replay/ui/');
      const cookie = login.headers['set-cookie']![0]!;
      expect(cookie).toMatch(/^mitm-replay-ui-\d+=[\w-]+; Path=\/__mitm-replay\/ui\/; HttpOnly; SameSite=Strict$/);
      expect(cookie).not.toContain(new URL(ui.url).searchParams.get('token')!);
      const jar = cookie.split(';')[0]!;
      const ok = await get(apiUrl, { cookie: jar });
      expect(ok.status).toBe(200);
      expect(ok.headers['content-security-policy']).toContain("default-src 'none'");
      expect(ok.headers['access-control-allow-origin']).toBeUndefined();
      expect(JSON.parse(ok.body).map((r: { name: string }) => r.name)).toEqual(['viewed']);
      const port = new URL(ui.url).port;
      expect((await get(apiUrl, { cookie: jar, host: `evil.example:${port}` })).status).toBe(403);
      expect((await get(apiUrl, { cookie: jar, origin: 'http://evil.example' })).status).toBe(403);
      expect((await get(apiUrl, { cookie: jar, 'sec-fetch-site': 'cross-site' })).status).toBe(403);
      expect((await get(`${base}api/traces/nope`, { cookie: jar })).status).toBe(404);
      expect(ui.stderr()).not.toContain(new URL(ui.url).searchParams.get('token')!);
    } finally {
      ui.child.kill('SIGTERM');
      await new Promise((r) => ui.child.once('exit', r));
    }
  });

  it('with a daemon: ui prints the daemon URL; a diverged report highlights the differing JSON path side by side', async () => {
    if (!browser) return;
    const daemon = await startCliDaemon(fx.routing(), home);
    const { context, offsite, errors } = await loopbackContext();
    try {
      const printed = await runCli(['ui', 'viewed', '--run', runId, '--home', home]);
      expect(printed.code, printed.stderr).toBe(0);
      const url = printed.stdout.trim();
      expect(url).toBe(`http://127.0.0.1:${daemon.port}/__mitm-replay/ui/login?token=${url.split('token=')[1]!.split('#')[0]}#/trace/viewed/report/${runId}`);
      const page = await context.newPage();
      await page.goto(url);
      await ready(page, `/trace/viewed/report/${runId}`);
      expect(page.url()).not.toContain('token');
      const number = (key: string) => page.locator(`#verdict [data-key="${key}"] b`).textContent();
      expect([await number('recorded'), await number('requests'), await number('diverged'), await number('unused')]).toEqual(['2', '1', '1', '2']);
      expect(await page.locator('#requests tr[data-outcome="diverged"]').count()).toBe(1);
      expect(await page.locator('#requests tr[data-outcome="unused"]').count()).toBe(2);
      // the outcome part: exit codes and the workspace file the recorded run wrote
      expect(await page.locator('#outcome').textContent()).toContain('answer.txt: recorded added, replayed unchanged');
      await page.locator('#requests tr[data-outcome="diverged"]').click();
      await ready(page, `/trace/viewed/report/${runId}/request/0`);
      const highlighted = page.locator('#side-by-side .json-line.diff');
      expect(await highlighted.evaluateAll((lines) => lines.map((l) => (l as HTMLElement).dataset.path))).toEqual(['messages[0].content', 'messages[0].content']);
      expect(await page.locator('#side-by-side .side').nth(0).locator('.json-line.diff').textContent()).toBe('      "content": "hi"');
      expect(await page.locator('#side-by-side .side').nth(1).locator('.json-line.diff').textContent()).toBe('      "content": "hi!"');
      expect(await page.locator('#json-diffs tbody tr').first().getAttribute('data-path')).toBe('messages[0].content');
      // the differing part of the string (from offset 2): '!' added on the replayed side, nothing on the recorded one
      expect(await page.locator('#side-by-side .side').nth(1).locator('.json-line.diff mark').textContent()).toBe('!');
      expect(await page.locator('#side-by-side .side').nth(0).locator('.json-line.diff mark.insert').count()).toBe(1);
      expect(await page.locator('#request-diff').textContent()).not.toContain('null');
      await page.screenshot({ path: join(SHOTS, 'report-diff.png'), fullPage: true });
      expect(offsite).toEqual([]);
      expect(errors).toEqual([]);
      expect(daemon.stderr()).not.toContain(url.split('token=')[1]!.split('#')[0]!);
    } finally {
      await context.close();
      daemon.child.kill('SIGTERM');
      await new Promise((r) => daemon.child.once('exit', r));
    }
  });

  it('export --html writes one self-contained file that renders the same with the network disabled', async () => {
    if (!browser) return;
    // kept beside the screenshots, so a reviewer can open it too
    const file = join(SHOTS, 'viewed.html');
    rmSync(file, { force: true });
    const exported = await runCli(['export', 'viewed', '--html', file, '--home', home]);
    expect(exported.code, exported.stderr).toBe(0);
    expect(exported.stderr).toMatch(/exported trace viewed as HTML \(2 exchanges, 3 replay reports, \d+ bytes\)/);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const html = readFileSync(file, 'utf8');
    // no external reference: nothing loaded by src/href, no stylesheet link, no @import or url(), and a CSP
    // that allows no connection at all (the page's fetch path is never taken offline)
    const markup = html.replace(/<script type="application\/json" id="mitm-replay-data">[^]*?<\/script>/, '');
    expect(markup).not.toMatch(/\b(src|href)\s*=\s*["']?\s*(https?:)?\/\//i);
    expect(markup).not.toMatch(/<link\b|@import|url\(\s*["']?(https?:)?\/\//i);
    expect(markup).toMatch(/<meta http-equiv="Content-Security-Policy" content="default-src &#39;none&#39;;[^"]*connect-src &#39;none&#39;/);
    expect(html).not.toContain('sk-proj-uitest');

    const context = await browser.newContext({ offline: true, viewport: { width: 1400, height: 1000 } });
    const errors = watchErrors(context);
    const requested: string[] = [];
    context.on('request', (request) => requested.push(request.url()));
    try {
      const page = await context.newPage();
      const fileUrl = pathToFileURL(file).href;
      await page.goto(fileUrl);
      await ready(page, '/trace/viewed');
      expect(await page.locator('#timeline .tl-row[data-seq]').count()).toBe(2);
      expect(await page.locator('#timeline .tick').count()).toBe(6);
      await page.locator('.tl-row[data-seq="1"]').click();
      await expect.poll(() => page.locator('#frames tr.frame').count()).toBe(6);
      await page.screenshot({ path: join(SHOTS, 'export-timeline.png'), fullPage: true });
      await page.goto(`${fileUrl}#/trace/viewed/report/${runId}/request/0`);
      await ready(page, `/trace/viewed/report/${runId}/request/0`);
      expect(await page.locator('#side-by-side .json-line.diff').count()).toBe(2);
      expect(await page.locator('#side-by-side .json-line.diff').first().getAttribute('data-path')).toBe('messages[0].content');
      await page.screenshot({ path: join(SHOTS, 'export-report.png'), fullPage: true });
      expect(requested.every((u) => u.startsWith('file:'))).toBe(true);
      expect(errors).toEqual([]);
    } finally {
      await context.close();
    }
  });

  it('bad input: unknown trace or run, --run without --html: one line, exit 2', async () => {
    if (!browser) return;
    const file = join(fx.work, 'never.html');
    for (const args of [
      ['ui', 'nope', '--home', home],
      ['ui', 'viewed', '--run', 'r-nope', '--home', home],
      ['ui', '--run', 'last', '--home', home],
      ['export', 'nope', '--html', file, '--home', home],
      ['export', 'viewed', '--html', file, '--run', 'r-nope', '--home', home],
      ['export', 'viewed', '--run', 'last', '--home', home],
    ]) {
      const result = await runCli(args);
      expect(result.code, args.join(' ')).toBe(2);
      expect(result.stderr.trim().split('\n'), result.stderr).toHaveLength(1);
    }
    rmSync(file, { force: true });
  });
});

describe('a large trace stays responsive', () => {
  it('251 exchanges and a 10 MiB body: the timeline pages by 100, bodies are fetched on selection and shown in part', async () => {
    const python = pythonWithHttpx();
    if (!browser || !python) return;
    const bigHome = fx.freshHome();
    const script = [
      'import httpx',
      'with httpx.Client(timeout=30) as c:',
      '    c.get("https://tools.example.test/large?mb=10").raise_for_status()',
      '    for i in range(250): c.get(f"https://tools.example.test/tool/weather?city=c{i}").raise_for_status()',
    ].join('\n');
    const rec = await runCli(['record', '--home', bigHome, '--trace', 'big', '--no-workspace', '--intercept', '+tools.example.test', ...fx.routing(), '--', python, '-c', script], { timeoutMs: 120_000 });
    expect(rec.code, rec.stderr).toBe(0);
    expect(rec.stderr).toContain('trace big: 251 exchanges');
    const ui = await serveUi(['big', '--home', bigHome]);
    const { context, offsite, errors } = await loopbackContext();
    const sizes = new Map<string, number>();
    context.on('response', (response) => {
      const path = new URL(response.url()).pathname + new URL(response.url()).search;
      void response.body().then((b) => sizes.set(path.replace(/^\/__mitm-replay\/ui\/api\//, ''), b.length)).catch(() => undefined);
    });
    try {
      const page = await context.newPage();
      await page.goto(ui.url);
      await ready(page, '/trace/big');
      expect(await page.locator('#page-count').textContent()).toBe('exchanges 1–100 of 251');
      expect(await page.locator('#timeline .tl-row[data-seq]').count()).toBe(100);
      expect(await page.locator('#timeline .bar.kind-tool').count()).toBe(100);
      // the 10 MiB response: fetched when selected, shown up to 1 MiB
      await page.locator('.tl-row[data-seq="0"]').click();
      await expect.poll(() => page.locator('#exchange .body-note').textContent(), { timeout: 15_000 }).toBe(' (showing the first 1.0 MiB of 10.0 MiB)');
      await page.screenshot({ path: join(SHOTS, 'large-trace.png') });
      for (const expected of ['exchanges 101–200 of 251', 'exchanges 201–251 of 251']) {
        await page.getByRole('button', { name: 'later →' }).click();
        await expect.poll(() => page.locator('#page-count').textContent()).toBe(expected);
      }
      expect(await page.locator('#timeline .tl-row[data-seq]').count()).toBe(51);
      expect(await page.locator('.tl-row[data-seq="250"] .tl-meta').textContent()).toBe('200');
      await expect.poll(() => sizes.get('traces/big/timeline?offset=200&limit=100')).toBeGreaterThan(0);
      // a timeline page carries no bodies, and the big exchange's detail not the whole body
      expect(sizes.get('traces/big/timeline?offset=0&limit=100')!).toBeLessThan(200_000);
      expect(sizes.get('traces/big/exchanges/0')!).toBeLessThan(3 * 1024 * 1024);
      expect(offsite).toEqual([]);
      expect(errors).toEqual([]);
    } finally {
      await context.close();
      ui.child.kill('SIGINT');
      await new Promise((r) => ui.child.once('exit', r));
    }
  }, 180_000);
});
