import { openTraceReader, type TraceReader } from '../trace/reader.js';

/** How long the store stays open after the page's last request. */
const IDLE_MS = 1000;

/**
 * The reader of `mitm-replay ui` when no daemon ran at its start. LevelDB admits one process, so holding the
 * store for as long as the viewer is open would lock out `record`, `ls` and the rest in another terminal.
 * Instead the store (or a daemon started meanwhile, through its control API) is opened for a burst of page
 * requests and released IDLE_MS after the last one.
 */
export class LeasedReader implements TraceReader {
  private current: Promise<TraceReader> | null = null;
  private closing: Promise<void> = Promise.resolve();
  private users = 0;
  private idle: NodeJS.Timeout | null = null;

  constructor(private readonly home: string) {}

  private async connect(): Promise<TraceReader> {
    await this.closing;
    // (openTraceReader waits a few seconds for a store another process holds for a moment)
    return openTraceReader(this.home);
  }

  private async use<T>(read: (reader: TraceReader) => Promise<T>): Promise<T> {
    this.users++;
    if (this.idle) clearTimeout(this.idle);
    this.idle = null;
    try {
      this.current ??= this.connect();
      let reader: TraceReader;
      try {
        reader = await this.current;
      } catch (err) {
        this.current = null;
        throw err;
      }
      return await read(reader);
    } finally {
      if (--this.users === 0) this.idle = setTimeout(() => void this.release(), IDLE_MS);
    }
  }

  private async release(): Promise<void> {
    const current = this.current;
    this.current = null;
    this.idle = null;
    if (current) this.closing = current.then((reader) => reader.close()).catch(() => undefined);
    await this.closing;
  }

  list: TraceReader['list'] = () => this.use((r) => r.list());
  meta: TraceReader['meta'] = (name) => this.use((r) => r.meta(name));
  records: TraceReader['records'] = (name) => this.use((r) => r.records(name));
  exchange: TraceReader['exchange'] = (name, seq) => this.use((r) => r.exchange(name, seq));
  reports: TraceReader['reports'] = (name) => this.use((r) => r.reports(name));
  blob: TraceReader['blob'] = (hash) => this.use((r) => r.blob(hash));

  async close(): Promise<void> {
    if (this.idle) clearTimeout(this.idle);
    await this.release();
  }
}
