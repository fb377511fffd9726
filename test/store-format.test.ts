import { describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Level } from 'level';
import { StoreFormatError, TraceStore } from '../src/trace/store.js';
import { FORMAT_VERSION } from '../src/trace/schema.js';
import { runCli } from './helpers/cli.js';

async function rawPut(path: string, key: string, value: string): Promise<void> {
  const db = new Level<string, string>(path);
  await db.open();
  await db.put(key, value);
  await db.close();
}

async function rawGet(path: string, key: string): Promise<string | undefined> {
  const db = new Level<string, string>(path);
  await db.open();
  const value = await db.get(key);
  await db.close();
  return value;
}

describe('store format version', () => {
  it('a store records its format version; one without it (older) opens and gets it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mitm-replay-format-'));
    try {
      await rawPut(join(dir, 'traces'), 't:old:meta', JSON.stringify({ name: 'old', createdAt: 1, restarts: [] }));
      expect(await rawGet(join(dir, 'traces'), 'v:format')).toBeUndefined();
      const store = await TraceStore.open(join(dir, 'traces'));
      expect((await store.listTraces()).map((t) => t.name)).toEqual(['old']);
      await store.close();
      expect(await rawGet(join(dir, 'traces'), 'v:format')).toBe(String(FORMAT_VERSION));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a store from a newer version is refused with the reason, by the store and by every command', async () => {
    const home = mkdtempSync(join(tmpdir(), 'mitm-replay-format-'));
    try {
      await rawPut(join(home, 'traces'), 'v:format', '99');
      await expect(TraceStore.open(join(home, 'traces'))).rejects.toThrow(StoreFormatError);
      await expect(TraceStore.open(join(home, 'traces'))).rejects.toThrow(/written by a newer mitm-replay \(format 99; this version reads 2\)/);
      const ls = await runCli(['ls', '--home', home]);
      expect(ls.code).toBe(1);
      expect(ls.stderr.trim().split('\n')).toHaveLength(1);
      expect(ls.stderr).toContain('upgrade mitm-replay, or use another --home');
      const record = await runCli(['record', '--home', home, '--', 'true']);
      expect(record.code).toBe(125);
      expect(record.stderr).toContain('newer mitm-replay');
      // nothing was changed
      expect(await rawGet(join(home, 'traces'), 'v:format')).toBe('99');
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });

  it('a command waits a moment for a store another process holds, then says it is in use', async () => {
    const home = mkdtempSync(join(tmpdir(), 'mitm-replay-locked-'));
    try {
      const held = await TraceStore.open(join(home, 'traces'));
      // released after 700 ms: ls waits for it
      const ls = runCli(['ls', '--home', home]);
      await new Promise((r) => setTimeout(r, 700));
      await held.close();
      const waited = await ls;
      expect(waited.code, waited.stderr).toBe(0);
      // held for longer than the wait: one line saying so
      const again = await TraceStore.open(join(home, 'traces'));
      try {
        const refused = await runCli(['ls', '--home', home]);
        expect(refused.code).toBe(1);
        expect(refused.stderr).toMatch(/^mitm-replay: ls: the trace store .* is in use by another mitm-replay process \(.*\): try again when it has finished\n$/);
      } finally {
        await again.close();
      }
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });
});
