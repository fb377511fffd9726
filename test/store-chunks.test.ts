import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TraceStore } from '../src/trace/store.js';
import { convertToStructural } from '../src/trace/tiers.js';
import { DEFAULT_RETENTION, collectGarbage } from '../src/trace/retention.js';
import { buildRuleSet } from '../src/capture/redact.js';
import { FORMAT_VERSION, type StoredExchange, type TraceMeta } from '../src/trace/schema.js';
import { CHUNKED_BODY_MIN } from '../src/trace/stored-value.js';
import { prng } from './helpers/prng.js';
import { chatExchange } from './helpers/exchange.js';

const meta = (name: string): TraceMeta => ({ name, formatVersion: FORMAT_VERSION, createdAt: Date.now(), mode: 'record', source: 'daemon', intercept: [], redaction: buildRuleSet(), restarts: [], tier: 'full' });

/** An agent-like run: every request resends the whole conversation so far, plus one new turn. */
function conversation(steps: number, seed: number): StoredExchange[] {
  const rand = prng(seed);
  const words = Array.from({ length: 500 }, (_, i) => `w${i.toString(36)}${Math.floor(rand() * 1e6).toString(36)}`);
  const turn = (n: number) => Array.from({ length: n }, () => words[Math.floor(rand() * words.length)]).join(' ');
  const messages: { role: string; content: string }[] = [{ role: 'system', content: `canary-system-prompt ${turn(800)}` }];
  const exchanges: StoredExchange[] = [];
  for (let seq = 0; seq < steps; seq++) {
    messages.push({ role: 'user', content: turn(100) });
    const requestBody = Buffer.from(JSON.stringify({ model: 'gpt-4o-mini', messages }));
    const responseBody = Buffer.from(JSON.stringify({ choices: [{ message: { role: 'assistant', content: turn(60) } }] }));
    exchanges.push(chatExchange(seq, requestBody, responseBody));
    messages.push({ role: 'assistant', content: turn(60) });
  }
  return exchanges;
}

async function readAll(store: TraceStore, name: string): Promise<StoredExchange[]> {
  const all: StoredExchange[] = [];
  for await (const ex of store.exchanges(name)) all.push(ex);
  return all;
}

describe('store: bodies in content-defined chunks, each stored once', () => {
  let dir: string;
  let store: TraceStore;
  beforeEach(async () => {
    dir = mkdtempSync(join(tmpdir(), 'mitm-replay-chunks-'));
    store = await TraceStore.open(join(dir, 'traces'), { compression: false });
  });
  afterEach(async () => {
    await store.close().catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  });

  it('a 30-step run keeps each part of the conversation once and reads back byte for byte', async () => {
    const run = conversation(30, 7);
    await store.putTrace(meta('run'));
    await Promise.all(run.map((ex) => store.putExchange('run', ex)));
    const bodyBytes = run.reduce((n, ex) => n + ex.requestBody.length, 0);
    const { bytes } = await store.chunkStats();
    // the last request holds the whole conversation: the store holds it once, plus per step the new turn and
    // the chunk before it that the new turn changed (chunks average ~2 KiB)
    expect(bytes).toBeLessThan(run.at(-1)!.requestBody.length + 30 * 6 * 1024);
    expect(bytes).toBeLessThan(bodyBytes / 4);
    const back = await readAll(store, 'run');
    expect(back).toHaveLength(30);
    back.forEach((ex, i) => {
      expect(ex.requestBody.equals(run[i]!.requestBody)).toBe(true);
      expect(ex.responseBody.equals(run[i]!.responseBody)).toBe(true);
      expect(ex.requestHead.equals(run[i]!.requestHead)).toBe(true);
      expect(ex.record).toEqual(run[i]!.record);
    });
    expect((await store.getExchange('run', 17))!.requestBody.equals(run[17]!.requestBody)).toBe(true);
    // small bodies stay inline
    expect(run[0]!.responseBody.length).toBeLessThan(CHUNKED_BODY_MIN);
  });

  it('chunks shared by two traces survive deleting one; gc takes the rest', async () => {
    const run = conversation(6, 11);
    await store.putTrace(meta('a'));
    await store.putTrace(meta('b'));
    for (const ex of run) await store.putExchange('a', ex);
    for (const ex of run.slice(0, 3)) await store.putExchange('b', ex);
    const before = await store.chunkStats();
    await store.deleteTrace('a');
    const swept = await store.sweepChunks();
    expect(swept).toBeGreaterThan(0);
    const after = await store.chunkStats();
    expect(after.chunks).toBe(before.chunks - swept);
    // b still reads whole
    const back = await readAll(store, 'b');
    back.forEach((ex, i) => expect(ex.requestBody.equals(run[i]!.requestBody)).toBe(true));
    await store.deleteTrace('b');
    await store.sweepChunks();
    expect((await store.chunkStats()).chunks).toBe(0);
  });

  it('the hourly gc looks for unreferenced chunks only after a trace was deleted; the gc command always', async () => {
    const run = conversation(4, 23);
    await store.putTrace(meta('kept'));
    await store.putTrace(meta('gone'));
    for (const ex of run) await store.putExchange('kept', ex);
    for (const ex of conversation(3, 29)) await store.putExchange('gone', ex);
    expect(store.chunksMayBeUnreferenced).toBe(true); // nothing swept since opening
    expect((await collectGarbage(store, null, new Set())).deletedChunks).toBe(0);
    expect(store.chunksMayBeUnreferenced).toBe(false);
    // rewriting an exchange without its chunks (what a tier conversion does) is not a deletion: skipped...
    await store.putExchange('kept', chatExchange(0, 'small now'));
    expect((await collectGarbage(store, null, new Set())).deletedChunks).toBe(0);
    // ...until asked for, as the gc command and the conversion do
    expect((await collectGarbage(store, null, new Set(), { sweep: 'always' })).deletedChunks).toBeGreaterThan(0);
    // a deleted trace makes the next hourly run look
    await store.deleteTrace('gone');
    expect(store.chunksMayBeUnreferenced).toBe(true);
    expect((await collectGarbage(store, null, new Set())).deletedChunks).toBeGreaterThan(0);
    const back = await readAll(store, 'kept');
    back.slice(1).forEach((ex, i) => expect(ex.requestBody.equals(run[i + 1]!.requestBody)).toBe(true));
  });

  it('an exchange written while a sweep runs keeps the chunks it reuses', async () => {
    const run = conversation(8, 5);
    await store.putTrace(meta('old'));
    for (const ex of run) await store.putExchange('old', ex);
    await store.deleteTrace('old');
    // the sweep starts with every chunk unreferenced; the new trace reuses them all while it runs
    const sweeping = store.sweepChunks();
    await store.putTrace(meta('new'));
    const writes = run.map((ex) => store.putExchange('new', ex));
    await Promise.all([sweeping, ...writes]);
    const back = await readAll(store, 'new');
    back.forEach((ex, i) => expect(ex.requestBody.equals(run[i]!.requestBody)).toBe(true));
  });

  it('a failed write forgets its chunks, so the next exchange that shares them writes them', async () => {
    const run = conversation(2, 17);
    await store.putTrace(meta('f'));
    process.env.MITM_REPLAY_FAULT_EXCHANGE_WRITES = '1';
    try {
      await expect(store.putExchange('f', run[0]!)).rejects.toThrow(/injected store write failure/);
    } finally {
      delete process.env.MITM_REPLAY_FAULT_EXCHANGE_WRITES;
    }
    // run[1] resends run[0]'s conversation: its chunks must be written now, not assumed present
    await store.putExchange('f', run[1]!);
    expect((await store.getExchange('f', 1))!.requestBody.equals(run[1]!.requestBody)).toBe(true);
    expect(await store.getExchange('f', 0)).toBeUndefined();
  });

  it('a damaged value says which exchange and chunk are missing', async () => {
    const run = conversation(2, 3);
    await store.putTrace(meta('x'));
    for (const ex of run) await store.putExchange('x', ex);
    // take the chunks away under the exchange (what a hand-edited or half-copied store would look like)
    await store.deleteTrace('x');
    await store.putTrace(meta('x'));
    const { encodeStoredValue } = await import('../src/trace/stored-value.js');
    const db = (store as unknown as { db: { put(k: string, v: Buffer): Promise<void> } }).db;
    await store.sweepChunks();
    await db.put('t:x:x:0000000001', encodeStoredValue(run[1]!).value);
    await expect(store.getExchange('x', 1)).rejects.toThrow(/exchange 1 is damaged: chunk [0-9a-f]{12}… of its request body is missing from the store/);
  });

  it('making a trace structural deletes its chunks from the files, keeping those another full trace uses', async () => {
    const run = conversation(5, 13);
    await store.putTrace(meta('shape'));
    await store.putTrace(meta('keep'));
    for (const ex of run) await store.putExchange('shape', ex);
    await store.putExchange('keep', run[0]!);
    await convertToStructural(store, 'shape', DEFAULT_RETENTION);
    await store.close();
    const files = readdirSync(join(dir, 'traces')).map((f) => readFileSync(join(dir, 'traces', f)).toString('latin1')).join('');
    // the system prompt is in run[0] (kept by 'keep'); the last user turn only in run[4] (made structural)
    const lastTurn = JSON.parse(run[4]!.requestBody.toString()).messages.at(-1).content as string;
    expect(files).toContain('canary-system-prompt');
    expect(files).not.toContain(lastTurn.slice(0, 60));
    store = await TraceStore.open(join(dir, 'traces'), { compression: false });
    expect((await store.getExchange('keep', 0))!.requestBody.equals(run[0]!.requestBody)).toBe(true);
  });
});
