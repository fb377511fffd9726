/**
 * Minimal path globs for --include / --exclude, matched against posix paths relative to the workspace root.
 *
 * - `*` matches any run of characters within one path segment (dotfiles included), `?` one character.
 * - `**` as a whole segment matches zero or more segments (`a/**` also matches `a` itself).
 * - A pattern without `/` (after dropping a trailing `/`) matches a basename at any depth: `*.log` = `**` + `/*.log`.
 * - A leading `/` or `./` anchors a pattern at the root (`/build` is only the top-level build); patterns with a
 *   `/` inside are relative to the root anyway. A trailing `/` is dropped (it does not restrict to directories).
 * - A pattern that matches a directory matches everything below it (see `matchesSelfOrAncestor`).
 * Matching is case-sensitive; there are no character classes or negations (`[` and `!` are literal).
 */
export class Glob {
  readonly pattern: string;
  private readonly segments: string[];
  private readonly regexes: (RegExp | null)[]; // null for `**`

  constructor(pattern: string) {
    this.pattern = pattern;
    let p = pattern.trim();
    let anchored = false;
    while (p.startsWith('./')) {
      p = p.slice(2);
      anchored = true;
    }
    if (p.startsWith('/')) anchored = true;
    p = p.replace(/^\/+/, '').replace(/\/+$/, '');
    if (p === '' || p === '.') throw new Error(`glob ${JSON.stringify(pattern)} is empty; give a path pattern such as "dist/**" or "*.log"`);
    const raw = p.split(/\/+/);
    if (raw.includes('..')) throw new Error(`glob ${JSON.stringify(pattern)} must not contain ".."; patterns are relative to the workspace root`);
    const segs = !anchored && raw.length === 1 ? ['**', raw[0]!] : raw;
    // Consecutive `**` are one `**`.
    this.segments = segs.filter((s, i) => !(s === '**' && segs[i - 1] === '**'));
    this.regexes = this.segments.map((s) => (s === '**' ? null : segmentRegex(s)));
  }

  /** The pattern matches exactly this path. */
  matches(path: string): boolean {
    return this.match(0, split(path), 0, 'exact');
  }

  /** The pattern matches this path or one of its ancestor directories (so the path lies in a matched subtree). */
  matchesSelfOrAncestor(path: string): boolean {
    return this.match(0, split(path), 0, 'ancestor');
  }

  /** Some path strictly below directory `dir` ('' for the root) could match. */
  couldMatchBelow(dir: string): boolean {
    return this.match(0, split(dir), 0, 'below');
  }

  /** The pattern spells out `name` as a literal segment (used to decide whether to enter default-excluded dirs). */
  namesSegment(name: string): boolean {
    return this.segments.includes(name);
  }

  private match(pi: number, s: string[], si: number, mode: 'exact' | 'ancestor' | 'below'): boolean {
    for (;;) {
      if (pi === this.segments.length) return si === s.length ? mode !== 'below' : mode === 'ancestor';
      if (si === s.length) return mode === 'below' || this.segments.slice(pi).every((x) => x === '**');
      const re = this.regexes[pi];
      if (re === null) {
        // `**`: match zero segments, or swallow one and stay on `**`.
        if (this.match(pi + 1, s, si, mode)) return true;
        si++;
        continue;
      }
      if (!re!.test(s[si]!)) return false;
      pi++;
      si++;
    }
  }
}

function split(path: string): string[] {
  return path === '' ? [] : path.split('/');
}

function segmentRegex(segment: string): RegExp {
  let out = '';
  for (const ch of segment) {
    if (ch === '*') out += '.*';
    else if (ch === '?') out += '.';
    else out += ch.replace(/[.+^${}()|[\]\\*?]/g, '\\$&');
  }
  return new RegExp(`^${out}$`, 's');
}

export function compileGlobs(patterns: readonly string[] | undefined): Glob[] {
  return (patterns ?? []).map((p) => new Glob(p));
}
