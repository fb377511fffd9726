/**
 * The trace viewer over HTTP: the page, its script and style, and the JSON API, behind the control token.
 * Transport-free (a request in, a response out), so the daemon's listener and the small server of
 * `mitm-replay ui` serve it the same way.
 *
 * Access: the URL `mitm-replay ui` prints carries the token once (`login?token=…`); that answer sets an
 * HttpOnly, SameSite=Strict cookie scoped to the UI path and redirects to a token-free URL. Every other path
 * needs the cookie. Only loopback peers, a loopback Host (no DNS rebinding) and same-origin requests are
 * answered; there are no CORS headers, and a CSP keeps the page to its own origin.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import net from 'node:net';
import type { TraceReader } from '../trace/reader.js';
import type { RetentionPolicy } from '../trace/retention.js';
import { answerApi } from './api.js';
import { pageHtml, uiAssets } from './page.js';

export const UI_PREFIX = '/__mitm-replay/ui/';

export interface UiRequest {
  method: string;
  /** origin-form request target, starting with UI_PREFIX (or the prefix without its slash) */
  target: string;
  header: (name: string) => string | undefined;
  remoteAddress: string | undefined;
}

export interface UiResponse {
  status: number;
  headers: Record<string, string>;
  body: string | Buffer;
}

export interface UiServiceOptions {
  /** the secret of the printed URL: the daemon's control token, or one made by `mitm-replay ui` */
  token: string;
  reader: TraceReader;
  policy: () => RetentionPolicy;
  /** the port the page is served on (the Host header must name it) */
  port: () => number;
}

const SERVED_CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const COMMON_HEADERS: Record<string, string> = {
  'content-security-policy': SERVED_CSP,
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'no-referrer',
  'cross-origin-resource-policy': 'same-origin',
  'cross-origin-opener-policy': 'same-origin',
  'cache-control': 'no-store',
};

function sameSecret(a: string, b: string): boolean {
  const left = Buffer.from(a);
  const right = Buffer.from(b);
  return left.length === right.length && timingSafeEqual(left, right);
}

function cookieValue(header: string | undefined, name: string): string | undefined {
  for (const part of (header ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** The URL to print: it carries the token once; the fragment opens a trace or a report. */
export function uiLoginUrl(host: string, port: number, token: string, trace?: string, runId?: string): string {
  const authority = `${net.isIPv6(host) ? `[${host}]` : host}:${port}`;
  const fragment = trace ? `#/trace/${encodeURIComponent(trace)}${runId ? `/report/${encodeURIComponent(runId)}` : ''}` : '';
  return `http://${authority}${UI_PREFIX}login?token=${encodeURIComponent(token)}${fragment}`;
}

export function isLoopbackAddress(address: string | undefined): boolean {
  if (!address) return false;
  const normal = address.replace(/^::ffff:/i, '');
  return normal === '::1' || (net.isIPv4(normal) && normal.startsWith('127.'));
}

export class UiService {
  constructor(private readonly options: UiServiceOptions) {}

  /** Cookies are not port-scoped: one name per port, so two viewers on one host do not log each other out. */
  private get cookieName(): string {
    return `mitm-replay-ui-${this.options.port()}`;
  }

  /** Derived from the token, so the cookie is not itself a bearer token for the control API. */
  private get cookieSecret(): string {
    return createHmac('sha256', this.options.token).update('mitm-replay ui cookie').digest('base64url');
  }


  private allowedHost(host: string | undefined): boolean {
    const port = this.options.port();
    return host !== undefined && [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`].includes(host.toLowerCase());
  }

  async handle(request: UiRequest): Promise<UiResponse> {
    const text = (status: number, message: string): UiResponse => ({ status, headers: { ...COMMON_HEADERS, 'content-type': 'text/plain; charset=utf-8' }, body: `mitm-replay: ${message}\n` });
    if (!isLoopbackAddress(request.remoteAddress)) return text(403, 'the trace viewer is served to loopback clients only');
    const host = request.header('host');
    if (!this.allowedHost(host)) return text(403, `the trace viewer answers only for 127.0.0.1, localhost or [::1] on port ${this.options.port()}`);
    const origin = request.header('origin');
    if (origin !== undefined && origin !== `http://${host}` && origin !== `https://${host}`) return text(403, 'cross-origin requests are refused');
    const site = request.header('sec-fetch-site');
    if (site !== undefined && site !== 'same-origin' && site !== 'none') return text(403, 'cross-site requests are refused');
    if (request.method !== 'GET') return { ...text(405, 'the trace viewer is read-only'), headers: { ...COMMON_HEADERS, allow: 'GET' } };

    const target = request.target;
    if (target === UI_PREFIX.slice(0, -1)) return { status: 308, headers: { ...COMMON_HEADERS, location: UI_PREFIX }, body: '' };
    const [path = '', search = ''] = target.slice(UI_PREFIX.length).split('?', 2);
    if (path === 'login') {
      const token = new URLSearchParams(search).get('token') ?? '';
      if (!sameSecret(token, this.options.token)) return text(401, "this link is not valid (any more): run 'mitm-replay ui' for a fresh one");
      return {
        status: 303,
        headers: {
          ...COMMON_HEADERS,
          location: UI_PREFIX,
          'set-cookie': `${this.cookieName}=${this.cookieSecret}; Path=${UI_PREFIX}; HttpOnly; SameSite=Strict`,
        },
        body: '',
      };
    }
    const cookie = cookieValue(request.header('cookie'), this.cookieName);
    if (cookie === undefined || !sameSecret(cookie, this.cookieSecret)) return text(401, "open the URL that 'mitm-replay ui' prints (it signs this browser in)");
    if (path === '' && search === '') return { status: 200, headers: { ...COMMON_HEADERS, 'content-type': 'text/html; charset=utf-8' }, body: pageHtml({ mode: 'served' }) };
    if (path === 'app.js') return { status: 200, headers: { ...COMMON_HEADERS, 'content-type': 'text/javascript; charset=utf-8' }, body: uiAssets().js };
    if (path === 'app.css') return { status: 200, headers: { ...COMMON_HEADERS, 'content-type': 'text/css; charset=utf-8' }, body: uiAssets().css };
    if (path.startsWith('api/')) {
      const answer = await answerApi(this.options.reader, this.options.policy(), `${path.slice(4)}${search ? `?${search}` : ''}`);
      return { status: answer.status, headers: { ...COMMON_HEADERS, 'content-type': 'application/json' }, body: JSON.stringify(answer.value) };
    }
    return text(404, `no such page '${path.slice(0, 80)}'`);
  }
}
