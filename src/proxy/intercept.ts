/**
 * Which hosts are decrypted (intercepted). Everything else is tunnelled untouched.
 */
export const DEFAULT_INTERCEPT = [
  'api.openai.com',
  'api.anthropic.com',
  'generativelanguage.googleapis.com',
  'api.mistral.ai',
  'api.groq.com',
  'api.together.xyz',
  'api.together.ai',
  'openrouter.ai',
  'api.deepseek.com',
  'api.x.ai',
  '*.openai.azure.com',
  'bedrock-runtime.*.amazonaws.com',
];

export class InterceptListError extends Error {}

const PATTERN = /^(\*|(\*\.)?[a-z0-9_-]+(\.(\*|[a-z0-9_-]+))*|\[[0-9a-f:.]+\]|[0-9a-f:.]+)$/;

/**
 * `+host,+*.corp.example` adds to the defaults; a list without `+` replaces them; `*` decrypts everything.
 * Mixing both forms in one list is refused, since it is ambiguous.
 */
export function parseInterceptList(spec: string | undefined): string[] {
  if (spec === undefined || spec.trim() === '') return [...DEFAULT_INTERCEPT];
  const items = spec.split(',').map((s) => s.trim().toLowerCase()).filter(Boolean);
  const additive = items.filter((s) => s.startsWith('+'));
  if (additive.length > 0 && additive.length !== items.length) {
    throw new InterceptListError(`--intercept '${spec}' mixes +host (add to defaults) and host (replace defaults); use one form`);
  }
  const hosts = items.map((s) => (s.startsWith('+') ? s.slice(1) : s));
  for (const host of hosts) {
    if (!PATTERN.test(host)) throw new InterceptListError(`--intercept: '${host}' is not a host name or pattern (examples: api.example.com, *.corp.example, *)`);
  }
  return additive.length > 0 ? [...new Set([...DEFAULT_INTERCEPT, ...hosts])] : [...new Set(hosts)];
}

function matchesPattern(host: string, pattern: string): boolean {
  if (pattern === '*') return true;
  if (pattern.startsWith('[') && pattern.endsWith(']')) pattern = pattern.slice(1, -1);
  const hostLabels = host.split('.');
  const patternLabels = pattern.split('.');
  if (pattern.startsWith('*.')) {
    // `*.corp.example` matches any depth below corp.example, not corp.example itself.
    const suffix = patternLabels.slice(1);
    if (hostLabels.length <= suffix.length) return false;
    return suffix.every((label, i) => label === hostLabels[hostLabels.length - suffix.length + i] || label === '*');
  }
  if (hostLabels.length !== patternLabels.length) return false;
  return patternLabels.every((label, i) => label === '*' || label === hostLabels[i]);
}

export function isIntercepted(policy: string[], host: string): boolean {
  const normal = host.toLowerCase().replace(/\.$/, '').replace(/^\[(.*)\]$/, '$1');
  return policy.some((pattern) => matchesPattern(normal, pattern));
}
