/**
 * curl's `--connect-to HOST1:PORT1:HOST2:PORT2`: connections meant for HOST1:PORT1 go to HOST2:PORT2,
 * while SNI and Host stay HOST1. An empty HOST1 or PORT1 means any; an empty HOST2 or PORT2 keeps the original.
 * IPv6 literals are written in brackets.
 */
export interface ConnectToRule {
  fromHost: string;
  fromPort: number | null;
  toHost: string;
  toPort: number | null;
}

export class ConnectToError extends Error {}

function splitFields(spec: string): string[] {
  const fields: string[] = [];
  let current = '';
  let inBrackets = false;
  for (const ch of spec) {
    if (ch === '[') inBrackets = true;
    if (ch === ']') inBrackets = false;
    if (ch === ':' && !inBrackets) {
      fields.push(current);
      current = '';
    } else current += ch;
  }
  fields.push(current);
  return fields;
}

function parsePort(text: string, spec: string): number | null {
  if (text === '') return null;
  const port = Number(text);
  if (!/^\d+$/.test(text) || port < 1 || port > 65535) {
    throw new ConnectToError(`--connect-to '${spec}': '${text}' is not a port (1-65535)`);
  }
  return port;
}

export function parseConnectTo(spec: string): ConnectToRule {
  const fields = splitFields(spec);
  if (fields.length !== 4) {
    throw new ConnectToError(`--connect-to '${spec}' must have four fields HOST1:PORT1:HOST2:PORT2 (empty HOST1/PORT1 means any; bracket IPv6)`);
  }
  const unbracket = (h: string) => h.replace(/^\[(.*)\]$/, '$1').toLowerCase();
  return {
    fromHost: unbracket(fields[0]!),
    fromPort: parsePort(fields[1]!, spec),
    toHost: unbracket(fields[2]!),
    toPort: parsePort(fields[3]!, spec),
  };
}

/** The first matching rule wins, as in curl. */
export function resolveConnectTo(rules: ConnectToRule[], host: string, port: number): { host: string; port: number } {
  const normal = host.toLowerCase().replace(/^\[(.*)\]$/, '$1');
  for (const rule of rules) {
    if (rule.fromHost !== '' && rule.fromHost !== normal) continue;
    if (rule.fromPort !== null && rule.fromPort !== port) continue;
    return { host: rule.toHost || normal, port: rule.toPort ?? port };
  }
  return { host: normal, port };
}
