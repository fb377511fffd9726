import type net from 'node:net';
import { once } from 'node:events';
import { ExchangeRecorder, type TraceWriter } from '../capture/recorder.js';
import type { Logger } from '../log.js';
import type { Origin, Route } from '../trace/schema.js';
import { forwardRequestHead } from './head.js';
import {
  HttpParseError,
  RequestParser,
  ResponseParser,
  headerValue,
  isInformational,
  type ParseEvent,
  type RequestHead,
  type ResponseHead,
} from './http1.js';
import { UpstreamError, type UpstreamConnection, type UpstreamPool } from './upstream.js';

/** What to do with one request, decided by whoever owns the connection (listener or TLS interception). */
export type Dispatch =
  | {
      kind: 'forward';
      origin: Origin;
      route: Route;
      /** null: forwarded but not recorded (a host outside the intercept policy on the plain-HTTP proxy) */
      writer: TraceWriter | null;
      /** origin-form target the origin receives */
      target: string;
      /** replaced request line / header values (absolute-form and base-URL requests) */
      requestLine?: string;
      replace?: Map<string, string>;
      clientTarget?: string;
    }
  | { kind: 'local'; respond: (body: Buffer) => Promise<LocalResponse> | LocalResponse; maxBody?: number }
  /** a request served by another module (replay) on this connection */
  | { kind: 'handler'; handler: RequestHandler }
  | { kind: 'handoff'; take: (socket: net.Socket, leftover: Buffer) => void };

export interface LocalResponse {
  status: number;
  reason?: string;
  headers?: Record<string, string>;
  body: string | Buffer;
  close?: boolean;
  /** runs once the response has been handed to the socket (e.g. a daemon may stop only after answering) */
  afterWrite?: () => void;
}

export interface ConnectionContext {
  pool: UpstreamPool;
  log: Logger;
  dispatch: (head: RequestHead, socket: net.Socket) => Promise<Dispatch> | Dispatch;
  /** connections still open, so the daemon can close them on shutdown */
  track?: (socket: net.Socket) => void;
  timeouts?: ConnectionTimeouts;
}

/** Slow or silent clients must not hold connections forever (slowloris). */
export interface ConnectionTimeouts {
  /** from a request's first byte to its complete head (default 30 s): then 408 and close */
  headerMs: number;
  /** a keep-alive connection waiting for its next request (default 300 s): then closed */
  idleMs: number;
}

export const DEFAULT_TIMEOUTS: ConnectionTimeouts = { headerMs: 30_000, idleMs: 300_000 };

const MAX_LOCAL_BODY = 1024 * 1024;

export function localResponseBytes(response: LocalResponse): Buffer {
  const body = typeof response.body === 'string' ? Buffer.from(response.body) : response.body;
  const headers: Record<string, string> = {
    'content-type': 'text/plain; charset=utf-8',
    ...response.headers,
    'content-length': String(body.length),
  };
  if (response.close) headers.connection = 'close';
  const reason = response.reason ?? STATUS_TEXT[response.status] ?? 'Error';
  const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  return Buffer.concat([Buffer.from(`HTTP/1.1 ${response.status} ${reason}\r\n${lines}\r\n`, 'latin1'), body]);
}

const STATUS_TEXT: Record<number, string> = {
  200: 'OK',
  201: 'Created',
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  407: 'Proxy Authentication Required',
  409: 'Conflict',
  413: 'Content Too Large',
  431: 'Request Header Fields Too Large',
  500: 'Internal Server Error',
  501: 'Not Implemented',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

function wantsClose(head: RequestHead | ResponseHead): boolean {
  const connection = (headerValue(head, 'connection') ?? '').toLowerCase();
  if (connection.split(',').some((t) => t.trim() === 'close')) return true;
  return head.version === 'HTTP/1.0' && !connection.split(',').some((t) => t.trim() === 'keep-alive');
}

/**
 * Serves HTTP/1.1 requests arriving on one client socket (plain, or decrypted TLS), one at a time.
 * Streaming is a tee: every upstream chunk goes to the client at once, with backpressure both ways.
 */
export class HttpConnection {
  private readonly parser = new RequestParser();
  private closed = false;

  constructor(
    private readonly socket: net.Socket,
    private readonly context: ConnectionContext,
  ) {
    socket.setNoDelay?.(true);
    socket.on('error', () => undefined);
    socket.on('close', () => {
      this.closed = true;
    });
    // armTimers sets the idle timeout between requests; a connection idle that long is closed quietly.
    socket.on('timeout', () => socket.destroy());
  }

  private headerTimer: NodeJS.Timeout | null = null;

  /**
   * Between requests the connection may idle (idle timeout); once a request's first bytes arrive its head must
   * complete within the header timeout; while a request is being answered, no timeout (streams can be slow).
   */
  private armTimers(waiting: boolean): void {
    const { headerMs, idleMs } = this.context.timeouts ?? DEFAULT_TIMEOUTS;
    if (!waiting) {
      this.socket.setTimeout(0);
      this.clearHeaderTimer();
      return;
    }
    if (this.parser.hasBufferedBytes) {
      this.socket.setTimeout(0);
      this.headerTimer ??= setTimeout(() => {
        this.context.log.debug('request head not complete in time');
        this.socket.end(localResponseBytes({ status: 408, body: `mitm-replay: the request head did not arrive within ${headerMs / 1000} s\n`, close: true }));
        this.socket.destroySoon?.();
      }, headerMs);
    } else {
      this.clearHeaderTimer();
      this.socket.setTimeout(idleMs);
    }
  }

  private clearHeaderTimer(): void {
    if (this.headerTimer) clearTimeout(this.headerTimer);
    this.headerTimer = null;
  }

  async run(): Promise<void> {
    const iterator = this.socket.iterator({ destroyOnReturn: false });
    let exchange: RequestHandler | null = null;
    this.socket.once('close', () => this.clearHeaderTimer());
    this.armTimers(true);
    try {
      for await (const chunk of iterator as AsyncIterable<Buffer>) {
        let queue: ParseEvent<RequestHead>[];
        try {
          queue = this.parser.push(chunk);
        } catch (err) {
          this.refuseMalformed(err, exchange);
          return;
        }
        while (queue.length > 0) {
          const event = queue.shift()!;
          if (event.type === 'head') {
            this.armTimers(false);
            const decided = this.context.dispatch(event.head, this.socket);
            const dispatch = decided instanceof Promise ? await decided : decided;
            if (dispatch.kind === 'handoff') {
              dispatch.take(this.socket, this.parser.takeBuffered());
              return;
            }
            exchange =
              dispatch.kind === 'local'
                ? new LocalHandler(this.socket, dispatch.respond, dispatch.maxBody)
                : dispatch.kind === 'handler'
                  ? dispatch.handler
                  : new ForwardHandler(this.socket, this.context, event.head, dispatch);
            // Handlers answer synchronously where they can; awaiting only real promises keeps the per-request
            // cost of the loop down (replay serves most requests without a single await).
            const begun = exchange.begin();
            if (begun) await begun;
          } else if (event.type === 'body') {
            const written = exchange!.body(event.wire, event.payload);
            if (written) await written;
          } else {
            const ended = exchange!.end();
            const keepAlive = (ended instanceof Promise ? await ended : ended) && !this.closed;
            exchange = null;
            if (!keepAlive) {
              this.socket.end();
              return;
            }
            try {
              queue.push(...this.parser.next());
            } catch (err) {
              this.refuseMalformed(err, null);
              return;
            }
          }
        }
        this.armTimers(exchange === null);
      }
      // Client closed its side.
      exchange?.clientGone();
    } catch (err) {
      exchange?.clientGone();
      this.context.log.debug({ err: (err as Error).message }, 'client connection ended with an error');
      this.socket.destroy();
    }
  }

  private refuseMalformed(err: unknown, exchange: RequestHandler | null): void {
    if (!(err instanceof HttpParseError)) throw err;
    if (exchange) {
      exchange.clientGone();
      this.socket.destroy();
      return;
    }
    this.context.log.debug({ reason: err.message }, 'malformed request');
    this.socket.end(localResponseBytes({ status: err.status, body: `mitm-replay: ${err.message}\n`, close: true }));
  }
}

/** One request's life on a connection: its head was parsed; body slices follow; `end` answers it. */
export interface RequestHandler {
  begin(): Promise<void> | void;
  body(wire: Buffer, payload: Buffer[]): Promise<void> | void;
  /** resolves when the response is complete; true when the client connection can serve another request */
  end(): Promise<boolean> | boolean;
  clientGone(): void;
}

/** A request answered by the daemon itself (control API, errors such as 407). */
class LocalHandler implements RequestHandler {
  private readonly chunks: Buffer[] = [];
  private size = 0;

  constructor(
    private readonly socket: net.Socket,
    private readonly respond: (body: Buffer) => Promise<LocalResponse> | LocalResponse,
    private readonly maxBody = MAX_LOCAL_BODY,
  ) {}

  async begin(): Promise<void> {}

  async body(_wire: Buffer, payload: Buffer[]): Promise<void> {
    for (const part of payload) {
      this.size += part.length;
      if (this.size <= this.maxBody) this.chunks.push(part);
    }
  }

  async end(): Promise<boolean> {
    const response =
      this.size > this.maxBody ? { status: 413, body: 'mitm-replay: request body too large\n', close: true } : await this.respond(Buffer.concat(this.chunks));
    this.socket.write(localResponseBytes(response), () => response.afterWrite?.());
    return !response.close;
  }

  clientGone(): void {}
}

/** A request forwarded to its origin and teed into the trace. */
class ForwardHandler implements RequestHandler {
  private upstream: UpstreamConnection | null = null;
  private recorder: ExchangeRecorder | null = null;
  private readonly responseParser = new ResponseParser();
  private responseStarted = false;
  private finished = false;
  private failed = false;
  private upstreamReusable = false;
  private responseWantsClose = false;
  private lastHeadInformational = false;
  private resolveDone!: () => void;
  private readonly done = new Promise<void>((resolve) => {
    this.resolveDone = resolve;
  });

  constructor(
    private readonly client: net.Socket,
    private readonly context: ConnectionContext,
    private readonly head: RequestHead,
    private readonly dispatch: Extract<Dispatch, { kind: 'forward' }>,
  ) {}

  async begin(): Promise<void> {
    const { origin, route, writer, target } = this.dispatch;
    const forwarded = forwardRequestHead(this.head, { requestLine: this.dispatch.requestLine, replace: this.dispatch.replace });
    if (writer) {
      this.recorder = new ExchangeRecorder(writer, {
        origin,
        route,
        method: this.head.method,
        target,
        forwardedHead: forwarded.raw,
        droppedHeaders: forwarded.dropped,
        clientTarget: this.dispatch.clientTarget,
        parsedHead: this.head,
      });
    }
    this.client.once('close', this.onClientClose);
    try {
      this.upstream = await this.context.pool.acquire(origin);
    } catch (err) {
      this.failBeforeResponse(err as Error);
      return;
    }
    if (this.finished) {
      this.upstream.socket.destroy();
      return;
    }
    const socket = this.upstream.socket;
    this.responseParser.expectResponseTo(this.head.method);
    socket.on('data', this.onUpstreamData);
    socket.once('end', this.onUpstreamEnd);
    socket.once('error', this.onUpstreamError);
    socket.once('close', this.onUpstreamEnd);
    // A pooled connection may come back paused (its last client stopped reading): listen first, then resume.
    socket.resume();
    socket.write(forwarded.raw);
  }

  async body(wire: Buffer, payload: Buffer[]): Promise<void> {
    this.recorder?.requestBody(wire, payload);
    const socket = this.upstream?.socket;
    if (!socket || this.finished || socket.destroyed) return;
    if (!socket.write(wire)) {
      await Promise.race([once(socket, 'drain'), this.done]);
    }
  }

  async end(): Promise<boolean> {
    this.recorder?.requestEnd();
    await this.done;
    this.client.removeListener('close', this.onClientClose);
    if (this.upstream) {
      const socket = this.upstream.socket;
      socket.removeListener('data', this.onUpstreamData);
      socket.removeListener('end', this.onUpstreamEnd);
      socket.removeListener('error', this.onUpstreamError);
      socket.removeListener('close', this.onUpstreamEnd);
      if (this.upstreamReusable && !this.responseWantsClose) this.context.pool.release(this.upstream);
      else socket.destroy();
    }
    return !this.failed && !this.responseWantsClose && !wantsClose(this.head);
  }

  clientGone(): void {
    this.onClientClose();
  }

  private readonly onClientClose = (): void => {
    if (this.finished) return;
    // A client that disconnects aborts the upstream request.
    this.upstream?.socket.destroy();
    this.finish();
    this.recorder?.fail('client-aborted', 'the client closed the connection before the response completed', 'client');
  };

  private readonly onUpstreamData = (chunk: Buffer): void => {
    let events: ParseEvent<ResponseHead>[];
    try {
      events = this.responseParser.push(chunk);
    } catch (err) {
      const message = `the upstream sent a malformed response: ${(err as Error).message}`;
      // Before any byte reached the client it gets a 502 saying so (as proxies do); mid-body it is cut off.
      if (this.responseStarted) this.failMidResponse('bad-response', message);
      else this.failBeforeResponse(new UpstreamError(message, 'bad-response', 'response'));
      return;
    }
    // What arrived in one read leaves in one write (one TLS record for head and body, not two).
    this.recorder?.beginRead();
    this.client.cork();
    try {
      this.handleResponseEvents(events);
    } finally {
      this.client.uncork();
    }
  };

  private handleResponseEvents(events: ParseEvent<ResponseHead>[]): void {
    for (const event of events) {
      if (event.type === 'head') {
        this.lastHeadInformational = isInformational(event.head);
        this.writeToClient(event.head.raw);
        if (this.lastHeadInformational) continue;
        this.responseStarted = true;
        this.responseWantsClose = wantsClose(event.head) || this.isCloseDelimited(event.head);
        this.recorder?.onResponseHead(event.head.raw, event.head.status, event.head);
      } else if (event.type === 'body') {
        this.writeToClient(event.wire);
        this.recorder?.responseBody(event.wire, event.payload);
      } else if (!this.lastHeadInformational) {
        this.upstreamReusable = true;
        this.complete();
        return;
      }
    }
  }

  private isCloseDelimited(head: ResponseHead): boolean {
    if (this.head.method === 'HEAD' || head.status === 204 || head.status === 304) return false;
    return headerValue(head, 'content-length') === undefined && !/chunked/i.test(headerValue(head, 'transfer-encoding') ?? '');
  }

  private writeToClient(bytes: Buffer): void {
    if (this.client.destroyed) return;
    if (!this.client.write(bytes)) {
      const upstream = this.upstream?.socket;
      upstream?.pause();
      this.client.once('drain', () => upstream?.resume());
    }
  }

  private readonly onUpstreamEnd = (): void => {
    if (this.finished) return;
    const { events, incomplete } = this.responseParser.finish();
    if (!incomplete && events.some((e) => e.type === 'end') && this.responseStarted) {
      // A close-delimited body ends with the connection.
      this.responseWantsClose = true;
      this.complete();
      return;
    }
    if (!this.responseStarted) {
      this.failBeforeResponse(new UpstreamError('the upstream closed the connection without a response', 'ECONNRESET', 'connect'));
      return;
    }
    this.failMidResponse('upstream-reset', 'the upstream closed the connection before the response completed');
  };

  private readonly onUpstreamError = (err: Error & { code?: string }): void => {
    if (this.finished) return;
    if (!this.responseStarted) this.failBeforeResponse(new UpstreamError(`upstream error: ${err.message}`, err.code ?? 'EUPSTREAM', 'connect'));
    else this.failMidResponse(err.code ?? 'upstream-error', `upstream error mid-response: ${err.message}`);
  };

  private complete(): void {
    if (this.finished) return;
    this.finish();
    this.recorder?.complete();
  }

  private finish(): void {
    this.finished = true;
    this.resolveDone();
  }

  /** Nothing reached the client yet: answer 502 with the reason, as a proxy does. */
  private failBeforeResponse(err: Error): void {
    if (this.finished) return;
    const code = err instanceof UpstreamError ? err.code : 'EUPSTREAM';
    const phase = err instanceof UpstreamError ? err.phase : 'upstream';
    this.failed = true;
    this.upstream?.socket.destroy();
    this.finish();
    this.recorder?.fail(code, err.message, phase);
    const { origin } = this.dispatch;
    this.context.log.warn({ host: origin.host, port: origin.port, code }, 'upstream request failed');
    if (!this.client.destroyed) {
      this.client.write(
        localResponseBytes({
          status: code === 'ETIMEDOUT' ? 504 : 502,
          headers: { 'x-mitm-replay-error': code },
          body: `mitm-replay: ${err.message}\n`,
          close: true,
        }),
      );
    }
  }

  /** The response was cut off: cut the client off too, so it sees the same failure it would see directly. */
  private failMidResponse(code: string, message: string): void {
    if (this.finished) return;
    this.failed = true;
    this.upstream?.socket.destroy();
    this.finish();
    this.recorder?.fail(code, message, 'response');
    this.client.destroy();
  }
}
