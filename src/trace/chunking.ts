/**
 * Content-defined chunking (a gear rolling hash, as in FastCDC): boundaries depend on the bytes around them,
 * not on offsets, so a repeated stretch (agents resend the whole conversation on every turn) cuts into the same
 * chunks wherever it sits, and is stored once.
 */
const MIN_CHUNK = 256;
/**
 * Periodic content (a repeated line, a text of few words) can keep the hash off every boundary value; then only
 * this maximum cuts. Max cuts count from the start of a body, so a resent prefix still cuts the same way. At
 * 16 KiB a 6 KiB body of such text was one chunk, shared with nothing; at 4 KiB content shifted by an insert still
 * shares 94 % of its bytes (16 KiB: 94.4 %; FastCDC-style normalized masks: 89 %), with chunks of ~1.9 KiB.
 */
const MAX_CHUNK = 4 * 1024;
/** 11 of the hash's high bits must be zero: boundaries about every 2 KiB */
const BOUNDARY_MASK = 0xffe00000;
/** a run of one byte at least this long ends in a boundary */
const MIN_RUN = 64;

const GEAR = (() => {
  // A fixed table (seeded xorshift), so every version cuts the same bytes the same way.
  const table = new Uint32Array(256);
  let x = 0x9e3779b9;
  for (let i = 0; i < 256; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    table[i] = x >>> 0;
  }
  return table;
})();

/** Chunk lengths covering `data` exactly. */
export function chunkLengths(data: Buffer): number[] {
  const lengths: number[] = [];
  let start = 0;
  let hash = 0;
  let run = 0;
  for (let i = 0; i < data.length; i++) {
    const byte = data[i]!;
    // A long run of one byte (a structural trace's filler) holds the hash at one value, so the hash alone would
    // find no boundary in it: the end of such a run is a boundary too.
    if (i > 0 && byte !== data[i - 1]) {
      if (run >= MIN_RUN && i - start >= MIN_CHUNK) {
        lengths.push(i - start);
        start = i;
        hash = 0;
      }
      run = 0;
    }
    run++;
    hash = ((hash << 1) + GEAR[byte]!) >>> 0;
    const length = i + 1 - start;
    if ((length >= MIN_CHUNK && (hash & BOUNDARY_MASK) === 0) || length >= MAX_CHUNK) {
      lengths.push(length);
      start = i + 1;
      hash = 0;
    }
  }
  if (start < data.length) lengths.push(data.length - start);
  return lengths;
}

/** Splits buffers into chunks, each distinct chunk kept once: `chunks` plus, per buffer, its chunk indices. */
export function dedupe(buffers: Buffer[]): { chunks: Buffer[]; refs: number[][] } {
  const index = new Map<string, number>();
  const chunks: Buffer[] = [];
  const refs = buffers.map((buffer) => {
    const ids: number[] = [];
    let pos = 0;
    for (const length of chunkLengths(buffer)) {
      const chunk = buffer.subarray(pos, pos + length);
      pos += length;
      // latin1 keys are exact for bytes; chunks are at most 4 KiB
      const key = chunk.toString('latin1');
      let id = index.get(key);
      if (id === undefined) {
        id = chunks.length;
        index.set(key, id);
        chunks.push(chunk);
      }
      ids.push(id);
    }
    return ids;
  });
  return { chunks, refs };
}
