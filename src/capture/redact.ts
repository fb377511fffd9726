/**
 * Redaction of secrets in recorded HTTP traffic, applied on ingress before any byte reaches disk.
 *
 * Design rules:
 * - A secret becomes `[REDACTED:<rule-name>]`, never a length or hash of the value, so recordings made with
 *   different keys redact to identical bytes.
 * - Where no rule fired, the output is the input Buffer itself (byte-identical, no copy).
 * - Bytes are scanned as latin1 strings: every byte maps to one char and back, so non-UTF-8 payloads and
 *   multi-byte UTF-8 around a match round-trip exactly; all built-in key shapes are ASCII.
 * - All matches of all rules are collected as spans over the original text and spliced in once.
 */
import { readFileSync } from 'node:fs';
import { decodeContentCoding } from './content-coding.js';

export interface UserRules {
  /** Extra header names (case-insensitive) whose values are secret. */
  headers?: string[];
  /**
   * Applied to query strings (raw, still percent-encoded) and bodies, not to header values. Bodies are matched
   * as latin1 text (one char per byte), so write non-ASCII literals as their UTF-8 bytes, e.g. "\\xc3\\xa9" for é.
   */
  patterns?: { name: string; regex: string; flags?: string }[];
  /** E.g. "$.credentials.token", "$.items[*].secret", "$..password"; the string/number value there is replaced. */
  jsonPaths?: string[];
}

export interface RuleSet {
  version: 1;
  headers: string[];
  patterns: { name: string; regex: string; flags: string }[];
  queryParams: string[];
  jsonPaths: string[];
}

export interface Firing {
  rule: string;
  where: string;
}

export class RedactionRulesError extends Error {
  constructor(message: string) {
    // Callers print this as a single line; regex engine messages are one line but be sure.
    super(message.replace(/\s*[\r\n]+\s*/g, ' '));
    this.name = 'RedactionRulesError';
  }
}

// ---------------------------------------------------------------------------------------------------------
// Built-in rules
// ---------------------------------------------------------------------------------------------------------

/**
 * Headers whose whole value is a credential. Not listed on purpose: `openai-organization`, `openai-project`,
 * `anthropic-version`, `x-amz-date`, request ids — identifiers, not secrets, and useful when matching replays.
 */
export const SECRET_HEADERS: readonly string[] = [
  'authorization',
  'proxy-authorization',
  'x-api-key',
  'api-key', // Azure OpenAI
  'x-goog-api-key',
  'x-auth-token',
  'x-access-token',
  'x-amz-security-token', // STS session token
  'ocp-apim-subscription-key', // Azure API Management
  'private-token', // GitLab
  'cookie',
  'set-cookie',
];

/** Query parameters (exact name, case-insensitive) whose value is a credential or a request signature. */
export const SECRET_QUERY_PARAMS: readonly string[] = [
  'key', // Google APIs
  'api_key',
  'apikey',
  'api-key',
  'access_token',
  'refresh_token',
  'id_token',
  'token',
  'client_secret',
  'password',
  'secret',
  'sig', // Azure SAS
  'signature',
  'x-amz-signature', // S3 presigned URLs
  'x-amz-security-token',
  'x-goog-signature', // GCS signed URLs
];

/** Last words of environment variable names that hold secrets (the `env-secret` pattern). */
const ENV_SECRET_WORDS = 'PASSWORD|PASSWD|PASSPHRASE|SECRET|SECRET_KEY|TOKEN|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?';

/** JSON keys whose string values are secrets (the `json-secret` pattern); `token` alone is left out (logprobs). */
const JSON_SECRET_KEYS =
  'password|Password|passwd|passphrase|secret|client_secret|clientSecret|api_key|apiKey|API_KEY|access_token|accessToken|refresh_token|refreshToken|private_key|privateKey|authorization|Authorization';

/** Characters of a token: a key shape must not start in the middle of one (prevents matching "disk-…"). */
const T = 'A-Za-z0-9_-';

/**
 * Key shapes. Order matters: at one position the first alternative wins, so anthropic precedes openai
 * (openai also excludes `sk-ant-` explicitly). Quantifiers are bounded and classes exclude quotes, commas and
 * dots, so a match never eats JSON syntax and cannot backtrack catastrophically.
 */
export const BUILTIN_PATTERNS: readonly { name: string; regex: string; flags: string }[] = [
  { name: 'anthropic-key', regex: `(?<![${T}])sk-ant-[${T}]{20,300}`, flags: '' },
  { name: 'openai-key', regex: `(?<![${T}])sk-(?!ant-)[${T}]{20,300}`, flags: '' },
  { name: 'aws-access-key-id', regex: '(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}', flags: '' },
  { name: 'github-token', regex: `(?<![${T}])(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})`, flags: '' },
  { name: 'google-api-key', regex: `(?<![${T}])AIza[${T}]{35}`, flags: '' },
  { name: 'slack-token', regex: `(?<![${T}])xox[abprs]-[A-Za-z0-9-]{10,250}`, flags: '' },
  // header.payload[.signature]; both JSON parts start with `{"` = "eyJ". The signature is optional so that an
  // unsigned token, or one whose signature runs past the bound, is still caught by header and payload.
  { name: 'jwt', regex: `(?<![${T}])eyJ[${T}]{5,10000}\\.eyJ[${T}]{5,100000}(?:\\.[${T}]{0,10000})?`, flags: '' },
  // PEM body: base64 plus real or JSON-escaped newlines; the END line is optional so a truncated key still goes.
  {
    name: 'private-key',
    regex: '-----BEGIN[A-Z ]{0,30}PRIVATE KEY-----(?:[A-Za-z0-9+/=\\s]|\\\\[nr]){0,20000}(?:-----END[A-Z ]{0,30}PRIVATE KEY-----)?',
    flags: '',
  },
  // The value of an environment-style assignment whose name says it is a secret (`DB_PASSWORD=…`,
  // `export STRIPE_SECRET_KEY="…"`, `GITHUB_TOKEN=…`), wherever it appears: a .env file in the workspace, or the
  // same text a tool read and sent to the model (in JSON, after an escaped newline). Only UPPER_CASE names ending
  // in one of the words, so `MAX_TOKENS=4096` and `TOKEN_LENGTH=32` stay. A key shape in the value names the
  // rule; a placeholder is left alone (redacting twice changes nothing: a restored snapshot rescans the same).
  {
    name: 'env-secret',
    // The word comes first, so the scan looks for literals; the lookbehind then checks the whole name.
    regex: `(?:${ENV_SECRET_WORDS})(?<=(?:^|[^A-Za-z0-9_]|\\\\[nrt])(?:[A-Z0-9]+_)*(?:${ENV_SECRET_WORDS}))[ \\t]*=[ \\t]*["']?(?!\\[REDACTED:)(?<secret>[^\\s"'\\\\,;&<>]{3,300})`,
    flags: '',
  },
  // The string value of a JSON key named like a secret (`"password": "…"`, `"api_key": "…"`), also in JSON
  // sent as text inside a JSON string (`\"password\": \"…\"`). Objects and numbers under such keys (a tool
  // schema's `"password": {"type": "string"}`) are left alone. The value ends at the first `"` or `\"`.
  {
    name: 'json-secret',
    regex: `(?:${JSON_SECRET_KEYS})(?<="(?:${JSON_SECRET_KEYS}))\\\\?"[ \\t]*:[ \\t]*\\\\?"(?!\\[REDACTED:)(?<secret>(?:[^"\\\\]|\\\\[^"]){3,300})(?=\\\\?")`,
    flags: '',
  },
];

const USER_RULE_KEYS = new Set(['headers', 'patterns', 'jsonPaths']);
const USER_PATTERN_KEYS = new Set(['name', 'regex', 'flags']);
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Pattern names end up in placeholders, which must stay safe inside JSON strings and query strings. */
const PATTERN_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** Decoded bodies larger than this are treated as undecodable (zip-bomb guard; V8 strings top out near 512 MiB). */
const MAX_DECODED_BYTES = 256 * 1024 * 1024;

/** Built-in rules merged with user rules. Throws RedactionRulesError for anything invalid. */
export function buildRuleSet(user?: UserRules): RuleSet {
  const rules: RuleSet = {
    version: 1,
    headers: [...SECRET_HEADERS],
    patterns: BUILTIN_PATTERNS.map((p) => ({ ...p })),
    queryParams: [...SECRET_QUERY_PARAMS],
    jsonPaths: [],
  };
  if (user === undefined) return rules;
  if (typeof user !== 'object' || user === null || Array.isArray(user)) {
    throw new RedactionRulesError('redaction rules must be a JSON object with optional keys headers, patterns, jsonPaths');
  }
  for (const key of Object.keys(user)) {
    if (!USER_RULE_KEYS.has(key)) {
      throw new RedactionRulesError(`unknown key "${key}" in redaction rules; allowed keys are headers, patterns, jsonPaths`);
    }
  }

  for (const name of arrayField(user.headers, 'headers')) {
    if (typeof name !== 'string' || !HEADER_NAME.test(name)) {
      throw new RedactionRulesError(`headers: ${JSON.stringify(name)} is not a valid header name; use names like "x-my-token"`);
    }
    const lower = name.toLowerCase();
    if (!rules.headers.includes(lower)) rules.headers.push(lower);
  }

  const seen = new Set<string>();
  for (const p of arrayField(user.patterns, 'patterns')) {
    rules.patterns.push(checkUserPattern(p, seen));
  }

  for (const path of arrayField(user.jsonPaths, 'jsonPaths')) {
    if (typeof path !== 'string') {
      throw new RedactionRulesError(`jsonPaths: ${JSON.stringify(path)} is not a string; use paths like "$.credentials.token"`);
    }
    parseJsonPath(path); // validates
    if (!rules.jsonPaths.includes(path)) rules.jsonPaths.push(path);
  }
  return rules;
}

function arrayField(value: unknown, key: string): unknown[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new RedactionRulesError(`"${key}" in redaction rules must be an array`);
  return value;
}

function checkUserPattern(p: unknown, seen: Set<string>): { name: string; regex: string; flags: string } {
  if (typeof p !== 'object' || p === null || Array.isArray(p)) {
    throw new RedactionRulesError('patterns: each entry must be an object like {"name": "my-token", "regex": "tok_[a-z0-9]{32}"}');
  }
  const entry = p as Record<string, unknown>;
  for (const key of Object.keys(entry)) {
    if (!USER_PATTERN_KEYS.has(key)) {
      throw new RedactionRulesError(`patterns: unknown key "${key}"; allowed keys are name, regex, flags`);
    }
  }
  const { name, regex, flags = '' } = entry;
  if (typeof name !== 'string' || !PATTERN_NAME.test(name)) {
    throw new RedactionRulesError(
      `patterns: name ${JSON.stringify(name)} is invalid; use 1-64 letters, digits, ".", "_" or "-" starting with a letter or digit`,
    );
  }
  if (seen.has(name)) throw new RedactionRulesError(`patterns: duplicate name "${name}"; give each pattern its own name`);
  seen.add(name);
  if (typeof regex !== 'string' || regex === '') {
    throw new RedactionRulesError(`patterns: "${name}" needs a non-empty "regex" string`);
  }
  if (typeof flags !== 'string' || !/^[imsuv]*$/.test(flags)) {
    throw new RedactionRulesError(`patterns: "${name}" has flags ${JSON.stringify(flags)}; only i, m, s, u, v are allowed`);
  }
  let compiled: RegExp;
  try {
    compiled = new RegExp(regex, flags);
  } catch (err) {
    throw new RedactionRulesError(`patterns: "${name}" has an invalid regex: ${(err as Error).message}`);
  }
  // A pattern matching "" would "redact" nothing at every position: certainly a mistake.
  if (compiled.test('')) {
    throw new RedactionRulesError(`patterns: "${name}" matches the empty string; make it require at least one character`);
  }
  return { name: `user:${name}`, regex, flags: [...flags].sort().join('') };
}

/** Reads a JSON rules file (shape UserRules). A missing file is fine when `optional`: built-in rules only. */
export function loadRuleSet(file: string | undefined, optional: boolean): RuleSet {
  if (file === undefined) return buildRuleSet();
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' && optional) return buildRuleSet();
    if (code === 'ENOENT') throw new RedactionRulesError(`redaction rules file ${file} does not exist; create it or omit the option`);
    throw new RedactionRulesError(`cannot read redaction rules file ${file}: ${(err as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new RedactionRulesError(`redaction rules file ${file} is not valid JSON (${(err as Error).message}); fix the syntax`);
  }
  try {
    return buildRuleSet(parsed as UserRules);
  } catch (err) {
    if (err instanceof RedactionRulesError) throw new RedactionRulesError(`${file}: ${err.message}`);
    throw err;
  }
}

// ---------------------------------------------------------------------------------------------------------
// JSON paths
// ---------------------------------------------------------------------------------------------------------

type PathSeg = { deep: boolean } & ({ kind: 'name'; name: string } | { kind: 'index'; index: number } | { kind: 'wild' });
type ConcretePath = (string | number)[];

/** Supports $ root, .name, ['name'], [n], [*], .*, ..name / ..['name'] / ..[*] (recursive descent). */
function parseJsonPath(path: string): PathSeg[] {
  const bad = (why: string) =>
    new RedactionRulesError(
      `jsonPaths: ${JSON.stringify(path)} ${why}; use forms like $.a.b, $['a b'], $.items[0], $.items[*].secret, $..password`,
    );
  if (!path.startsWith('$')) throw bad('must start with $');
  // Rule names become placeholders, which must not contain characters that break JSON strings.
  if (/["\\]/.test(path)) throw bad('must not contain double quotes or backslashes (quote names with \')');
  const segs: PathSeg[] = [];
  let i = 1;
  while (i < path.length) {
    let deep = false;
    if (path.startsWith('..', i)) {
      deep = true;
      i += 2;
    } else if (path[i] === '.') {
      i += 1;
    } else if (path[i] !== '[') {
      throw bad(`has unexpected "${path[i]}" at offset ${i}`);
    }
    if (path[i] === '[') {
      if (path[i + 1] === "'") {
        const close = path.indexOf("']", i + 2);
        if (close < 0) throw bad(`has an unclosed ['name'] at offset ${i}`);
        const name = path.slice(i + 2, close);
        if (name === '') throw bad('has an empty name');
        segs.push({ deep, kind: 'name', name });
        i = close + 2;
      } else {
        const close = path.indexOf(']', i);
        if (close < 0) throw bad(`has an unclosed [ at offset ${i}`);
        const inner = path.slice(i + 1, close);
        if (inner === '*') segs.push({ deep, kind: 'wild' });
        else if (/^\d{1,9}$/.test(inner)) segs.push({ deep, kind: 'index', index: Number(inner) });
        else throw bad(`has an unsupported selector [${inner}]`);
        i = close + 1;
      }
    } else {
      const m = /^(?:\*|[^.[\]\s]+)/.exec(path.slice(i));
      if (!m) throw bad(`is missing a member name at offset ${i}`);
      segs.push(m[0] === '*' ? { deep, kind: 'wild' } : { deep, kind: 'name', name: m[0] });
      i += m[0].length;
    }
  }
  if (segs.length === 0) throw bad('selects the whole document');
  return segs;
}

function segMatches(seg: PathSeg, key: string | number): boolean {
  if (seg.kind === 'wild') return true;
  if (seg.kind === 'name') return key === seg.name;
  return key === seg.index;
}

function pathMatches(segs: PathSeg[], path: ConcretePath, si = 0, pi = 0): boolean {
  if (si === segs.length) return pi === path.length;
  const seg = segs[si]!;
  if (!seg.deep) return pi < path.length && segMatches(seg, path[pi]!) && pathMatches(segs, path, si + 1, pi + 1);
  for (let k = pi; k < path.length; k++) {
    if (segMatches(seg, path[k]!) && pathMatches(segs, path, si + 1, k + 1)) return true;
  }
  return false;
}

/**
 * The manifest's location of a JSON-path hit. Array indices become [*]: a rule firing in each of 100k array
 * elements is one manifest entry, not 100k.
 */
function formatPath(path: ConcretePath): string {
  let out = '$';
  for (const key of path) {
    if (typeof key === 'number') out += '[*]';
    else if (/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(key)) out += `.${key}`;
    else out += `['${key}']`;
  }
  return out;
}

const JSON_NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

function skipWs(s: string, i: number, to: number): number {
  while (i < to) {
    const c = s.charCodeAt(i);
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) break;
    i++;
  }
  return i;
}

/** Index just past the closing quote of the string starting at `i`, or -1. Uses indexOf, not a per-char loop. */
function stringEnd(s: string, i: number, to: number): number {
  let p = i + 1;
  for (;;) {
    const q = s.indexOf('"', p);
    if (q < 0 || q >= to) return -1;
    let backslashes = 0;
    for (let k = q - 1; k > i && s.charCodeAt(k) === 0x5c; k--) backslashes++;
    if (backslashes % 2 === 0) return q + 1;
    p = q + 1;
  }
}

/** Decodes an object key token; the text is latin1-of-UTF-8, so non-ASCII keys are re-decoded first. */
function decodeKey(raw: string): string {
  if (!/[\\\x80-\xff]/.test(raw)) return raw.slice(1, -1);
  return JSON.parse(Buffer.from(raw, 'latin1').toString('utf8')) as string;
}

/**
 * Walks the JSON text s[from, to) keeping byte offsets (JSON.parse loses them, and we must splice the original
 * bytes rather than re-serialize). Calls `onScalar` for each string/number value. Returns false if not JSON.
 * Iterative, so deeply nested documents cannot overflow the call stack.
 */
function walkJson(
  s: string,
  from: number,
  to: number,
  onScalar: (path: ConcretePath, start: number, end: number) => void,
): boolean {
  const path: ConcretePath = [];
  const isArray: boolean[] = [];
  let i = from;

  // Reads `"key" :` at i into the top path slot; returns the index after the colon or -1.
  const readKey = (at: number): number => {
    at = skipWs(s, at, to);
    if (s.charCodeAt(at) !== 0x22) return -1;
    const end = stringEnd(s, at, to);
    if (end < 0) return -1;
    path[path.length - 1] = decodeKey(s.slice(at, end));
    at = skipWs(s, end, to);
    return s.charCodeAt(at) === 0x3a ? at + 1 : -1;
  };

  try {
    for (;;) {
      // A value starts here.
      i = skipWs(s, i, to);
      const c = s.charCodeAt(i);
      if (c === 0x7b || c === 0x5b) {
        const close = c === 0x7b ? 0x7d : 0x5d;
        const j = skipWs(s, i + 1, to);
        if (s.charCodeAt(j) === close) {
          i = j + 1;
        } else {
          isArray.push(c === 0x5b);
          path.push(0);
          i = c === 0x7b ? readKey(i + 1) : i + 1;
          if (i < 0) return false;
          continue;
        }
      } else if (c === 0x22) {
        const end = stringEnd(s, i, to);
        if (end < 0) return false;
        onScalar(path, i, end);
        i = end;
      } else if (c === 0x74 && s.startsWith('true', i)) {
        i += 4;
      } else if (c === 0x66 && s.startsWith('false', i)) {
        i += 5;
      } else if (c === 0x6e && s.startsWith('null', i)) {
        i += 4;
      } else {
        JSON_NUMBER.lastIndex = i;
        const m = JSON_NUMBER.exec(s);
        if (!m || i + m[0].length > to) return false;
        onScalar(path, i, i + m[0].length);
        i += m[0].length;
      }

      // After a value: close finished containers, or move to the next member/element.
      for (;;) {
        if (isArray.length === 0) return skipWs(s, i, to) === to;
        i = skipWs(s, i, to);
        const top = isArray.length - 1;
        const d = s.charCodeAt(i);
        if (d === 0x2c) {
          if (isArray[top]) {
            path[top] = (path[top] as number) + 1;
            i += 1;
          } else {
            i = readKey(i + 1);
            if (i < 0) return false;
          }
          break;
        }
        if (d !== (isArray[top] ? 0x5d : 0x7d)) return false;
        isArray.pop();
        path.pop();
        i += 1;
      }
    }
  } catch {
    return false; // a key with a bad escape
  }
}

function mediaType(contentType: string | undefined): string {
  return (contentType ?? '').split(';', 1)[0]!.trim().toLowerCase();
}

function isJsonType(type: string): boolean {
  return /^[a-z0-9.+-]+\/(?:[a-z0-9.-]+\+)?json$/.test(type);
}

// ---------------------------------------------------------------------------------------------------------
// Redactor
// ---------------------------------------------------------------------------------------------------------

/** A stretch of the scanned text to replace. */
interface Span {
  start: number;
  end: number;
  replacement: string;
  rule: string;
  where: string;
}

interface CompiledPatterns {
  regex: RegExp;
  /** Rule name per capture group (group i+1 ↔ rules[i]) when several patterns share one regex. */
  rules: string[];
}

const placeholder = (rule: string): string => `[REDACTED:${rule}]`;

/** Headers holding `<scheme> <credentials>`: the scheme is kept so "Bearer"/"Basic" survive redaction. */
const isAuthHeader = (name: string): boolean => name === 'authorization' || name.endsWith('-authorization');
/** Headers holding URLs, which get the query-string treatment. */
const URL_HEADERS = new Set(['location', 'content-location', 'referer']);
const AUTH_SCHEME = /^([!#$%&'*+.^_`|~0-9A-Za-z-]{1,40})([ \t]+)(?=\S)/;
/** `scheme://user:password@` — the password part. */
const URL_USERINFO = /([A-Za-z][A-Za-z0-9+.-]{0,30}:\/\/[^\s/?#@:]{0,256}:)([^\s/?#@]{1,1024})@/g;

const escapeRegex = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

function decodeQueryName(raw: string): string {
  try {
    return decodeURIComponent(raw.replace(/\+/g, ' ')).toLowerCase();
  } catch {
    return raw.toLowerCase();
  }
}

export class Redactor {
  readonly rules: RuleSet;
  private readonly headerSet: Set<string>;
  private readonly paramSet: Set<string>;
  /** All built-in key shapes (used in header values and URL paths). */
  private readonly builtin: CompiledPatterns[];
  /** Built-in plus user patterns (used in query strings and bodies). */
  private readonly all: CompiledPatterns[];
  private readonly jsonPaths: { rule: string; segs: PathSeg[]; replacement: string }[];
  private readonly textParams: RegExp | undefined;
  private readonly textHeaders: RegExp | undefined;

  constructor(rules: RuleSet) {
    this.rules = rules;
    this.headerSet = new Set(rules.headers.map((h) => h.toLowerCase()));
    this.paramSet = new Set(rules.queryParams.map((p) => p.toLowerCase()));
    const isBuiltin = (p: { name: string; regex: string; flags: string }) =>
      BUILTIN_PATTERNS.some((b) => b.name === p.name && b.regex === p.regex && b.flags === p.flags);
    this.builtin = compilePatterns(rules.patterns.filter(isBuiltin));
    this.all = compilePatterns(rules.patterns);
    // Numbers are replaced too, and the placeholder is always a JSON string.
    this.jsonPaths = rules.jsonPaths.map((path) => ({
      rule: `json:${path}`,
      segs: parseJsonPath(path),
      replacement: `"${placeholder(`json:${path}`)}"`,
    }));
    const params = [...this.paramSet].map(escapeRegex).join('|');
    this.textParams = params ? new RegExp(`(?<=[?&;])(?:${params})=[^&#\\s"'<>]+`, 'gi') : undefined;
    const headers = [...this.headerSet].map(escapeRegex).join('|');
    this.textHeaders = headers ? new RegExp(`(?<![A-Za-z0-9-])(${headers})([ \\t]*:[ \\t]*)([^\\r\\n]+)`, 'gi') : undefined;
  }

  /** Redacts secret header values and, on a request line, secret query values and key shapes in the target. */
  redactHead(head: Buffer, side: 'request' | 'response'): { head: Buffer; fired: Firing[] } {
    const text = head.toString('latin1');
    // Keep the separators so that joining the parts reproduces the input exactly.
    const parts = text.split(/(\r?\n)/);
    const spans: Span[] = [];
    let offset = 0;
    let previous: string | undefined; // header name, for obs-fold continuation lines
    for (let p = 0; p < parts.length; p++) {
      const line = parts[p]!;
      if (p % 2 === 0 && line !== '') {
        if (p === 0) {
          if (side === 'request') this.requestLineSpans(line, offset, spans);
        } else if (line[0] === ' ' || line[0] === '\t') {
          if (previous !== undefined) this.headerValueSpans(previous, line, offset, side, spans, true);
        } else {
          const colon = line.indexOf(':');
          previous = colon > 0 ? line.slice(0, colon).trim().toLowerCase() : undefined;
          if (previous !== undefined) this.headerValueSpans(previous, line.slice(colon + 1), offset + colon + 1, side, spans);
        }
      }
      offset += line.length;
    }
    if (spans.length === 0) return { head, fired: [] };
    const { text: out, fired } = this.apply(text, spans, true);
    return { head: Buffer.from(out, 'latin1'), fired };
  }

  /**
   * Scans a complete (de-chunked) body. gzip/deflate/br bodies are decoded and scanned; if nothing fired the
   * original encoded bytes come back (decoded: false), otherwise the redacted decoded bytes (decoded: true) and
   * the caller drops Content-Encoding. Unknown or corrupt encodings are scanned as they are.
   */
  redactBody(
    body: Buffer,
    side: 'request' | 'response',
    contentEncoding: string | undefined,
    contentType: string | undefined,
  ): { body: Buffer; fired: Firing[]; decoded: boolean } {
    if (body.length === 0) return { body, fired: [], decoded: false };
    const encoding = contentEncoding?.trim().toLowerCase();
    if (encoding && encoding !== 'identity') {
      const plain = decodeContentCoding(body, encoding, MAX_DECODED_BYTES);
      if (plain) {
        const result = this.scanBody(plain, side, contentType);
        // Untouched: keep the original encoded bytes so the recording stays byte-faithful.
        if (result.fired.length === 0) return { body, fired: [], decoded: false };
        return { body: result.body, fired: result.fired, decoded: true };
      }
    }
    return { ...this.scanBody(body, side, contentType), decoded: false };
  }

  /** Redacts secrets inside a single string (URL, log line, error text). Records nothing. */
  redactText(text: string): string {
    // Named rules first: on a tie (same stretch) the first span pushed labels it.
    const spans: Span[] = [];
    for (const m of text.matchAll(URL_USERINFO)) {
      const start = m.index + m[1]!.length;
      spans.push(this.span(start, start + m[2]!.length, 'url-password', ''));
    }
    if (this.textParams) {
      for (const m of text.matchAll(this.textParams)) {
        const eq = m[0].indexOf('=');
        const rule = `query:${m[0].slice(0, eq).toLowerCase()}`;
        spans.push(this.span(m.index + eq + 1, m.index + m[0].length, rule, ''));
      }
    }
    if (this.textHeaders) {
      for (const m of text.matchAll(this.textHeaders)) {
        const valueStart = m.index + m[1]!.length + m[2]!.length;
        spans.push(this.headerSpan(m[1]!.toLowerCase(), m[3]!, valueStart, ''));
      }
    }
    this.patternSpans(this.all, text, 0, '', spans);
    return spans.length === 0 ? text : this.apply(text, spans, false).text;
  }

  // --- internals -----------------------------------------------------------------------------------------

  private span(start: number, end: number, rule: string, where: string): Span {
    return { start, end, replacement: placeholder(rule), rule, where };
  }

  /** Span replacing a secret header's value, keeping an auth scheme (`Bearer `, `Basic `, `AWS4-HMAC-SHA256 `). */
  private headerSpan(name: string, value: string, start: number, where: string, keepScheme = true): Span {
    const rule = `header:${name}`;
    if (keepScheme && isAuthHeader(name)) {
      const m = AUTH_SCHEME.exec(value);
      // A "scheme" that itself looks like a key is a bare credential with a space in it: redact it all.
      if (m && !this.hasKeyShape(m[1]!)) {
        return this.span(start + m[0].length, start + value.length, rule, where);
      }
    }
    return this.span(start, start + value.length, rule, where);
  }

  private hasKeyShape(text: string): boolean {
    const found: Span[] = [];
    this.patternSpans(this.builtin, text, 0, '', found);
    return found.length > 0;
  }

  private requestLineSpans(line: string, offset: number, spans: Span[]): void {
    const first = line.indexOf(' ');
    const last = line.lastIndexOf(' ');
    if (first < 0 || last <= first) return;
    this.targetSpans(line.slice(first + 1, last), offset + first + 1, 'request', undefined, spans);
  }

  /**
   * A request target or URL: secret query parameters by name, key shapes anywhere, user patterns in the query,
   * and a password in `scheme://user:pass@`. `fixedWhere` (for URL headers) overrides the per-part `where`.
   */
  private targetSpans(target: string, offset: number, side: string, fixedWhere: string | undefined, spans: Span[]): void {
    const q = target.indexOf('?');
    const pathEnd = q < 0 ? target.length : q;
    const otherWhere = fixedWhere ?? `${side}.target`;
    this.patternSpans(this.builtin, target.slice(0, pathEnd), offset, otherWhere, spans);
    for (const m of target.slice(0, pathEnd).matchAll(URL_USERINFO)) {
      const start = offset + m.index + m[1]!.length;
      spans.push(this.span(start, start + m[2]!.length, 'url-password', otherWhere));
    }
    if (q < 0) return;

    const hash = target.indexOf('#', q);
    const query = target.slice(q + 1, hash < 0 ? target.length : hash);
    const queryOffset = offset + q + 1;
    const paramWhere = (name: string) => fixedWhere ?? `${side}.query${name ? `:${name}` : ''}`;
    // Parameter spans first so that, on a tie, the named rule labels the value.
    const params: { start: number; end: number; name: string }[] = [];
    for (const m of query.matchAll(/[^&]+/g)) {
      const eq = m[0].indexOf('=');
      const name = decodeQueryName(eq < 0 ? '' : m[0].slice(0, eq));
      params.push({ start: m.index, end: m.index + m[0].length, name });
      if (eq >= 0 && eq < m[0].length - 1 && this.paramSet.has(name)) {
        spans.push(this.span(queryOffset + m.index + eq + 1, queryOffset + m.index + m[0].length, `query:${name}`, paramWhere(name)));
      }
    }
    // Key shapes and user patterns over the whole query, labelled with the parameter the match starts in.
    const found: Span[] = [];
    this.patternSpans(this.all, query, 0, '', found);
    for (const s of found) {
      const param = params.find((p) => s.start >= p.start && s.start < p.end);
      spans.push({ ...s, start: s.start + queryOffset, end: s.end + queryOffset, where: paramWhere(param?.name ?? '') });
    }
    if (hash >= 0) this.patternSpans(this.builtin, target.slice(hash), offset + hash, otherWhere, spans);
  }

  /** `raw` is everything after the colon (or a whole obs-fold continuation line), starting at `offset` in the head. */
  private headerValueSpans(name: string, raw: string, offset: number, side: string, spans: Span[], continuation = false): void {
    // Leading and trailing whitespace stays verbatim; only the value proper is replaced.
    const lead = /^[ \t]*/.exec(raw)![0].length;
    const value = raw.slice(lead).replace(/[ \t]+$/, '');
    if (value === '') return;
    const where = `${side}.header:${name}`;
    // A continuation line holds no scheme: its first word is part of the credential.
    if (this.headerSet.has(name)) spans.push(this.headerSpan(name, value, offset + lead, where, !continuation));
    else if (URL_HEADERS.has(name)) this.targetSpans(value, offset + lead, side, where, spans);
    // Key shapes are secrets wherever they appear, so other header values get the built-in scan too.
    else this.patternSpans(this.builtin, value, offset + lead, where, spans);
  }

  private scanBody(body: Buffer, side: string, contentType: string | undefined): { body: Buffer; fired: Firing[] } {
    const text = body.toString('latin1');
    const where = `${side}.body`;
    const spans: Span[] = [];
    if (this.jsonPaths.length > 0) {
      const type = mediaType(contentType);
      if (isJsonType(type)) {
        const start = text.startsWith('\xef\xbb\xbf') ? 3 : 0; // UTF-8 BOM
        this.jsonSpans(text, start, text.length, where, spans);
      } else if (type === 'text/event-stream') {
        for (const m of text.matchAll(/^data:[ ]?([^\r\n]*)/gm)) {
          const payload = m[1]!;
          if (!/^\s*[[{]/.test(payload)) continue;
          const start = m.index + m[0].length - payload.length;
          this.jsonSpans(text, start, start + payload.length, where, spans);
        }
      }
    }
    this.patternSpans(this.all, text, 0, where, spans);
    if (spans.length === 0) return { body, fired: [] };
    const { text: out, fired } = this.apply(text, spans, true);
    return { body: Buffer.from(out, 'latin1'), fired };
  }

  /** Spans for JSON-path rules in the document text[from, to); nothing if it is not valid JSON. */
  private jsonSpans(text: string, from: number, to: number, where: string, spans: Span[]): void {
    const found: Span[] = [];
    const ok = walkJson(text, from, to, (path, start, end) => {
      const hit = this.jsonPaths.find((p) => pathMatches(p.segs, path));
      if (!hit) return;
      found.push({ start, end, replacement: hit.replacement, rule: hit.rule, where: `${where}:${formatPath(path)}` });
    });
    if (ok) for (const span of found) spans.push(span); // no spread: there can be more spans than call arguments
  }

  /** Collects matches of compiled patterns in `text`, shifted by `offset`. */
  private patternSpans(compiled: CompiledPatterns[], text: string, offset: number, where: string, spans: Span[]): void {
    for (const { regex, rules } of compiled) {
      regex.lastIndex = 0;
      let m: RegExpExecArray | null;
      while ((m = regex.exec(text)) !== null) {
        if (m[0].length === 0) {
          regex.lastIndex++; // lookaround-only user patterns: nothing to replace
          continue;
        }
        let g = 0;
        if (rules.length > 1) while (g < rules.length - 1 && m[g + 1] === undefined) g++;
        // A pattern may name the part to replace at its end, `(?<secret>…)`; what comes before it stays.
        const secret = m.groups?.secret;
        const start = secret === undefined ? m.index : m.index + m[0].length - secret.length;
        spans.push(this.span(offset + start, offset + m.index + m[0].length, rules[g]!, where));
      }
    }
  }

  /**
   * Splices spans into `text` (latin1 byte text when `latin1`) in one pass. Leftmost wins, then longest (so a
   * JSON-path value or a header value swallows key shapes inside it). A span partly overlapping an earlier one
   * (possible with user regexes) has its remainder redacted too, so no tail of a secret survives. Firings are
   * deduplicated by (rule, where).
   */
  private apply(text: string, spans: Span[], latin1: boolean): { text: string; fired: Firing[] } {
    spans.sort((a, b) => a.start - b.start || b.end - a.end);
    const out: string[] = [];
    const fired = new Map<string, Map<string, Firing>>(); // rule -> where -> firing
    let pos = 0;
    for (const s of spans) {
      if (s.end <= pos) continue;
      // Byte text is latin1: a placeholder with non-ASCII (from a user JSON path) must go in as its UTF-8 bytes.
      const replacement = latin1 && /[^\x00-\x7f]/.test(s.replacement) ? Buffer.from(s.replacement).toString('latin1') : s.replacement;
      out.push(text.slice(pos, Math.max(s.start, pos)), replacement);
      pos = s.end;
      if (s.where === '') continue;
      let byWhere = fired.get(s.rule);
      if (!byWhere) fired.set(s.rule, (byWhere = new Map()));
      // `where` can carry names taken from the traffic (JSON keys, parameter names): scrub it as well.
      if (!byWhere.has(s.where)) byWhere.set(s.where, { rule: s.rule, where: this.redactText(s.where) });
    }
    out.push(text.slice(pos));
    return { text: out.join(''), fired: [...fired.values()].flatMap((m) => [...m.values()]) };
  }
}

/**
 * Patterns without capture groups and with the same flags share one alternation regex, so a body costs one
 * scan for all of them; the capture group that matched names the rule. Others get a regex each.
 */
function compilePatterns(patterns: readonly { name: string; regex: string; flags: string }[]): CompiledPatterns[] {
  const combinable = new Map<string, { name: string; regex: string }[]>();
  const out: CompiledPatterns[] = [];
  // patterns with groups run after the combined ones: on the same stretch, the first span found names the rule
  const single: CompiledPatterns[] = [];
  for (const p of patterns) {
    let groups: number;
    try {
      // `(?:re)|` always matches "", and the result array has one slot per capture group.
      groups = new RegExp(`(?:${p.regex})|`, p.flags).exec('')!.length - 1;
    } catch (err) {
      throw new RedactionRulesError(`pattern "${p.name}" has an invalid regex: ${(err as Error).message}`);
    }
    if (groups > 0) {
      single.push({ regex: new RegExp(p.regex, `${p.flags}g`), rules: [p.name] });
    } else {
      const list = combinable.get(p.flags) ?? [];
      list.push(p);
      combinable.set(p.flags, list);
    }
  }
  for (const [flags, list] of combinable) {
    out.push({ regex: new RegExp(list.map((p) => `(${p.regex})`).join('|'), `${flags}g`), rules: list.map((p) => p.name) });
  }
  return [...out, ...single];
}

