import { readFileSync } from 'node:fs';
import { UsageError, flag, flagAll, has, type FlagSpec, type ParsedArgs } from './args.js';
import { ConnectToError, parseConnectTo } from '../proxy/connect-to.js';
import { InterceptListError, parseInterceptList } from '../proxy/intercept.js';
import { parseAuthority } from '../proxy/listener.js';
import { resolveHome } from '../home.js';
import { isValidTraceName } from '../trace/schema.js';
import type { DaemonOptions } from '../daemon.js';

export const DAEMON_FLAGS: Record<string, FlagSpec> = {
  listen: { value: true },
  home: { value: true },
  intercept: { value: true },
  'connect-to': { value: true, repeat: true },
  'upstream-ca': { value: true, repeat: true },
  trace: { value: true },
  'redact-rules': { value: true },
  'header-timeout': { value: true },
  'idle-timeout': { value: true },
  'allow-remote': {},
  'name-constraints': {},
  help: {},
};

export const DAEMON_FLAGS_HELP = `  --listen HOST:PORT       address to listen on (default 127.0.0.1:8877; loopback unless --allow-remote)
  --allow-remote           allow a non-loopback --listen; every request then needs session credentials
  --name-constraints       if this starts a new CA, limit it (X.509 name constraints) to the --intercept hosts
  --home DIR               where the CA, traces and state live (default $MITM_REPLAY_HOME or ~/.mitm-replay)
  --intercept LIST         hosts to decrypt: '+host,+*.corp.example' adds to the LLM API defaults,
                           a list without '+' replaces them, '*' decrypts everything
  --connect-to H1:P1:H2:P2 send connections for H1:P1 to H2:P2, keeping SNI and Host (curl syntax; repeatable)
  --upstream-ca FILE       extra CA (PEM) trusted for upstream TLS (repeatable)
  --trace NAME             trace name ([A-Za-z0-9._-]{1,64})
  --redact-rules FILE      redaction rules (JSON), instead of HOME/redact.json
  --header-timeout SECONDS a client must send a complete request head within this (default 30)
  --idle-timeout SECONDS   a client connection idle this long between requests is closed (default 300)`;

export function traceNameFlag(args: ParsedArgs, command: string): string | undefined {
  const name = flag(args, 'trace');
  if (name !== undefined && !isValidTraceName(name)) {
    throw new UsageError(`${command}: invalid trace name '${name}': use 1-64 characters of A-Z a-z 0-9 . _ - (and not 'last')`);
  }
  return name;
}

/** Daemon options from flags; every bad value is a one-line UsageError. */
export function daemonOptionsFrom(args: ParsedArgs, command: string, defaultPort: number): DaemonOptions {
  const listen = flag(args, 'listen') ?? `127.0.0.1:${defaultPort}`;
  // Port 0 (an ephemeral port) is valid for listening, though not as a destination.
  const ephemeral = /:0$/.test(listen);
  const address = parseAuthority(ephemeral ? `${listen.slice(0, -2)}:1` : listen);
  if (!address) throw new UsageError(`${command}: --listen '${listen}' is not HOST:PORT (example: 127.0.0.1:8877)`);
  const host = address.host;
  const remote = !isLoopback(host);
  if (remote && !has(args, 'allow-remote')) {
    throw new UsageError(`${command}: --listen ${listen} is not a loopback address; add --allow-remote to listen there (every request then needs session credentials)`);
  }
  let intercept: string[];
  try {
    intercept = parseInterceptList(flag(args, 'intercept'));
  } catch (err) {
    if (err instanceof InterceptListError) throw new UsageError(`${command}: ${err.message}`);
    throw err;
  }
  let connectTo;
  try {
    connectTo = flagAll(args, 'connect-to').map(parseConnectTo);
  } catch (err) {
    if (err instanceof ConnectToError) throw new UsageError(`${command}: ${err.message}`);
    throw err;
  }
  const upstreamCAs = flagAll(args, 'upstream-ca').map((file) => {
    let pem: string;
    try {
      pem = readFileSync(file, 'utf8');
    } catch (err) {
      throw new UsageError(`${command}: cannot read --upstream-ca ${file}: ${(err as Error).message}`);
    }
    if (!pem.includes('-----BEGIN CERTIFICATE-----')) throw new UsageError(`${command}: --upstream-ca ${file} holds no PEM certificate`);
    return pem;
  });
  const seconds = (name: string, fallback: number): number => {
    const text = flag(args, name);
    if (text === undefined) return fallback;
    const value = Number(text);
    if (!/^\d+(\.\d+)?$/.test(text) || value <= 0) throw new UsageError(`${command}: --${name} must be a positive number of seconds, not '${text}'`);
    return value * 1000;
  };
  const timeouts = { headerMs: seconds('header-timeout', 30), idleMs: seconds('idle-timeout', 300) };
  return {
    timeouts,
    requireCredentials: remote,
    nameConstraints: has(args, 'name-constraints'),
    home: resolveHome(flag(args, 'home')),
    host,
    port: ephemeral ? 0 : address.port,
    intercept,
    connectTo,
    upstreamCAs,
    trace: traceNameFlag(args, command),
    redactRulesFile: flag(args, 'redact-rules'),
  };
}

export function isLoopback(host: string): boolean {
  return host === '::1' || host.startsWith('127.') || host === 'localhost';
}
