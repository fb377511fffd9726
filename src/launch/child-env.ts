import type { HomePaths } from '../home.js';

export interface ChildEnvOptions {
  /** proxy URL, with session credentials when there is a session */
  proxyUrl: string;
  /** `http://127.0.0.1:PORT/__mitm-replay/b/CREDENTIALS` (or `/-` for anonymous); null with --no-base-url */
  baseUrlPrefix: string | null;
  paths: HomePaths;
  /** the environment the user's variables come from (base URLs already set keep their path) */
  from?: NodeJS.ProcessEnv;
}

const DEFAULT_BASE_URLS: Record<string, string> = {
  OPENAI_BASE_URL: 'https://api.openai.com/v1',
  ANTHROPIC_BASE_URL: 'https://api.anthropic.com',
};

/** `https://host[:port]/path` → `PREFIX/https/host[:port]/path`; leaves values that already point at a route alone. */
export function routeBaseUrl(prefix: string, value: string): string {
  if (value.includes('/__mitm-replay/b/')) return value;
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return value;
  }
  const scheme = url.protocol.replace(':', '');
  const path = url.pathname === '/' ? '' : url.pathname.replace(/\/$/, '');
  return `${prefix}/${scheme}/${url.host}${path}${url.search}`;
}

/**
 * The variables that point an unmodified agent at the daemon, for one process: proxies, CA trust for every
 * common runtime, and base URLs for SDKs that ignore HTTPS_PROXY.
 */
export function childEnvironment(options: ChildEnvOptions): Record<string, string> {
  const from = options.from ?? process.env;
  const env: Record<string, string> = {};
  for (const name of ['HTTPS_PROXY', 'https_proxy', 'HTTP_PROXY', 'http_proxy']) env[name] = options.proxyUrl;
  env.NO_PROXY = env.no_proxy = 'localhost,127.0.0.1,::1';
  env.NODE_USE_ENV_PROXY = '1';
  env.NODE_EXTRA_CA_CERTS = options.paths.caCert;
  env.DENO_CERT = options.paths.caCert;
  for (const name of ['SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO', 'AWS_CA_BUNDLE']) env[name] = options.paths.bundle;
  if (options.baseUrlPrefix) {
    for (const [name, fallback] of Object.entries(DEFAULT_BASE_URLS)) {
      env[name] = routeBaseUrl(options.baseUrlPrefix, from[name] || fallback);
    }
  }
  return env;
}

function shellQuote(value: string): string {
  return `'${value.replaceAll("'", "'\\''")}'`;
}

export function exportLines(env: Record<string, string>): string {
  return Object.entries(env)
    .map(([name, value]) => `export ${name}=${shellQuote(value)}`)
    .join('\n');
}
