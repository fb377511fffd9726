/**
 * The trace viewer's one HTML page. Served, it loads `app.js` and `app.css` from its own origin and asks the
 * JSON API; exported (`export --html`), the same script and style are inlined with the API's answers as data,
 * and a CSP allowing only those two inline blocks (by hash) and no connection at all.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';

const ASSET_DIR = new URL('../../ui/', import.meta.url);
let assets: { js: string; css: string } | undefined;

/** The page's script and style (`ui/` in the package, plain files: see docs/decisions.md), read once. */
export function uiAssets(): { js: string; css: string } {
  assets ??= { js: readFileSync(new URL('app.js', ASSET_DIR), 'utf8'), css: readFileSync(new URL('app.css', ASSET_DIR), 'utf8') };
  return assets;
}

export type PageOptions =
  | { mode: 'served' }
  /** `data`: API path → answer; `route`: the view to open (`#/trace/NAME`, …) */
  | { mode: 'export'; data: Record<string, unknown>; route: string; title: string };

const escapeHtml = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/** JSON inside <script>: `<` escaped, so no `</script>` or `<!--` in the data can end the block. */
function scriptJson(value: unknown): string {
  return JSON.stringify(value).replace(/</g, '\\u003c').replace(/\u2028/g, '\\u2028').replace(/\u2029/g, '\\u2029');
}

const sha256 = (text: string) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`;

export function pageHtml(options: PageOptions): string {
  if (options.mode === 'served') {
    return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>mitm-replay</title><link rel="stylesheet" href="app.css"></head>
<body><div id="app">loading…</div><script src="app.js"></script></body></html>
`;
  }
  const { js, css } = uiAssets();
  const boot = `window.MITM_REPLAY_EXPORT = { route: ${scriptJson(options.route)} };`;
  const csp = `default-src 'none'; script-src ${sha256(boot)} ${sha256(js)}; style-src ${sha256(css)}; img-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'`;
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="${escapeHtml(csp)}">
<title>${escapeHtml(options.title)}</title><style>${css}</style></head>
<body><div id="app">loading…</div>
<script type="application/json" id="mitm-replay-data">${scriptJson(options.data)}</script>
<script>${boot}</script>
<script>${js}</script></body></html>
`;
}
