import { randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { NameConstraintsError, constraintsFor, loadOrCreateAuthority } from './ca/authority.js';
import { LeafMinter } from './ca/leaf.js';
import { Redactor, loadRuleSet, type RuleSet } from './capture/redact.js';
import { TraceWriter } from './capture/recorder.js';
import { createLogger, type Logger } from './log.js';
import { HomePermissionsError, checkHomePermissions, ensureHome, type HomePaths } from './home.js';
import type { ConnectToRule } from './proxy/connect-to.js';
import { DEFAULT_TIMEOUTS, type ConnectionTimeouts, type LocalResponse } from './proxy/connection.js';
import { ProxyListener } from './proxy/listener.js';
import { SessionRegistry, type Session, type SessionTarget } from './proxy/sessions.js';
import { ReplayError, ReplayPlayer, type ReplayOptions } from './replay/player.js';
import type { ReplayReport } from './replay/verdict.js';
import { UpstreamPool } from './proxy/upstream.js';
import { FORMAT_VERSION, defaultTraceName, encodeExchange, isValidTraceName, type TraceMeta, type WorkspaceMeta } from './trace/schema.js';
import { listTraces, storeReader, traceRecords } from './trace/reader.js';
import { UiService } from './ui/server.js';
import { BundleError, importBundle, parseBundle } from './trace/bundle.js';
import { convertToStructural, TierError, type ConversionResult } from './trace/tiers.js';
import { RetentionConfigError, loadStructuralOptions, collectGarbage, expiresAt, expiryFor, isExpired, loadRetention, type RetentionPolicy } from './trace/retention.js';
import type { FileChange } from './launch/workspace.js';
import type { CompareTag, ReplayOutcome } from './replay/verdict.js';
import { TraceStore, type TraceSummary } from './trace/store.js';

export { VERSION } from './version.js';
import { VERSION } from './version.js';

export interface DaemonOptions {
  home: string;
  host?: string;
  /** 0 picks an ephemeral port */
  port?: number;
  intercept: string[];
  connectTo?: ConnectToRule[];
  /** PEM contents of extra CAs trusted for upstream TLS */
  upstreamCAs?: string[];
  /** trace for traffic without session credentials (default: a new trace, created on first use) */
  trace?: string;
  redactRulesFile?: string;
  /** LevelDB compression (tests switch it off to scan the files for plaintext) */
  storeCompression?: boolean;
  logger?: Logger;
  /** started by `record` for its own duration rather than as a long-running service */
  ephemeral?: boolean;
  /** a CA created now is limited (X.509 name constraints) to the intercepted hosts */
  nameConstraints?: boolean;
  /** listening beyond loopback was asked for (--allow-remote): every request then needs session credentials */
  requireCredentials?: boolean;
  /** hosts whose minted leaf (TLS context) is kept in memory, least recently used out first (default 1000) */
  leafCacheSize?: number;
  /** header and idle timeouts for client connections (defaults: 30 s and 300 s) */
  timeouts?: ConnectionTimeouts;
  /** `daemon --replay NAME`: anonymous traffic replays this trace instead of recording */
  replay?: { trace: string } & ReplayOptions;
}

export interface DaemonState {
  pid: number;
  host: string;
  port: number;
  token: string;
  startedAt: number;
  version: string;
  ephemeral: boolean;
}

export interface SessionRequest {
  /** default `record` */
  mode?: 'record' | 'replay';
  /** the trace to record into, or to replay (`last` allowed for replay) */
  trace?: string;
  /** replay options */
  diagnostic?: boolean;
  pace?: 'fast' | 'recorded';
  allowLive?: string[];
  force?: boolean;
  /** how a recording was started (default `env`) */
  source?: TraceMeta['source'];
  /** retention tier of a new recording (default `full`) */
  tier?: 'full' | 'structural';
  command?: string[];
  cwd?: string;
  ownerPid?: number;
  keepsDaemonAlive?: boolean;
}

export interface SessionInfo {
  mode: 'record' | 'replay';
  /** the session's id: the trace name when recording, the run ID when replaying */
  id: string;
  trace: string;
  token: string;
  proxyUrl: string;
  baseUrlPrefix: string;
}

/** What the launching command reports when a session ends. */
export interface SessionResult {
  exitCode?: number;
  signal?: string;
  /** record: files the run added, removed, modified */
  workspaceDiff?: FileChange[];
  /** replay: how the run ended compared with the recording */
  outcome?: ReplayOutcome;
  /** replay run of `compare`: which invocation and arm (kept in the report) */
  compare?: CompareTag;
}

export type SessionEnd =
  | { mode: 'record'; id: string; trace: string; summary: TraceSummary; writeErrors: number }
  | { mode: 'replay'; id: string; trace: string; report: ReplayReport };

export class DaemonError extends Error {
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message);
  }
}

function sameSecret(a: string, b: string): boolean {
  const left = Buffer.from(a);
  const right = Buffer.from(b);
  return left.length === right.length && timingSafeEqual(left, right);
}

/** Writes a file readable only by its owner, atomically. */
export function writePrivateFile(path: string, content: string): void {
  const temp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileSync(temp, content, { mode: 0o600 });
  renameSync(temp, path);
}

/**
 * The recording daemon: one loopback listener, the CA, the store, the sessions. Usable from code;
 * the `daemon` and `record` commands are thin views over it.
 */
export class Daemon {
  readonly token = randomBytes(24).toString('base64url');
  private anonymous: Promise<TraceWriter> | null = null;
  private anonymousReplay: ReplayPlayer | null = null;
  private gcTimer: NodeJS.Timeout | null = null;
  /** `daemon --replay`: the anonymous replay's report, once the daemon stopped */
  finalReplayReport: ReplayReport | null = null;
  private stopping: Promise<void> | null = null;
  private ownerWatch: NodeJS.Timeout | null = null;
  private idleWaiters: (() => void)[] = [];
  port = 0;
  host = '127.0.0.1';
  /** the trace viewer, under /__mitm-replay/ui/ on the listener (the control token signs a browser in) */
  readonly ui: UiService;

  private constructor(
    readonly options: DaemonOptions,
    readonly paths: HomePaths,
    readonly store: TraceStore,
    readonly redactor: Redactor,
    readonly log: Logger,
    readonly pool: UpstreamPool,
    readonly listener: ProxyListener,
    readonly anonymousTraceName: string,
    readonly sessions: SessionRegistry,
    readonly retention: RetentionPolicy,
  ) {
    this.ui = new UiService({
      token: this.token,
      // the daemon's own store; the viewer never closes it
      reader: { ...storeReader(store), close: async () => undefined },
      policy: () => this.retention,
      port: () => this.port,
    });
  }

  static async start(options: DaemonOptions): Promise<Daemon> {
    const paths = ensureHome(options.home);
    try {
      checkHomePermissions(paths);
    } catch (err) {
      if (err instanceof HomePermissionsError) throw new DaemonError(err.message, 403);
      throw err;
    }
    const log = options.logger ?? createLogger();
    let retention: RetentionPolicy;
    try {
      retention = loadRetention(options.home);
    } catch (err) {
      if (err instanceof RetentionConfigError) throw new DaemonError(err.message, 400);
      throw err;
    }
    const rules: RuleSet = loadRuleSet(options.redactRulesFile ?? paths.redactRules, options.redactRulesFile === undefined);
    const redactor = new Redactor(rules);
    let constraints: string[] | undefined;
    try {
      constraints = options.nameConstraints ? constraintsFor(options.intercept) : undefined;
    } catch (err) {
      if (err instanceof NameConstraintsError) throw new DaemonError(err.message, 400);
      throw err;
    }
    const ca = await loadOrCreateAuthority(options.home, { nameConstraints: constraints });
    if (constraints && !ca.created) log.warn('name constraints apply when a CA is created; the existing CA in this home keeps what it was created with');
    const minter = new LeafMinter(ca, { cacheSize: options.leafCacheSize });
    const store = await TraceStore.open(paths.store, { compression: options.storeCompression ?? process.env.MITM_REPLAY_STORE_COMPRESSION !== '0' });
    if (store.migration) log.info(store.migration, 'migrated the trace store to the current format');
    const cutOff = await store.markOpenExchangesIncomplete();
    if (cutOff > 0) log.warn({ exchanges: cutOff }, 'marked exchanges cut off by an earlier crash as incomplete');
    const anonymousTraceName = options.trace ?? defaultTraceName();
    if (!isValidTraceName(anonymousTraceName)) {
      await store.close();
      throw new DaemonError(`invalid trace name '${anonymousTraceName}': use 1-64 of A-Z a-z 0-9 . _ -`, 400);
    }
    let self: Daemon | null = null;
    const sessions = new SessionRegistry();
    const pool = new UpstreamPool({
      connectTo: options.connectTo ?? [],
      extraCAs: options.upstreamCAs ?? [],
      isSelf: (host, port) => self?.isSelf(host, port) ?? false,
    });
    const listener = new ProxyListener({
      pool,
      minter,
      sessions,
      intercept: options.intercept,
      log,
      anonymousTarget: () => self!.anonymousTarget(),
      control: (method, path, authorization, body) => self!.control(method, path, authorization, body),
      controlAuthorized: (authorization) => self!.controlAuthorized(authorization),
      ui: (request) => self!.ui.handle(request),
      isSelf: (host, port) => self?.isSelf(host, port) ?? false,
      listenHost: () => self?.host ?? '127.0.0.1',
      timeouts: options.timeouts ?? DEFAULT_TIMEOUTS,
      requireCredentials: options.requireCredentials ?? false,
    });
    const daemon = new Daemon(options, paths, store, redactor, log, pool, listener, anonymousTraceName, sessions, retention);
    self = daemon;
    try {
      await daemon.listen(options.host ?? '127.0.0.1', options.port ?? 8877);
    } catch (err) {
      await store.close();
      const code = (err as { code?: string }).code;
      if (code === 'EADDRINUSE') throw new DaemonError(`${options.host ?? '127.0.0.1'}:${options.port} is already in use: stop what listens there or pick another with --listen`, 409);
      throw err;
    }
    if (options.replay) {
      try {
        const trace = await daemon.resolveTraceName(options.replay.trace);
        await daemon.refuseExpired(trace);
        daemon.anonymousReplay = await ReplayPlayer.load(store, trace, options.replay);
      } catch (err) {
        await daemon.stop();
        if (err instanceof ReplayError) throw new DaemonError(err.message, err.status);
        throw err;
      }
    } else if (options.trace !== undefined && (await store.getTrace(options.trace))) {
      // Restarted with the same --trace (after a crash, say): continue that trace and note the restart.
      daemon.anonymous = daemon.openWriter(options.trace, { source: 'daemon' }, 'resume');
      await daemon.anonymous;
    }
    daemon.writeState();
    daemon.ownerWatch = setInterval(() => daemon.reapDeadOwners(), 1000);
    daemon.ownerWatch.unref();
    // Expired traces are deleted hourly (and by `mitm-replay gc`).
    daemon.gcTimer = setInterval(() => void daemon.gc().catch((err: Error) => log.error({ err: err.message }, 'gc failed')), 60 * 60 * 1000);
    daemon.gcTimer.unref();
    log.info({ listen: `${daemon.host}:${daemon.port}`, home: options.home, trace: anonymousTraceName, intercept: options.intercept.length }, 'mitm-replay daemon listening');
    return daemon;
  }

  private async listen(host: string, port: number): Promise<void> {
    const server = this.listener.server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port }, () => {
        server.removeListener('error', reject);
        resolve();
      });
    });
    const address = server.address() as net.AddressInfo;
    this.host = address.address;
    this.port = address.port;
  }

  get url(): string {
    return `http://${net.isIPv6(this.host) ? `[${this.host}]` : this.host}:${this.port}`;
  }

  get state(): DaemonState {
    return { pid: process.pid, host: this.host, port: this.port, token: this.token, startedAt: Date.now(), version: VERSION, ephemeral: this.options.ephemeral ?? false };
  }

  private writeState(): void {
    writePrivateFile(this.paths.stateFile, `${JSON.stringify(this.state, null, 2)}\n`);
  }

  private removeState(): void {
    try {
      const current = JSON.parse(readFileSync(this.paths.stateFile, 'utf8')) as DaemonState;
      if (current.pid === process.pid && current.port === this.port) rmSync(this.paths.stateFile, { force: true });
    } catch {
      // no state file, or not ours
    }
  }

  /** True for this daemon's own listening address (any loopback or unspecified alias of it). */
  isSelf(host: string, port: number): boolean {
    if (port !== this.port) return false;
    const normal = host.toLowerCase().replace(/^\[(.*)\]$/, '$1');
    const loopback = normal === 'localhost' || normal === '::1' || normal.startsWith('127.') || normal === '0.0.0.0' || normal === '::';
    return normal === this.host || (loopback && (this.host.startsWith('127.') || this.host === '::1' || this.host === '0.0.0.0' || this.host === '::'));
  }

  private baseMeta(name: string, source: TraceMeta['source']): TraceMeta {
    return {
      name,
      formatVersion: FORMAT_VERSION,
      createdAt: Date.now(),
      mode: 'record',
      source,
      intercept: this.options.intercept,
      redaction: this.redactor.rules,
      restarts: [],
      tier: 'full',
      expiresAt: expiryFor(this.retention, Date.now()),
    };
  }

  /**
   * Deletes expired traces (never one being recorded) and the blobs and chunks nothing refers to any more. The
   * hourly run looks for unreferenced chunks only after a deletion; the `gc` command (`sweep: 'always'`) always.
   */
  gc(sweep: 'always' | 'if-needed' = 'if-needed'): ReturnType<typeof collectGarbage> {
    const live = new Set([...this.sessions.all().filter((s) => s.target.kind === 'record').map((s) => s.id), this.anonymousTraceName]);
    return collectGarbage(this.store, this.retention, live, { sweep });
  }

  /** full → structural (one way); refused while the trace is being recorded or replayed. */
  async convertTier(name: string): Promise<ConversionResult> {
    const trace = await this.resolveTraceName(name);
    const busy = this.sessions.all().some((s) => (s.target.kind === 'record' ? s.target.writer.name : s.target.player.trace) === trace);
    if (busy || trace === this.anonymousTraceName) throw new DaemonError(`trace '${trace}' is in use by a live session; end it first`, 409);
    try {
      return await convertToStructural(this.store, trace, this.retention, loadStructuralOptions(this.options.home));
    } catch (err) {
      if (err instanceof TierError) throw new DaemonError(err.message, 400);
      throw err;
    }
  }

  /** Pins a trace (it never expires) or releases it (it expires by the policy again). */
  async keep(name: string, release: boolean): Promise<TraceMeta> {
    const meta = await this.store.getTrace(await this.resolveTraceName(name));
    if (!meta) throw new DaemonError(`no trace named '${name}'`, 404);
    const updated: TraceMeta = release ? { ...meta, kept: false, expiresAt: expiryFor(this.retention, meta.createdAt, meta.tier) } : { ...meta, kept: true };
    await this.store.putTrace(updated);
    return updated;
  }

  private async openWriter(name: string, init: Partial<TraceMeta> & { source: TraceMeta['source'] }, existing: 'resume' | 'replace' | 'refuse'): Promise<TraceWriter> {
    const found = await this.store.getTrace(name);
    if (found && existing === 'refuse') {
      throw new DaemonError(`trace '${name}' already exists: pick another name with --trace, or pass --force to replace it`, 409);
    }
    if (found && existing === 'resume') {
      const meta: TraceMeta = { ...found, restarts: [...found.restarts, Date.now()] };
      delete meta.finishedAt;
      await this.store.putTrace(meta);
      this.log.info({ trace: name }, 'continuing an existing trace after a restart');
      return new TraceWriter(this.store, meta, (await this.store.lastSeq(name)) + 1, this.redactor);
    }
    if (found) await this.store.deleteTrace(name);
    const meta: TraceMeta = { ...this.baseMeta(name, init.source), ...init };
    await this.store.putTrace(meta);
    return new TraceWriter(this.store, meta, 0, this.redactor);
  }

  anonymousWriter(): Promise<TraceWriter> {
    this.anonymous ??= this.openWriter(this.anonymousTraceName, { source: 'daemon' }, 'resume');
    return this.anonymous;
  }

  async anonymousTarget(): Promise<SessionTarget> {
    if (this.anonymousReplay) return { kind: 'replay', player: this.anonymousReplay };
    return { kind: 'record', writer: await this.anonymousWriter() };
  }

  /** Expired traces cannot be replayed (even before gc deletes them); the error says when they expired. */
  private async refuseExpired(trace: string): Promise<void> {
    const meta = await this.store.getTrace(trace);
    if (meta && isExpired(meta, this.retention)) {
      throw new DaemonError(`trace '${trace}' expired at ${new Date(expiresAt(meta, this.retention)!).toISOString()} and can no longer be replayed (pin the traces you need with 'mitm-replay keep NAME')`, 410);
    }
  }

  /** `last` → the most recently created trace. */
  async resolveTraceName(name: string): Promise<string> {
    if (name !== 'last') return name;
    const latest = await this.store.latestTraceName();
    if (!latest) throw new DaemonError(`there is no trace yet in ${this.options.home} (record one with 'mitm-replay record -- CMD')`, 404);
    return latest;
  }

  async registerSession(request: SessionRequest): Promise<SessionInfo> {
    if (this.stopping) throw new DaemonError('the daemon is shutting down', 503);
    if (request.mode === 'replay') return this.registerReplay(request);
    const name = request.trace ?? defaultTraceName();
    if (!isValidTraceName(name)) throw new DaemonError(`invalid trace name '${name}': use 1-64 of A-Z a-z 0-9 . _ - (not 'last')`, 400);
    if (this.sessions.get(name)) throw new DaemonError(`trace '${name}' is being recorded by a live session: pick another name with --trace`, 409);
    if (name === this.anonymousTraceName) throw new DaemonError(`trace '${name}' is the daemon's trace for anonymous traffic: pick another name with --trace`, 409);
    const tier = request.tier ?? 'full';
    const tierMeta: Partial<TraceMeta> = tier === 'structural' ? { tier, structural: loadStructuralOptions(this.options.home), expiresAt: expiryFor(this.retention, Date.now(), 'structural') } : {};
    const writer = await this.openWriter(name, { source: request.source ?? 'env', command: request.command, cwd: request.cwd, ...tierMeta }, request.force ? 'replace' : 'refuse');
    this.log.info({ trace: name, source: request.source }, 'session started');
    return this.addSession(name, { kind: 'record', writer }, request);
  }

  private addSession(id: string, target: SessionTarget, request: SessionRequest): SessionInfo {
    const session: Session = {
      id,
      token: SessionRegistry.newToken(),
      target,
      createdAt: Date.now(),
      ownerPid: request.ownerPid,
      keepsDaemonAlive: request.keepsDaemonAlive ?? false,
    };
    this.sessions.add(session);
    return this.sessionInfo(session);
  }

  private async registerReplay(request: SessionRequest): Promise<SessionInfo> {
    if (request.trace === undefined) throw new DaemonError('replay needs a trace name (or last)', 400);
    const trace = await this.resolveTraceName(request.trace);
    if (!isValidTraceName(trace)) throw new DaemonError(`invalid trace name '${trace}': use 1-64 of A-Z a-z 0-9 . _ -`, 400);
    if (this.sessions.get(trace)) throw new DaemonError(`trace '${trace}' is still being recorded: end that session before replaying it`, 409);
    await this.refuseExpired(trace);
    let player: ReplayPlayer;
    try {
      player = await ReplayPlayer.load(this.store, trace, {
        diagnostic: request.diagnostic ?? false,
        pace: request.pace ?? 'fast',
        allowLive: request.allowLive ?? [],
        cwd: request.cwd,
      });
    } catch (err) {
      if (err instanceof ReplayError) throw new DaemonError(err.message, err.status);
      throw err;
    }
    this.log.info({ trace, run: player.runId }, 'replay session started');
    return this.addSession(player.runId, { kind: 'replay', player }, request);
  }

  sessionInfo(session: Session): SessionInfo {
    const credentials = `${encodeURIComponent(session.id)}:${encodeURIComponent(session.token)}`;
    const host = net.isIPv6(this.host) ? `[${this.host}]` : this.host;
    return {
      mode: session.target.kind,
      id: session.id,
      trace: session.target.kind === 'record' ? session.target.writer.name : session.target.player.trace,
      token: session.token,
      proxyUrl: `http://${credentials}@${host}:${this.port}`,
      baseUrlPrefix: `${this.url.replace(/^http:/, 'https:')}/__mitm-replay/b/${credentials}`,
    };
  }

  /**
   * Ends a session and closes its trace. `notify: false` leaves waking `whenIdle()` to the caller, so a control
   * request is answered before an in-process daemon that was waiting for it stops.
   */
  async endSession(id: string, result: SessionResult = {}, notify = true): Promise<SessionEnd> {
    const session = this.sessions.remove(id);
    if (!session) throw new DaemonError(`no live session named '${id}'`, 404);
    try {
      return await this.finishTarget(id, session.target, result);
    } finally {
      if (notify) this.notifyIfIdle();
    }
  }

  /** Closes a recording (its trace) or a replay (its report is stored with the trace). */
  /** Ends a session that failed before its command started; a recording's trace is deleted (it holds nothing). */
  async abortSession(id: string): Promise<void> {
    const session = this.sessions.remove(id);
    if (!session) throw new DaemonError(`no live session named '${id}'`, 404);
    if (session.target.kind === 'record') {
      await session.target.writer.flush(true);
      await this.store.deleteTrace(session.target.writer.name);
    }
    this.notifyIfIdle();
  }

  /** Records the workspace snapshot of a recording session (sent by `record` before its command starts). */
  async setSessionWorkspace(id: string, workspace: WorkspaceMeta): Promise<void> {
    const session = this.sessions.get(id);
    if (!session || session.target.kind !== 'record') throw new DaemonError(`no live recording session named '${id}'`, 404);
    const { writer } = session.target;
    writer.meta = { ...writer.meta, workspace };
    await this.store.putTrace(writer.meta);
  }

  private async finishTarget(id: string, target: SessionTarget, result: SessionResult): Promise<SessionEnd> {
    if (target.kind === 'record') {
      const { writer } = target;
      const workspace = writer.meta.workspace && result.workspaceDiff ? { ...writer.meta.workspace, diff: result.workspaceDiff } : writer.meta.workspace;
      await writer.finish({ exitCode: result.exitCode, signal: result.signal, workspace });
      this.log.info({ trace: writer.name }, 'session ended');
      return { mode: 'record', id, trace: writer.name, summary: await this.store.summarize(writer.name), writeErrors: writer.writeErrors };
    }
    const report = target.player.report(result);
    await this.store.putReport(report.trace, report.runId, report);
    this.log.info({ trace: report.trace, run: report.runId, verdict: report.verdict.ending }, 'replay session ended');
    return { mode: 'replay', id, trace: report.trace, report };
  }

  /** A replay report of a trace: the given run, or the trace's latest. */
  async findReport(trace: string, runId?: string): Promise<ReplayReport> {
    return findReport(this.store, await this.resolveTraceName(trace), runId);
  }

  /** Sessions whose owning process died end on their own, so a crashed `record` does not pin the daemon. */
  private reapDeadOwners(): void {
    for (const session of this.sessions.all()) {
      if (session.ownerPid === undefined || session.ownerPid === process.pid) continue;
      try {
        process.kill(session.ownerPid, 0);
      } catch {
        this.log.warn({ session: session.id, pid: session.ownerPid }, 'session owner exited without ending its session');
        void this.endSession(session.id).catch(() => undefined);
      }
    }
  }

  private notifyIfIdle(): void {
    if (this.sessions.all().some((s) => s.keepsDaemonAlive)) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const resolve of waiters) resolve();
  }

  /** Resolves when no session that keeps the daemon alive remains (used by `record`'s in-process daemon). */
  whenIdle(): Promise<void> {
    if (!this.sessions.all().some((s) => s.keepsDaemonAlive)) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  controlAuthorized(authorization: string | undefined): boolean {
    const bearer = /^Bearer\s+(\S+)$/i.exec(authorization ?? '')?.[1];
    return bearer !== undefined && sameSecret(bearer, this.token);
  }

  async control(method: string, path: string, authorization: string | undefined, body: Buffer): Promise<LocalResponse> {
    const json = (status: number, value: unknown): LocalResponse => ({ status, headers: { 'content-type': 'application/json' }, body: `${JSON.stringify(value)}\n` });
    if (!this.controlAuthorized(authorization)) return json(401, { error: 'the control API needs the token from the daemon state file' });
    try {
      if (method === 'GET' && path === '/health') return json(200, { ok: true, pid: process.pid, version: VERSION, sessions: this.sessions.all().length });
      if (method === 'POST' && path === '/sessions') {
        const request = JSON.parse(body.toString('utf8') || '{}') as SessionRequest;
        return json(201, await this.registerSession(request));
      }
      if (method === 'PUT' && path === '/blobs') return json(201, { hash: await this.store.putBlob(body) });
      const blob = /^\/blobs\/([0-9a-f]{64})$/.exec(path);
      if (method === 'GET' && blob) {
        const content = await this.store.getBlob(blob[1]!);
        return content ? { status: 200, headers: { 'content-type': 'application/octet-stream' }, body: content } : json(404, { error: 'no such blob' });
      }
      if (method === 'GET' && path === '/traces') return json(200, await listTraces(this.store));
      const records = /^\/traces\/([^/?]+)\/exchanges$/.exec(path);
      if (method === 'GET' && records) return json(200, await traceRecords(this.store, await this.resolveTraceName(decodeURIComponent(records[1]!))));
      if (method === 'POST' && path === '/gc') return json(200, await this.gc('always'));
      const tierChange = /^\/traces\/([^/?]+)\/tier$/.exec(path);
      if (method === 'POST' && tierChange) return json(200, await this.convertTier(decodeURIComponent(tierChange[1]!)));
      const keep = /^\/traces\/([^/?]+)\/keep$/.exec(path);
      if (method === 'POST' && keep) return json(200, await this.keep(decodeURIComponent(keep[1]!), (JSON.parse(body.toString('utf8') || '{}') as { release?: boolean }).release === true));
      const reports = /^\/traces\/([^/?]+)\/reports$/.exec(path);
      if (method === 'GET' && reports) return json(200, await this.store.listReports(await this.resolveTraceName(decodeURIComponent(reports[1]!))));
      if (method === 'POST' && path.startsWith('/import')) {
        const query = new URLSearchParams(path.split('?')[1] ?? '');
        if (this.sessions.get(query.get('trace') ?? '')) throw new DaemonError(`trace '${query.get('trace')}' is being recorded by a live session`, 409);
        try {
          const bundle = parseBundle(body, 'the bundle');
          return json(200, await importBundle(this.store, bundle, { name: query.get('trace') ?? undefined, force: query.get('force') === '1', expiresAt: expiryFor(this.retention, Date.now()) }));
        } catch (err) {
          if (err instanceof BundleError) throw new DaemonError(err.message, 400);
          throw err;
        }
      }
      const one = /^\/traces\/([^/?]+)\/exchanges\/(\d+)$/.exec(path);
      if (method === 'GET' && one) {
        const exchange = await this.store.getExchange(await this.resolveTraceName(decodeURIComponent(one[1]!)), Number(one[2]));
        return exchange ? { status: 200, headers: { 'content-type': 'application/octet-stream' }, body: encodeExchange(exchange) } : json(404, { error: 'no such exchange' });
      }
      const traceMeta = /^\/traces\/([^/?]+)$/.exec(path);
      if (method === 'GET' && traceMeta) {
        const meta = await this.store.getTrace(await this.resolveTraceName(decodeURIComponent(traceMeta[1]!)));
        return meta ? json(200, meta) : json(404, { error: `no trace named '${decodeURIComponent(traceMeta[1]!)}'` });
      }
      const workspace = /^\/sessions\/([^/]+)\/workspace$/.exec(path);
      if (method === 'POST' && workspace) {
        await this.setSessionWorkspace(decodeURIComponent(workspace[1]!), JSON.parse(body.toString('utf8')) as WorkspaceMeta);
        return json(200, { ok: true });
      }
      if (method === 'GET' && path.startsWith('/reports?')) {
        const query = new URLSearchParams(path.slice('/reports?'.length));
        return json(200, await this.findReport(query.get('trace') ?? 'last', query.get('run') ?? undefined));
      }
      const abort = /^\/sessions\/([^/]+)$/.exec(path);
      if (method === 'DELETE' && abort) {
        await this.abortSession(decodeURIComponent(abort[1]!));
        return json(200, { ok: true });
      }
      const end = /^\/sessions\/([^/]+)\/end$/.exec(path);
      if (method === 'POST' && end) {
        const result = JSON.parse(body.toString('utf8') || '{}') as SessionResult;
        try {
          return { ...json(200, await this.endSession(decodeURIComponent(end[1]!), result, false)), afterWrite: () => this.notifyIfIdle() };
        } catch (err) {
          this.notifyIfIdle();
          throw err;
        }
      }
      return json(404, { error: `no control endpoint ${method} ${path}` });
    } catch (err) {
      if (err instanceof DaemonError) return json(err.status, { error: err.message });
      if (err instanceof SyntaxError) return json(400, { error: 'request body is not JSON' });
      this.log.error({ err: (err as Error).message }, 'control request failed');
      return json(500, { error: (err as Error).message });
    }
  }

  /** Stops accepting, marks in-flight exchanges incomplete, closes every trace and the store. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      if (this.ownerWatch) clearInterval(this.ownerWatch);
      if (this.gcTimer) clearInterval(this.gcTimer);
      this.removeState();
      const closed = new Promise<void>((resolve) => this.listener.server.close(() => resolve()));
      for (const session of this.sessions.all()) {
        this.sessions.remove(session.id);
        await this.finishTarget(session.id, session.target, {}).catch((err: Error) => this.log.error({ err: err.message }, 'closing a session failed'));
      }
      if (this.anonymousReplay) {
        const report = this.anonymousReplay.report();
        this.finalReplayReport = report;
        await this.store.putReport(report.trace, report.runId, report).catch(() => undefined);
      }
      if (this.anonymous) {
        const writer = await this.anonymous.catch(() => null);
        if (writer) await writer.finish({});
      }
      this.listener.destroyAll();
      this.pool.close();
      await closed;
      await this.store.close();
      this.notifyIfIdle();
      this.log.info('mitm-replay daemon stopped');
    })();
    return this.stopping;
  }
}

export async function findReport(store: TraceStore, trace: string, runId?: string): Promise<ReplayReport> {
  if (!(await store.getTrace(trace))) throw new DaemonError(`no trace named '${trace}'`, 404);
  if (runId !== undefined) {
    const report = await store.getReport<ReplayReport>(trace, runId);
    if (!report) throw new DaemonError(`trace '${trace}' has no replay run '${runId}'`, 404);
    return report;
  }
  const reports = await store.listReports<ReplayReport>(trace);
  const latest = reports.at(-1);
  if (!latest) throw new DaemonError(`trace '${trace}' has not been replayed yet (mitm-replay replay ${trace} -- CMD)`, 404);
  return latest;
}
