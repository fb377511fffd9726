import type { HeaderField, MessageHead } from './http1.js';

/** Headers that belong to one connection (RFC 9110 section 7.6.1) and never reach the origin. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'upgrade']);

export interface ForwardedHead {
  raw: Buffer;
  dropped: string[];
}

function connectionListed(head: MessageHead): Set<string> {
  const listed = new Set<string>();
  for (const field of head.headers) {
    if (field.name.toLowerCase() !== 'connection') continue;
    for (const token of field.value.split(',')) {
      const name = token.trim().toLowerCase();
      // Never let Connection drop the framing or Host of the message itself.
      if (name && name !== 'transfer-encoding' && name !== 'content-length' && name !== 'host') listed.add(name);
    }
  }
  return listed;
}

/**
 * The request head as the origin receives it: the client's bytes with hop-by-hop and Proxy-* lines removed
 * (everything else, order, case and spacing included, untouched), the request line replaced when given,
 * and header values replaced where `replace` says so.
 */
export function forwardRequestHead(
  head: MessageHead,
  options: { requestLine?: string; replace?: Map<string, string> } = {},
): ForwardedHead {
  const listed = connectionListed(head);
  const dropped: string[] = [];
  const parts: Buffer[] = [];
  const firstLineEnd = head.raw.indexOf('\r\n');
  parts.push(options.requestLine !== undefined ? Buffer.from(`${options.requestLine}\r\n`, 'latin1') : head.raw.subarray(0, firstLineEnd + 2));
  for (const field of head.headers) {
    const lower = field.name.toLowerCase();
    if (HOP_BY_HOP.has(lower) || lower.startsWith('proxy-') || listed.has(lower)) {
      dropped.push(field.name);
      continue;
    }
    const replacement = options.replace?.get(lower);
    parts.push(replacement === undefined ? head.raw.subarray(field.start, field.end) : replaceFieldValue(head.raw, field, replacement));
  }
  parts.push(Buffer.from('\r\n'));
  return { raw: Buffer.concat(parts), dropped };
}

/** One header line with its value replaced, keeping the name's case and the spacing around the value. */
export function replaceFieldValue(raw: Buffer, field: HeaderField, value: string): Buffer {
  const line = raw.toString('latin1', field.start, field.end - 2);
  const colon = line.indexOf(':');
  const afterColon = line.slice(colon + 1);
  const leading = afterColon.length - afterColon.trimStart().length;
  const trailing = afterColon.length - afterColon.trimEnd().length;
  const rebuilt = line.slice(0, colon + 1 + leading) + value + (trailing > 0 ? afterColon.slice(afterColon.length - trailing) : '');
  return Buffer.from(`${rebuilt}\r\n`, 'latin1');
}

/** Rebuilds a head from its start line and header lines, for stored heads whose framing headers were rewritten. */
export function rewriteHeaders(
  head: MessageHead,
  options: { remove?: string[]; set?: [string, string][] },
): Buffer {
  const remove = new Set((options.remove ?? []).map((n) => n.toLowerCase()));
  const set = new Map((options.set ?? []).map(([n, v]) => [n.toLowerCase(), v] as const));
  const done = new Set<string>();
  const firstLineEnd = head.raw.indexOf('\r\n');
  const parts: Buffer[] = [head.raw.subarray(0, firstLineEnd + 2)];
  for (const field of head.headers) {
    const lower = field.name.toLowerCase();
    if (remove.has(lower)) continue;
    const value = set.get(lower);
    if (value !== undefined) {
      if (done.has(lower)) continue;
      done.add(lower);
      parts.push(replaceFieldValue(head.raw, field, value));
      continue;
    }
    parts.push(head.raw.subarray(field.start, field.end));
  }
  for (const [lower, value] of set) {
    if (!done.has(lower)) parts.push(Buffer.from(`${options.set!.find(([n]) => n.toLowerCase() === lower)![0]}: ${value}\r\n`, 'latin1'));
  }
  parts.push(Buffer.from('\r\n'));
  return Buffer.concat(parts);
}
