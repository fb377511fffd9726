import { brotliDecompressSync, gunzipSync, inflateRawSync, inflateSync } from 'node:zlib';

/**
 * Undoes one HTTP content coding (gzip, x-gzip, deflate, br). Returns undefined for an unknown coding, a body
 * that does not decode, or one that would decode past `maxOutputLength` (a guard against zip bombs).
 */
export function decodeContentCoding(body: Buffer, coding: string, maxOutputLength: number): Buffer | undefined {
  const options = { maxOutputLength };
  try {
    switch (coding.trim().toLowerCase()) {
      case 'gzip':
      case 'x-gzip':
        return gunzipSync(body, options);
      case 'deflate':
        // "deflate" is meant to be zlib-wrapped, but some peers send raw deflate.
        try {
          return inflateSync(body, options);
        } catch {
          return inflateRawSync(body, options);
        }
      case 'br':
        return brotliDecompressSync(body, options);
      default:
        return undefined;
    }
  } catch {
    return undefined;
  }
}

/** The chunks' payload of a chunked body; null when the framing is malformed. A body cut off at a chunk boundary
 * (a recording that ended mid-stream) yields what arrived. */
export function dechunk(body: Buffer): Buffer | null {
  const parts: Buffer[] = [];
  let pos = 0;
  while (pos < body.length) {
    const lineEnd = body.indexOf('\r\n', pos, 'latin1');
    if (lineEnd < 0) return null;
    const sizeText = body.toString('latin1', pos, lineEnd).split(';')[0]!.trim();
    if (!/^[0-9a-fA-F]{1,12}$/.test(sizeText)) return null;
    const size = parseInt(sizeText, 16);
    if (size === 0) return Buffer.concat(parts);
    const start = lineEnd + 2;
    if (start + size > body.length) return null;
    parts.push(body.subarray(start, start + size));
    pos = start + size;
    if (pos < body.length) {
      if (body[pos] !== 0x0d || body[pos + 1] !== 0x0a) return null;
      pos += 2;
    }
  }
  // No terminating chunk: the recording was cut at a chunk boundary; what arrived is still the entity so far.
  return Buffer.concat(parts);
}

/**
 * The entity a stored body carries: de-chunked when `transferEncoding` says chunked, then decoded per
 * `contentEncoding` (codings undone last to first). Falls back to the undecoded entity when a coding fails.
 */
export function decodeEntityBody(body: Buffer, transferEncoding: string | undefined, contentEncoding: string | undefined, maxOutputLength: number): Buffer {
  let entity = body;
  if (/(?:^|,)\s*chunked\s*$/i.test(transferEncoding ?? '')) entity = dechunk(body) ?? body;
  return decodeCodings(entity, contentEncoding ?? '', maxOutputLength) ?? entity;
}

/** Undoes a Content-Encoding list (codings are listed in the order applied: undone last to first); undefined
 * when one of them does not decode. An empty or `identity` list returns the body itself. */
export function decodeCodings(body: Buffer, contentEncoding: string, maxOutputLength: number): Buffer | undefined {
  const codings = contentEncoding
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
  let decoded = body;
  for (let i = codings.length - 1; i >= 0; i--) {
    const next = decodeContentCoding(decoded, codings[i]!, maxOutputLength);
    if (!next) return undefined;
    decoded = next;
  }
  return decoded;
}
