import { createHash } from 'node:crypto';
import { chunkLengths } from './chunking.js';
import { decodeExchange, recordHeader, type ExchangeRecord, type StoredExchange } from './schema.js';

/**
 * How the store keeps an exchange (store format 2; docs/trace-format.md):
 *
 *   'MRX2' | u32 BE JSON length | JSON record | request head | request body part | response head | response body part
 *
 * A body part is either `0x00` and the bytes (their length is in the record), or `0x01`, a u32 BE count and that
 * many 32-byte SHA-256 digests of content-defined chunks, each kept once under `c:<hex>`. Agents resend the whole
 * conversation on every turn, so request bodies repeat their prefixes: chunked, a 30-step run stores each part
 * of the conversation once instead of 30 times. Format 1 values ('MRX1', bodies inline) still decode.
 */
const MAGIC = Buffer.from('MRX2');
const INLINE = 0;
const CHUNKED = 1;

/** Bodies from this size up are chunked; smaller ones gain nothing worth a lookup per read. */
export const CHUNKED_BODY_MIN = 4 * 1024;
/** Bodies above this stay inline: chunking runs on the event loop (~3 ms per MiB), and downloads do not repeat. */
export const CHUNKED_BODY_MAX = 16 * 1024 * 1024;

const DIGEST = 32;

export interface EncodedValue {
  value: Buffer;
  /** the chunks the value refers to, by hex SHA-256 */
  chunks: Map<string, Buffer>;
}

function bodyPart(body: Buffer, chunks: Map<string, Buffer>): Buffer[] {
  if (body.length < CHUNKED_BODY_MIN || body.length > CHUNKED_BODY_MAX) return [Buffer.of(INLINE), body];
  const lengths = chunkLengths(body);
  const refs = Buffer.alloc(5 + lengths.length * DIGEST);
  refs[0] = CHUNKED;
  refs.writeUInt32BE(lengths.length, 1);
  let pos = 0;
  lengths.forEach((length, i) => {
    const chunk = body.subarray(pos, pos + length);
    pos += length;
    const digest = createHash('sha256').update(chunk).digest();
    digest.copy(refs, 5 + i * DIGEST);
    chunks.set(digest.toString('hex'), chunk);
  });
  return [refs];
}

export function encodeStoredValue(ex: StoredExchange): EncodedValue {
  const chunks = new Map<string, Buffer>();
  const value = Buffer.concat([recordHeader(MAGIC, ex.record), ex.requestHead, ...bodyPart(ex.requestBody, chunks), ex.responseHead, ...bodyPart(ex.responseBody, chunks)]);
  return { value, chunks };
}

interface Parsed {
  record: ExchangeRecord;
  requestHead: Buffer;
  requestBody: Buffer | string[];
  responseHead: Buffer;
  responseBody: Buffer | string[];
}

function parse(value: Buffer): Parsed {
  const jsonLength = value.readUInt32BE(4);
  let pos = 8 + jsonLength;
  const record = JSON.parse(value.toString('utf8', 8, pos)) as ExchangeRecord;
  const take = (n: number): Buffer => {
    if (pos + n > value.length) throw new Error(`exchange ${record.seq} is damaged: its value is shorter than its record says`);
    const part = value.subarray(pos, pos + n);
    pos += n;
    return part;
  };
  const body = (length: number): Buffer | string[] => {
    const kind = take(1)[0];
    if (kind === INLINE) return take(length);
    if (kind !== CHUNKED) throw new Error(`exchange ${record.seq} is damaged: unknown body part ${kind}`);
    const count = take(4).readUInt32BE(0);
    const digests = take(count * DIGEST);
    return Array.from({ length: count }, (_, i) => digests.toString('hex', i * DIGEST, (i + 1) * DIGEST));
  };
  const requestHead = take(record.request?.headLength ?? 0);
  const requestBody = body(record.request?.bodyLength ?? 0);
  const responseHead = take(record.response?.headLength ?? 0);
  const responseBody = body(record.response?.bodyLength ?? 0);
  return { record, requestHead, requestBody, responseHead, responseBody };
}

/** A value in the current encoding (format 2); otherwise a format-1 value (bodies inline). */
export const isFormat2 = (value: Buffer) => value.subarray(0, 4).equals(MAGIC);

/** Just the record of a stored value of either format (both start with magic, JSON length, JSON). */
export function recordOf(value: Buffer): ExchangeRecord {
  return JSON.parse(value.toString('utf8', 8, 8 + value.readUInt32BE(4))) as ExchangeRecord;
}

/** The chunks a stored value refers to (none for a format-1 value). */
export function chunkRefs(value: Buffer): string[] {
  if (!isFormat2(value)) return [];
  const { requestBody, responseBody } = parse(value);
  return [...(Array.isArray(requestBody) ? requestBody : []), ...(Array.isArray(responseBody) ? responseBody : [])];
}

/** Decodes a stored value of either format; `getChunks` returns the chunks' bytes (undefined for a missing one). */
export async function decodeStoredValue(value: Buffer, getChunks: (hashes: string[]) => Promise<(Buffer | undefined)[]>): Promise<StoredExchange> {
  if (!isFormat2(value)) return decodeExchange(value);
  const parsed = parse(value);
  const join = async (part: Buffer | string[], expected: number, what: string): Promise<Buffer> => {
    if (!Array.isArray(part)) return part;
    const chunks = await getChunks(part);
    const missing = chunks.findIndex((c) => c === undefined);
    if (missing >= 0) throw new Error(`exchange ${parsed.record.seq} is damaged: chunk ${part[missing]!.slice(0, 12)}… of its ${what} is missing from the store`);
    const body = Buffer.concat(chunks as Buffer[]);
    if (body.length !== expected) throw new Error(`exchange ${parsed.record.seq} is damaged: its ${what} has ${body.length} bytes, the record says ${expected}`);
    return body;
  };
  return {
    record: parsed.record,
    requestHead: parsed.requestHead,
    requestBody: await join(parsed.requestBody, parsed.record.request?.bodyLength ?? 0, 'request body'),
    responseHead: parsed.responseHead,
    responseBody: await join(parsed.responseBody, parsed.record.response?.bodyLength ?? 0, 'response body'),
  };
}
