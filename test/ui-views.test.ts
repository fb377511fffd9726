import { describe, expect, it } from 'vitest';
import { explainDivergence } from '../src/replay/divergence.js';
import { bodyText } from '../src/trace/inspect.js';
import { jsonLines } from '../src/ui/views.js';

const request = (body: unknown) => {
  const text = Buffer.from(JSON.stringify(body));
  return { head: Buffer.from(`POST /v1/x HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\ncontent-length: ${text.length}\r\n\r\n`), body: text };
};

describe('the viewer tags pretty-printed JSON lines with the paths divergences name', () => {
  it('every differing path of a divergence is the path of a line on both sides (odd keys, nesting, arrays)', () => {
    const recorded = { 'weird key': { 'a.b': [1, { deep: 'x' }] }, messages: [{ content: 'hi' }, { content: [] }], n: 1, gone: true };
    const replayed = { 'weird key': { 'a.b': [1, { deep: 'y' }] }, messages: [{ content: 'hi' }, { content: [{}] }], n: 2, added: null };
    const divergence = explainDivergence(request(recorded), request(replayed));
    const paths = divergence.json.map((d) => d.path);
    expect(paths).toEqual(expect.arrayContaining(['["weird key"]["a.b"][1].deep', 'n']));
    expect(divergence.json.map((d) => [d.path, d.recorded, d.replayed])).toEqual(expect.arrayContaining([['messages[1].content[0]', '(absent)', '{}'], ['added', '(absent)', 'null']]));
    const left = new Set(jsonLines(recorded).lines.map((l) => l.path));
    const right = new Set(jsonLines(replayed).lines.map((l) => l.path));
    // a value present on a side has its line there (and is highlighted by the page)
    for (const d of divergence.json) {
      if (d.recorded !== '(absent)') expect(left.has(d.path), `recorded ${d.path}`).toBe(true);
      if (d.replayed !== '(absent)') expect(right.has(d.path), `replayed ${d.path}`).toBe(true);
    }
  });

  it('lines are JSON.stringify(doc, null, 2), one by one', () => {
    const doc = { a: [1, [], {}, { b: 'c"d' }], e: { f: null }, g: '' };
    expect(jsonLines(doc).lines.map((l) => l.text).join('\n')).toBe(JSON.stringify(doc, null, 2));
    const line = jsonLines(doc).lines.find((l) => l.text.includes('c\\"d'))!;
    expect(line.path).toBe('a[3].b');
    expect(line.text.slice(line.v)).toBe('"c\\"d"');
  });
});

describe('bodyText', () => {
  it('keeps UTF-8 as text, cuts before a split character, and gives binary as base64', () => {
    expect(bodyText(Buffer.from('héllo'), 100)).toEqual({ text: 'héllo', encoding: 'utf8', bytes: 6, shown: 6, truncated: false });
    // 'é' is two bytes: a cut after 2 bytes would split it
    expect(bodyText(Buffer.from('hé'), 2)).toEqual({ text: 'h', encoding: 'utf8', bytes: 3, shown: 1, truncated: true });
    expect(bodyText(Buffer.from([0xff, 0xfe, 0x00]), 100)).toEqual({ text: '//4A', encoding: 'base64', bytes: 3, shown: 3, truncated: false });
  });
});
