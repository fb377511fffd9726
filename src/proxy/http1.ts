/**
 * A small, strict, incremental HTTP/1.1 message parser (sans-I/O).
 *
 * Why not node:http: capture must be verbatim (header order, case, spacing, duplicates, chunk framing), and
 * node's parser only exposes a normalised view. This parser hands back the exact head bytes and, for bodies,
 * both the wire bytes (framing included) and the decoded payload, without copying body data.
 */

export const MAX_HEAD_BYTES = 64 * 1024;
const MAX_CHUNK_LINE = 1024;
const CRLFCRLF = Buffer.from('\r\n\r\n');

export class HttpParseError extends Error {
  constructor(
    message: string,
    /** the status a server should answer with (400, 431, 501...) */
    readonly status: number,
  ) {
    super(message);
  }
}

export interface HeaderField {
  name: string;
  value: string;
  /** byte offsets of the whole line (including its CRLF) inside `head.raw` */
  start: number;
  end: number;
}

export interface MessageHead {
  /** exact bytes: start line, header lines, blank line */
  raw: Buffer;
  startLine: string;
  headers: HeaderField[];
}

export interface RequestHead extends MessageHead {
  kind: 'request';
  method: string;
  target: string;
  version: string;
}

export interface ResponseHead extends MessageHead {
  kind: 'response';
  version: string;
  status: number;
  reason: string;
}

export type ParseEvent<H> =
  | { type: 'head'; head: H }
  /** `wire` is this slice of the body as it crossed the wire; `payload` the entity bytes it carried */
  | { type: 'body'; wire: Buffer; payload: Buffer[] }
  | { type: 'end' };

export function headerValue(head: MessageHead, name: string): string | undefined {
  const lower = name.toLowerCase();
  const field = head.headers.find((h) => h.name.toLowerCase() === lower);
  return field?.value;
}

export function headerValues(head: MessageHead, name: string): string[] {
  const lower = name.toLowerCase();
  return head.headers.filter((h) => h.name.toLowerCase() === lower).map((h) => h.value);
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

function parseHeaderLines(raw: Buffer, firstLineEnd: number): HeaderField[] {
  const headers: HeaderField[] = [];
  let pos = firstLineEnd + 2;
  const stop = raw.length - 2; // the final blank line
  while (pos < stop) {
    const eol = raw.indexOf('\r\n', pos, 'latin1');
    if (eol < 0 || eol >= raw.length - 1) throw new HttpParseError('malformed header block', 400);
    const line = raw.toString('latin1', pos, eol);
    if (line.startsWith(' ') || line.startsWith('\t')) {
      throw new HttpParseError('obsolete header line folding is not accepted', 400);
    }
    const colon = line.indexOf(':');
    if (colon <= 0) throw new HttpParseError('header line without a name', 400);
    const name = line.slice(0, colon);
    if (!TOKEN.test(name)) throw new HttpParseError('invalid header name', 400);
    const value = line.slice(colon + 1).trim();
    if (/[\0\r\n]/.test(value)) throw new HttpParseError('invalid character in header value', 400);
    headers.push({ name, value, start: pos, end: eol + 2 });
    pos = eol + 2;
  }
  return headers;
}

type BodyMode =
  | { kind: 'none' }
  | { kind: 'length'; remaining: number }
  | { kind: 'chunked'; state: 'size' | 'data' | 'data-crlf' | 'trailer'; remaining: number }
  | { kind: 'close' };

/**
 * Framing of a message body per RFC 9112 section 6, strict about the ambiguities that enable request smuggling.
 */
function bodyModeFor(head: MessageHead, isRequest: boolean): BodyMode {
  const te = headerValues(head, 'transfer-encoding');
  const cl = headerValues(head, 'content-length');
  if (te.length > 0) {
    if (cl.length > 0 && isRequest) {
      throw new HttpParseError('both Transfer-Encoding and Content-Length given', 400);
    }
    const codings = te
      .join(',')
      .split(',')
      .map((c) => c.trim().toLowerCase())
      .filter(Boolean);
    if (codings[codings.length - 1] !== 'chunked') {
      if (isRequest) throw new HttpParseError('unsupported Transfer-Encoding', 501);
      return { kind: 'close' };
    }
    if (codings.filter((c) => c === 'chunked').length > 1) {
      throw new HttpParseError('chunked applied more than once', 400);
    }
    return { kind: 'chunked', state: 'size', remaining: 0 };
  }
  if (cl.length > 0) {
    const values = new Set(cl.flatMap((v) => v.split(',').map((x) => x.trim())));
    if (values.size !== 1) throw new HttpParseError('conflicting Content-Length values', 400);
    const [only] = [...values];
    if (!/^\d{1,15}$/.test(only!)) throw new HttpParseError('invalid Content-Length', 400);
    const length = Number(only);
    return length === 0 ? { kind: 'none' } : { kind: 'length', remaining: length };
  }
  return isRequest ? { kind: 'none' } : { kind: 'close' };
}

abstract class Http1Parser<H extends MessageHead> {
  private buffered: Buffer = Buffer.alloc(0);
  private body: BodyMode | null = null;
  /** after a message ends, parsing stops until `next()` is called: the caller answers one request at a time */
  private awaitingNext = false;

  protected abstract parseStartLine(line: string): Omit<H, keyof MessageHead>;
  protected abstract framing(head: H): BodyMode;

  /** True while inside a message (head seen, end not yet). */
  get inMessage(): boolean {
    return this.body !== null;
  }

  get hasBufferedBytes(): boolean {
    return this.buffered.length > 0;
  }

  /** Hands over bytes read past the current message (e.g. a ClientHello sent right after CONNECT). */
  takeBuffered(): Buffer {
    const rest = this.buffered;
    this.buffered = Buffer.alloc(0);
    return rest;
  }

  /** Feeds bytes; returns what they completed. Throws HttpParseError on a malformed message. */
  push(chunk: Buffer): ParseEvent<H>[] {
    this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
    return this.parse();
  }

  /** Allows the next message to be parsed (bytes already buffered are parsed now). */
  next(): ParseEvent<H>[] {
    this.awaitingNext = false;
    return this.parse();
  }

  /**
   * The connection reached EOF. Returns the events that completes (a close-delimited body ends here);
   * returns `incomplete: true` if a message was cut off.
   */
  finish(): { events: ParseEvent<H>[]; incomplete: boolean } {
    if (this.body?.kind === 'close') {
      this.body = null;
      return { events: [{ type: 'end' }], incomplete: false };
    }
    return { events: [], incomplete: this.body !== null || (!this.awaitingNext && this.buffered.length > 0) };
  }

  private parse(): ParseEvent<H>[] {
    const events: ParseEvent<H>[] = [];
    while (!this.awaitingNext && this.buffered.length > 0) {
      if (this.body === null) {
        const head = this.parseHead();
        if (!head) break;
        events.push({ type: 'head', head });
        this.body = this.framing(head);
        if (this.body.kind === 'none') this.endMessage(events);
        continue;
      }
      if (!this.parseBody(events)) break;
    }
    return events;
  }

  private endMessage(events: ParseEvent<H>[]): void {
    this.body = null;
    events.push({ type: 'end' });
    this.awaitingNext = this.stopsAfterMessage();
  }

  protected stopsAfterMessage(): boolean {
    return true;
  }

  private parseHead(): H | null {
    // Tolerate stray CRLFs between messages (RFC 9112 section 2.2).
    let skip = 0;
    while (skip + 1 < this.buffered.length && this.buffered[skip] === 13 && this.buffered[skip + 1] === 10) skip += 2;
    if (skip > 0) this.buffered = this.buffered.subarray(skip);
    const end = this.buffered.indexOf(CRLFCRLF);
    if (end < 0) {
      if (this.buffered.length > MAX_HEAD_BYTES) throw new HttpParseError('message head too large', 431);
      return null;
    }
    if (end + 4 > MAX_HEAD_BYTES) throw new HttpParseError('message head too large', 431);
    const raw = Buffer.from(this.buffered.subarray(0, end + 4));
    this.buffered = this.buffered.subarray(end + 4);
    const firstLineEnd = raw.indexOf('\r\n');
    const startLine = raw.toString('latin1', 0, firstLineEnd);
    const specific = this.parseStartLine(startLine);
    const headers = parseHeaderLines(raw, firstLineEnd);
    return { raw, startLine, headers, ...specific } as H;
  }

  /** Returns false when more bytes are needed. */
  private parseBody(events: ParseEvent<H>[]): boolean {
    const mode = this.body!;
    if (mode.kind === 'close') {
      const wire = this.buffered;
      this.buffered = Buffer.alloc(0);
      events.push({ type: 'body', wire, payload: [wire] });
      return false;
    }
    if (mode.kind === 'length') {
      const take = Math.min(mode.remaining, this.buffered.length);
      const wire = this.buffered.subarray(0, take);
      this.buffered = this.buffered.subarray(take);
      mode.remaining -= take;
      events.push({ type: 'body', wire, payload: [wire] });
      if (mode.remaining === 0) this.endMessage(events);
      return true;
    }
    if (mode.kind === 'chunked') return this.parseChunked(mode, events);
    return true;
  }

  private parseChunked(mode: Extract<BodyMode, { kind: 'chunked' }>, events: ParseEvent<H>[]): boolean {
    // Walk the buffered bytes, collecting payload slices, and emit one body event for everything consumed.
    let pos = 0;
    const payload: Buffer[] = [];
    const buf = this.buffered;
    let ended = false;
    let needMore = false;
    while (pos < buf.length && !ended) {
      if (mode.state === 'size') {
        const eol = buf.indexOf('\r\n', pos, 'latin1');
        if (eol < 0) {
          if (buf.length - pos > MAX_CHUNK_LINE) throw new HttpParseError('chunk size line too long', 400);
          needMore = true;
          break;
        }
        const line = buf.toString('latin1', pos, eol);
        const sizeText = line.split(';', 1)[0]!.trim();
        if (!/^[0-9a-fA-F]{1,12}$/.test(sizeText)) throw new HttpParseError('invalid chunk size', 400);
        mode.remaining = parseInt(sizeText, 16);
        pos = eol + 2;
        mode.state = mode.remaining === 0 ? 'trailer' : 'data';
      } else if (mode.state === 'data') {
        const take = Math.min(mode.remaining, buf.length - pos);
        payload.push(buf.subarray(pos, pos + take));
        pos += take;
        mode.remaining -= take;
        if (mode.remaining === 0) mode.state = 'data-crlf';
      } else if (mode.state === 'data-crlf') {
        if (buf.length - pos < 2) {
          needMore = true;
          break;
        }
        if (buf[pos] !== 13 || buf[pos + 1] !== 10) throw new HttpParseError('missing CRLF after chunk data', 400);
        pos += 2;
        mode.state = 'size';
      } else {
        // trailer section: lines until an empty line
        const eol = buf.indexOf('\r\n', pos, 'latin1');
        if (eol < 0) {
          if (buf.length - pos > MAX_HEAD_BYTES) throw new HttpParseError('trailer section too large', 431);
          needMore = true;
          break;
        }
        const empty = eol === pos;
        pos = eol + 2;
        if (empty) ended = true;
      }
    }
    if (pos > 0) {
      events.push({ type: 'body', wire: buf.subarray(0, pos), payload });
      this.buffered = buf.subarray(pos);
    }
    if (ended) {
      this.endMessage(events);
      return true;
    }
    return !needMore && this.buffered.length > 0;
  }
}

export class RequestParser extends Http1Parser<RequestHead> {
  protected parseStartLine(line: string): Omit<RequestHead, keyof MessageHead> {
    // The request target is visible ASCII only (RFC 9112 section 3.2); anything else is refused, not forwarded.
    const match = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) (HTTP\/1\.[01])$/.exec(line);
    if (!match) throw new HttpParseError('malformed request line', 400);
    return { kind: 'request', method: match[1]!, target: match[2]!, version: match[3]! };
  }

  protected framing(head: RequestHead): BodyMode {
    return bodyModeFor(head, true);
  }
}

export class ResponseParser extends Http1Parser<ResponseHead> {
  private requestMethods: string[] = [];

  /** The response parser must know which request a response answers: HEAD responses carry no body. */
  expectResponseTo(method: string): void {
    this.requestMethods.push(method.toUpperCase());
  }

  protected parseStartLine(line: string): Omit<ResponseHead, keyof MessageHead> {
    const match = /^(HTTP\/1\.[01]) (\d{3})(?: (.*))?$/.exec(line);
    if (!match) throw new HttpParseError('malformed status line', 502);
    return { kind: 'response', version: match[1]!, status: Number(match[2]), reason: match[3] ?? '' };
  }

  protected framing(head: ResponseHead): BodyMode {
    const method = this.requestMethods[0];
    const informational = head.status >= 100 && head.status < 200 && head.status !== 101;
    if (!informational) this.requestMethods.shift();
    if (informational || method === 'HEAD' || head.status === 204 || head.status === 304) return { kind: 'none' };
    if (method === 'CONNECT' && head.status >= 200 && head.status < 300) return { kind: 'none' };
    return bodyModeFor(head, false);
  }

  /** Informational (1xx) responses are part of one exchange; do not stop after them. */
  protected override stopsAfterMessage(): boolean {
    return false;
  }
}

/** True when an informational response (100 Continue etc.), which precedes the final response. */
export function isInformational(head: ResponseHead): boolean {
  return head.status >= 100 && head.status < 200 && head.status !== 101;
}
