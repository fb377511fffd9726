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
