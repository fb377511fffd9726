/** A small, strict argument parser: every command declares its flags; anything else is a one-line error. */
export class UsageError extends Error {}

export interface FlagSpec {
  /** takes a value (`--name VALUE` or `--name=VALUE`) */
  value?: boolean;
  /** may be given several times (values collected in order) */
  repeat?: boolean;
}

export interface ParsedArgs {
  flags: Map<string, string[]>;
  positionals: string[];
  /** everything after `--` */
  rest: string[] | null;
}

export function parseArgs(command: string, argv: string[], spec: Record<string, FlagSpec>): ParsedArgs {
  const flags = new Map<string, string[]>();
  const positionals: string[] = [];
  let rest: string[] | null = null;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') {
      rest = argv.slice(i + 1);
      break;
    }
    if (!arg.startsWith('--') || arg === '-') {
      if (arg.startsWith('-') && arg !== '-') throw new UsageError(`${command}: unknown option '${arg}' (see 'mitm-replay ${command} --help')`);
      positionals.push(arg);
      continue;
    }
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    const flag = spec[name];
    if (!flag) throw new UsageError(`${command}: unknown option '--${name}' (see 'mitm-replay ${command} --help')`);
    let value = 'true';
    if (flag.value) {
      if (eq >= 0) value = arg.slice(eq + 1);
      else {
        const next = argv[i + 1];
        if (next === undefined || (next.startsWith('--') && next !== '--')) throw new UsageError(`${command}: option '--${name}' needs a value`);
        value = next;
        i++;
      }
    } else if (eq >= 0) throw new UsageError(`${command}: option '--${name}' takes no value`);
    const existing = flags.get(name);
    if (existing && !flag.repeat) throw new UsageError(`${command}: option '--${name}' given twice`);
    flags.set(name, [...(existing ?? []), value]);
  }
  return { flags, positionals, rest };
}

export function flag(args: ParsedArgs, name: string): string | undefined {
  return args.flags.get(name)?.at(-1);
}

export function flagAll(args: ParsedArgs, name: string): string[] {
  return args.flags.get(name) ?? [];
}

export function has(args: ParsedArgs, name: string): boolean {
  return args.flags.has(name);
}
