import { describe, expect, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { BundleError, parseBundle, serializeBundle, type Bundle } from '../src/trace/bundle.js';
import { chunkLengths, dedupe } from '../src/trace/chunking.js';
import { encodeExchange, FORMAT_VERSION, type StoredExchange, type TraceMeta } from '../src/trace/schema.js';
import { buildRuleSet } from '../src/capture/redact.js';
import { chatExchange } from './helpers/exchange.js';

const exchange = (seq: number, body: string): StoredExchange => chatExchange(seq, body);

const meta: TraceMeta = { name: 'fmt', formatVersion: FORMAT_VERSION, createdAt: 1_800_000_000_000, mode: 'record', source: 'daemon', intercept: ['api.openai.com'], redaction: buildRuleSet(), restarts: [] };

describe('bundle format', () => {
  it('version 2 round-trips exactly, and a conversation resent every turn is stored about once', () => {
    const history: string[] = [];
    const exchanges: StoredExchange[] = [];
    for (let turn = 0; turn < 20; turn++) {
      history.push(randomBytes(600).toString('base64'));
      exchanges.push(exchange(turn, JSON.stringify({ messages: history })));
    }
    const bundle: Bundle = { meta, exchanges, reports: [], blobs: new Map() };
    const bytes = serializeBundle(bundle);
    const back = parseBundle(bytes, 'test.bundle');
    expect(back.exchanges.map((e) => encodeExchange(e).toString('hex'))).toEqual(exchanges.map((e) => encodeExchange(e).toString('hex')));
    const raw = exchanges.reduce((n, e) => n + encodeExchange(e).length, 0);
    const unique = history.join('').length;
    // random (incompressible) history: dedup alone must bring the bundle near the unique content, far below raw
    expect(bytes.length).toBeLessThan(unique * 1.6);
    expect(bytes.length).toBeLessThan(raw / 5);
  });

  it('content-defined chunks: the same stretch cuts the same way at any offset', () => {
    const stretch = randomBytes(50_000);
    const a = dedupe([Buffer.concat([Buffer.from('x'), stretch]), Buffer.concat([randomBytes(777), stretch])]);
    // most chunks of the second buffer are shared with the first
    const shared = a.refs[1]!.filter((id) => a.refs[0]!.includes(id)).length;
    expect(shared).toBeGreaterThan(a.refs[1]!.length * 0.8);
    expect(chunkLengths(stretch).reduce((x, y) => x + y, 0)).toBe(stretch.length);
  });

  it('version 1 bundles (one JSON document, base64 bytes) still import', () => {
    const document = { schema: 'mitm-replay/bundle@1', meta, exchanges: [encodeExchange(exchange(0, '{"a":1}')).toString('base64')], reports: [], blobs: {} };
    const payload = gzipSync(JSON.stringify(document));
    const bytes = Buffer.concat([Buffer.from(`mitm-replay-bundle 1\nsha256:${createHash('sha256').update(payload).digest('hex')}\n`), payload]);
    const back = parseBundle(bytes, 'old.bundle');
    expect(back.exchanges[0]!.requestBody.toString()).toBe('{"a":1}');
  });

  it('a bundle from a newer version is refused with a clear message', () => {
    expect(() => parseBundle(Buffer.from('mitm-replay-bundle 9\nsha256:00\nxx'), 'new.bundle')).toThrow(BundleError);
    expect(() => parseBundle(Buffer.from('mitm-replay-bundle 9\nsha256:00\nxx'), 'new.bundle')).toThrow(/newer mitm-replay/);
  });
});
