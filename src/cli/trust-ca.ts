import { execFile } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { accessSync, constants, existsSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { delimiter, join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { NameConstraintsError, certificateFingerprint, commitRotation, constraintsFor, loadAuthority, loadOrCreateAuthority, prepareRotation, type CertificateAuthority } from '../ca/authority.js';
import { DaemonClient } from '../daemon-client.js';
import { InterceptListError, parseInterceptList } from '../proxy/intercept.js';
import { homePaths, resolveHome } from '../home.js';

const USAGE = `Usage: mitm-replay trust-ca [--home DIR] [--uninstall] [--dry-run] [--stores system,nss] [--nss-db DIR] [--name-constraints [--intercept LIST]]
       mitm-replay trust-ca --rotate [--home DIR] [--dry-run]

Installs the mitm-replay CA (creating it first if the home has none) into this machine's trust stores,
the way mkcert -install does. Per-process trust needs no install at all: \`mitm-replay record\` and
\`mitm-replay env\` hand the CA to the programs they start.

Options:
  --home DIR       mitm-replay home (default: $MITM_REPLAY_HOME, else ~/.mitm-replay)
  --uninstall      remove the CA from the stores instead
  --dry-run        print the commands it would run and the files it would touch; change nothing
  --stores LIST    comma-separated, from: system, nss (default: every store found on this machine)
  --nss-db DIR     use exactly this NSS database (implies --stores nss unless --stores is given)
  --name-constraints
                   if the home has no CA yet, create one limited (X.509 name constraints) to the
                   --intercept hosts (default: the LLM API hosts) and loopback addresses
  --intercept LIST with --name-constraints: the hosts, as for 'mitm-replay daemon --intercept'
  --rotate         make a new CA (with the current one's name constraints), move every trust install
                   trust-ca made (HOME/certs/installs.json) to it, and retire the old CA: its key is
                   deleted, its certificate kept in HOME/certs/retired/. Stop the daemon first.
  -h, --help       show this help

System stores: Debian/Ubuntu, Fedora/RHEL, Arch, openSUSE, macOS (root needed; sudo is used if you are not).
NSS stores (Firefox; Chrome/Chromium on Linux): ~/.pki/nssdb and Firefox profiles; they need certutil
(Debian/Ubuntu: libnss3-tools, Fedora/RHEL: nss-tools, Arch: nss, openSUSE: mozilla-nss-tools, macOS: brew install nss).

Environment:
  MITM_REPLAY_TRUST_PLATFORM=debian|fedora|arch|opensuse|macos
      Test/diagnostic switch: plan for that system store instead of detecting it (use with --dry-run).
`;

type Store = 'system' | 'nss';
const STORES: readonly Store[] = ['system', 'nss'];

type Platform = 'debian' | 'fedora' | 'arch' | 'opensuse' | 'macos';

interface LinuxStore {
  anchorDir: string;
  extension: string;
  refresh: string[];
  /** Packages that provide the tools, for the "not found" message. */
  packages: Record<string, string>;
}

/** Linux system stores, in mkcert's detection order (Fedora first: some of its images also have the Debian dir). */
const LINUX_STORES: Record<Exclude<Platform, 'macos'>, LinuxStore> = {
  fedora: {
    anchorDir: '/etc/pki/ca-trust/source/anchors',
    extension: '.pem',
    refresh: ['update-ca-trust', 'extract'],
    packages: { 'update-ca-trust': 'ca-certificates', certutil: 'nss-tools' },
  },
  debian: {
    anchorDir: '/usr/local/share/ca-certificates',
    extension: '.crt', // update-ca-certificates only picks up *.crt
    refresh: ['update-ca-certificates'],
    packages: { 'update-ca-certificates': 'ca-certificates', certutil: 'libnss3-tools' },
  },
  arch: {
    anchorDir: '/etc/ca-certificates/trust-source/anchors',
    extension: '.crt',
    refresh: ['trust', 'extract-compat'],
    packages: { trust: 'p11-kit', certutil: 'nss' },
  },
  opensuse: {
    anchorDir: '/usr/share/pki/trust/anchors',
    extension: '.pem',
    refresh: ['update-ca-certificates'],
    packages: { 'update-ca-certificates': 'ca-certificates', certutil: 'mozilla-nss-tools' },
  },
};

const MACOS_KEYCHAIN = '/Library/Keychains/System.keychain';
const MACOS_PACKAGES: Record<string, string> = { certutil: 'nss (brew install nss)', security: 'macOS itself' };
const PLATFORMS = ['debian', 'fedora', 'arch', 'opensuse', 'macos'] as const;

export interface TrustCaIo {
  stdout: { write(text: string): unknown };
  stderr: { write(text: string): unknown };
  env: NodeJS.ProcessEnv;
}

interface Options {
  home?: string;
  uninstall: boolean;
  dryRun: boolean;
  stores?: Store[];
  nssDb?: string;
  nameConstraints?: boolean;
  intercept?: string;
  rotate: boolean;
  help: boolean;
}

/** One install trust-ca made, kept in HOME/certs/installs.json so `--rotate` can move it. */
interface InstallRecord {
  store: Store;
  /** system store: the platform whose store it is */
  platform?: Platform;
  /** nss: the database (sql:DIR) */
  db?: string;
  /** the anchor file's base name or the NSS nickname: mitm-replay-<fingerprint prefix> */
  name: string;
}

/** Bad command line: one line on stderr, exit code 2. */
class UsageError extends Error {}

/** One change to one store, as the commands that make it. */
interface Step {
  store: string; // "system (debian)", "nss", ...
  touches: string; // the file or database it changes
  commands: string[][];
  /** For uninstall: whether there is anything to remove (certutil -D fails on a missing nickname). */
  isPresent?: () => Promise<boolean>;
  record: InstallRecord;
}

/**
 * `mitm-replay trust-ca [...]`; argv is what follows the subcommand name. Returns the exit code.
 * io exists so tests can capture output and pass an environment without touching process.env.
 */
export async function runTrustCa(
  argv: string[],
  io: TrustCaIo = { stdout: process.stdout, stderr: process.stderr, env: process.env },
): Promise<number> {
  try {
    const options = parseArguments(argv);
    if (options.help) {
      io.stdout.write(USAGE);
      return 0;
    }
    return await trustCa(options, io);
  } catch (err) {
    if (err instanceof UsageError) {
      io.stderr.write(`mitm-replay trust-ca: ${err.message} (see mitm-replay trust-ca --help)\n`);
      return 2;
    }
    // Anything else (a tool missing or failing, an unreadable CA) is one line too, exit code 1.
    io.stderr.write(`mitm-replay trust-ca: ${(err as Error).message.split('\n')[0]}\n`);
    return 1;
  }
}

function parseArguments(argv: string[]): Options {
  const options: Options = { uninstall: false, dryRun: false, rotate: false, help: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const [flag, inlineValue] = arg.startsWith('--') && arg.includes('=') ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)] : [arg, undefined];
    const value = (): string => {
      const v = inlineValue ?? argv[++i];
      if (v === undefined || v === '' || (inlineValue === undefined && v.startsWith('-'))) throw new UsageError(`${flag} needs a value`);
      return v;
    };
    const noValue = (): void => {
      if (inlineValue !== undefined) throw new UsageError(`${flag} takes no value`);
    };
    switch (flag) {
      case '-h':
      case '--help':
        noValue();
        options.help = true;
        break;
      case '--uninstall':
        noValue();
        options.uninstall = true;
        break;
      case '--dry-run':
        noValue();
        options.dryRun = true;
        break;
      case '--home':
        options.home = value();
        break;
      case '--nss-db':
        options.nssDb = value();
        break;
      case '--stores':
        options.stores = parseStores(value());
        break;
      case '--name-constraints':
        noValue();
        options.nameConstraints = true;
        break;
      case '--intercept':
        options.intercept = value();
        break;
      case '--rotate':
        noValue();
        options.rotate = true;
        break;
      default:
        throw new UsageError(arg.startsWith('-') ? `unknown option ${flag}` : `unexpected argument ${JSON.stringify(arg)}`);
    }
  }
  if (options.rotate && (options.uninstall || options.nameConstraints || options.stores || options.nssDb !== undefined)) {
    throw new UsageError('--rotate moves the installs trust-ca recorded and keeps the name constraints; it takes only --home and --dry-run');
  }
  return options;
}

function parseStores(list: string): Store[] {
  const stores = list.split(',').map((s) => s.trim());
  for (const store of stores) {
    if (!STORES.includes(store as Store)) throw new UsageError(`unknown store ${JSON.stringify(store)} (known: ${STORES.join(', ')})`);
  }
  return [...new Set(stores as Store[])];
}

async function trustCa(options: Options, io: TrustCaIo): Promise<number> {
  const platform = detectPlatform(io.env);
  const home = resolveHome(options.home ?? io.env.MITM_REPLAY_HOME);
  if (options.rotate) return rotate(home, options.dryRun, io);
  const nssDbs = options.nssDb !== undefined ? [explicitNssDb(options.nssDb)] : findNssDbs(io.env, platform);
  // --nss-db names one database; installing into the system store as well would be a surprise.
  const explicit = options.stores ?? (options.nssDb !== undefined ? ['nss'] : undefined);
  const stores = explicit ?? STORES.filter((s) => (s === 'system' ? platform !== undefined : nssDbs.length > 0));
  if (explicit?.includes('system') && !platform) {
    throw new Error(`no supported system trust store on this OS (${process.platform}); use --stores nss, or per-process trust`);
  }
  if (explicit?.includes('nss') && nssDbs.length === 0) {
    throw new Error('no NSS database found (~/.pki/nssdb, Firefox profiles); pass --nss-db DIR');
  }
  if (stores.length === 0) throw new Error('found no trust store to change on this machine; see --help');

  // Uninstalling or planning must not create a CA; installing does.
  let ca: CertificateAuthority | undefined = await loadAuthority(home);
  if (!ca && options.uninstall) {
    io.stdout.write(`No CA in ${home}; nothing to uninstall.\n`);
    return 0;
  }
  const certPath = homePaths(home).caCert;
  if (!ca && !options.dryRun) {
    let nameConstraints: string[] | undefined;
    try {
      nameConstraints = options.nameConstraints ? constraintsFor(parseInterceptList(options.intercept)) : undefined;
    } catch (err) {
      if (err instanceof InterceptListError || err instanceof NameConstraintsError) throw new UsageError(err.message);
      throw err;
    }
    ca = await loadOrCreateAuthority(home, { nameConstraints });
  }
  // Files and nicknames carry the fingerprint so that CAs of different homes never overwrite each other.
  const name = `mitm-replay-${ca ? certificateFingerprint(ca.certPem).slice(0, 8) : 'XXXXXXXX'}`;

  const steps = [
    ...(stores.includes('system') ? [systemStep(platform!, name, certPath, options.uninstall)] : []),
    ...(stores.includes('nss') ? nssDbs.map((db) => nssStep(db, name, certPath, options.uninstall, io.env)) : []),
  ];

  if (options.dryRun) {
    const lines = ['Dry run: nothing was changed.'];
    if (!ca) lines.push(`No CA in ${home} yet; installing would create ${certPath}, and its fingerprint replaces XXXXXXXX below.`);
    lines.push(options.uninstall ? 'trust-ca --uninstall would:' : 'trust-ca would:');
    for (const step of steps) {
      lines.push(`  ${step.store}: change ${step.touches}`);
      for (const command of step.commands) lines.push(`    ${formatCommand(command)}`);
    }
    lines.push(perProcessNote());
    io.stdout.write(lines.join('\n') + '\n');
    return 0;
  }

  checkTools(steps, platform, io.env, explicit ? '' : '; or pass --stores system');

  const changed: string[] = [];
  for (const step of steps) {
    if (options.uninstall && step.isPresent && !(await step.isPresent())) continue; // already absent
    for (const command of step.commands) await run(command, io.env);
    changed.push(`  ${step.store}: ${step.touches}`);
  }
  await updateInstalls(home, steps.map((s) => s.record), options.uninstall ? 'remove' : 'add');
  const subject = new X509Certificate(ca!.certPem).subject.replaceAll('\n', ', ');
  if (changed.length === 0) {
    io.stdout.write(`The CA (${subject}) was not in any of the stores; nothing changed.\n`);
  } else {
    io.stdout.write(`${options.uninstall ? 'Removed' : 'Installed'} the CA (${subject}, ${name}) ${options.uninstall ? 'from' : 'into'}:\n${changed.join('\n')}\n`);
  }
  io.stdout.write(perProcessNote() + '\n');
  return 0;
}

/** Checks every tool first, so a missing one never leaves some stores changed and others not. */
function checkTools(steps: Step[], platform: Platform | undefined, env: NodeJS.ProcessEnv, certutilHint: string): void {
  const tools = steps.flatMap((s) => s.commands.flatMap((c) => (c[0] === 'sudo' ? c.slice(0, 2) : c.slice(0, 1))));
  for (const tool of new Set(tools)) {
    if (findExecutable(tool, env)) continue;
    const stepPlatform = steps.find((s) => s.record.platform)?.record.platform ?? platform;
    const packages = stepPlatform === 'macos' ? MACOS_PACKAGES : stepPlatform ? LINUX_STORES[stepPlatform].packages : {};
    const pkg = packages[tool] ?? (tool === 'certutil' ? 'the NSS tools' : tool === 'sudo' ? 'sudo, or run as root' : tool);
    throw new Error(`${tool} not found; install ${pkg}${tool === 'certutil' ? certutilHint : ''}`);
  }
}

const installsFile = (home: string) => join(homePaths(home).certsDir, 'installs.json');
const sameInstall = (a: InstallRecord, b: InstallRecord) => a.store === b.store && a.platform === b.platform && a.db === b.db;

function readInstalls(home: string): InstallRecord[] {
  let text: string;
  try {
    text = readFileSync(installsFile(home), 'utf8');
  } catch {
    return [];
  }
  try {
    const parsed = JSON.parse(text) as { installs?: InstallRecord[] };
    return Array.isArray(parsed.installs) ? parsed.installs : [];
  } catch {
    throw new Error(`${installsFile(home)} is not valid JSON; fix or delete it (it lists the trust stores trust-ca installed the CA into)`);
  }
}

async function writeInstalls(home: string, installs: InstallRecord[]): Promise<void> {
  await writeFile(installsFile(home), `${JSON.stringify({ installs }, null, 2)}\n`, { mode: 0o644 });
}

async function updateInstalls(home: string, records: InstallRecord[], change: 'add' | 'remove'): Promise<void> {
  const kept = readInstalls(home).filter((r) => !records.some((c) => sameInstall(r, c)));
  await writeInstalls(home, change === 'add' ? [...kept, ...records] : kept);
}

function stepFor(record: InstallRecord, name: string, certPath: string, uninstall: boolean, env: NodeJS.ProcessEnv): Step {
  return record.store === 'nss' ? nssStep(record.db!, name, certPath, uninstall, env) : systemStep(record.platform!, name, certPath, uninstall);
}

/**
 * `--rotate`: a new CA with the same name constraints; every install trust-ca recorded gets the new CA before
 * the old one is removed from it; the old key is deleted and its certificate kept in certs/retired/.
 */
async function rotate(home: string, dryRun: boolean, io: TrustCaIo): Promise<number> {
  const current = await loadAuthority(home);
  if (!current) throw new Error(`no CA in ${homePaths(home).certsDir} to rotate; 'mitm-replay trust-ca' creates one`);
  const daemon = await DaemonClient.find(homePaths(home).stateFile);
  if (daemon) throw new Error(`a daemon (pid ${daemon.state.pid}) is running for ${home} and signs with the current CA; stop it, then rotate`);
  const installs = readInstalls(home);
  const oldName = `mitm-replay-${certificateFingerprint(current.certPem).slice(0, 8)}`;
  const nextPath = join(homePaths(home).certsDir, 'ca.next.pem');
  const removals = installs.map((r) => stepFor(r, r.name, current.certPath, true, io.env));
  if (dryRun) {
    const lines = ['Dry run: nothing was changed.', `trust-ca --rotate would create a new CA (replacing ${oldName}; same name constraints), then:`];
    for (const r of installs) {
      const step = stepFor(r, 'mitm-replay-XXXXXXXX', nextPath, false, io.env);
      lines.push(`  ${step.store}: install the new CA into ${step.touches}`, ...step.commands.map((c) => `    ${formatCommand(c)}`));
    }
    lines.push(`  delete the old key ${current.keyPath}; keep its certificate in ${join(homePaths(home).certsDir, 'retired')}/`);
    for (const step of removals) lines.push(`  ${step.store}: remove ${oldName} from ${step.touches}`, ...step.commands.map((c) => `    ${formatCommand(c)}`));
    if (installs.length === 0) lines.push('  (trust-ca recorded no installs in this home: no trust store to move)');
    io.stdout.write(lines.join('\n') + '\n');
    return 0;
  }
  checkTools([...removals, ...installs.map((r) => stepFor(r, 'x', nextPath, false, io.env))], undefined, io.env, '');
  const { next } = await prepareRotation(home);
  const newName = `mitm-replay-${certificateFingerprint(next.certPem).slice(0, 8)}`;
  const additions = installs.map((rec) => stepFor(rec, newName, next.certPath, false, io.env));
  const added: Step[] = [];
  try {
    for (const step of additions) {
      for (const command of step.commands) await run(command, io.env);
      added.push(step);
    }
  } catch (err) {
    // leave things as they were: the old CA stays, the new one is taken out again
    for (const step of added) for (const command of stepFor(step.record, newName, next.certPath, true, io.env).commands) await run(command, io.env).catch(() => undefined);
    rmSync(next.certPath, { force: true });
    rmSync(next.keyPath, { force: true });
    throw new Error(`${(err as Error).message}; nothing was rotated (the current CA is unchanged)`);
  }
  const retired = await commitRotation(home, current, next);
  const moved: string[] = [];
  const failures: string[] = [];
  for (const step of removals) {
    try {
      if (!step.isPresent || (await step.isPresent())) for (const command of step.commands) await run(command, io.env);
      moved.push(`  ${step.store}: ${step.touches}`);
    } catch (err) {
      failures.push(`  ${step.store}: ${step.touches}: ${(err as Error).message}`);
    }
  }
  await writeInstalls(home, installs.map((rec) => ({ ...rec, name: newName })));
  const lines = [
    `Rotated the CA: ${newName} replaces ${oldName}. The old key is deleted; its certificate is kept in ${retired}.`,
    installs.length ? `Moved the trust installs to the new CA:\n${moved.join('\n')}` : 'trust-ca recorded no installs in this home: no trust store to move.',
    ...(failures.length ? [`Could not remove the old CA from (do it by hand):\n${failures.join('\n')}`] : []),
    'Programs started by `mitm-replay record`/`env` get the new CA; a shell that ran `eval "$(mitm-replay env)"` before must run it again.',
  ];
  io.stdout.write(lines.join('\n') + '\n');
  return failures.length ? 1 : 0;
}

function perProcessNote(): string {
  return 'Per-process trust needs no install at all: `mitm-replay record` and `mitm-replay env` give the CA to the programs they start.';
}

function detectPlatform(env: NodeJS.ProcessEnv): Platform | undefined {
  const forced = env.MITM_REPLAY_TRUST_PLATFORM;
  if (forced) {
    if (!PLATFORMS.includes(forced as Platform)) {
      throw new UsageError(`MITM_REPLAY_TRUST_PLATFORM=${forced} is not one of ${PLATFORMS.join(', ')}`);
    }
    return forced as Platform;
  }
  if (process.platform === 'darwin') return 'macos';
  if (process.platform !== 'linux') return undefined;
  return (Object.keys(LINUX_STORES) as Array<keyof typeof LINUX_STORES>).find((p) => existsSync(LINUX_STORES[p].anchorDir));
}

function systemStep(platform: Platform, name: string, certPath: string, uninstall: boolean): Step {
  // The system stores belong to root; sudo asks for the password on the terminal when we are not.
  const asRoot = (command: string[]): string[] => (process.getuid?.() === 0 ? command : ['sudo', ...command]);
  if (platform === 'macos') {
    const command = uninstall
      ? ['security', 'remove-trusted-cert', '-d', certPath]
      : ['security', 'add-trusted-cert', '-d', '-k', MACOS_KEYCHAIN, certPath];
    return { store: 'system (macos)', touches: MACOS_KEYCHAIN, commands: [asRoot(command)], record: { store: 'system', platform, name } };
  }
  const store = LINUX_STORES[platform];
  const anchor = `${store.anchorDir}/${name}${store.extension}`;
  const change = uninstall ? ['rm', '-f', anchor] : ['install', '-m', '0644', certPath, anchor];
  return {
    store: `system (${platform})`,
    touches: anchor,
    commands: [asRoot(change), asRoot(store.refresh)],
    isPresent: async () => existsSync(anchor),
    record: { store: 'system', platform, name },
  };
}

function nssStep(db: string, name: string, certPath: string, uninstall: boolean, env: NodeJS.ProcessEnv): Step {
  const command = uninstall
    ? ['certutil', '-D', '-d', db, '-n', name]
    : ['certutil', '-A', '-d', db, '-t', 'C,,,', '-n', name, '-i', certPath];
  return { store: 'nss', touches: db, commands: [command], isPresent: () => nssHas(db, name, env), record: { store: 'nss', db, name } };
}

/** Like mkcert: the user's shared NSS db (Chrome/Chromium on Linux) and every Firefox profile that has one. */
function findNssDbs(env: NodeJS.ProcessEnv, platform: Platform | undefined): string[] {
  const home = env.HOME || homedir();
  const candidates = [join(home, '.pki/nssdb'), join(home, 'snap/chromium/current/.pki/nssdb')];
  const profileRoots =
    platform === 'macos'
      ? [join(home, 'Library/Application Support/Firefox/Profiles')]
      : [join(home, '.mozilla/firefox'), join(home, 'snap/firefox/common/.mozilla/firefox')];
  for (const root of profileRoots) {
    try {
      for (const entry of readdirSync(root, { withFileTypes: true })) {
        if (entry.isDirectory()) candidates.push(join(root, entry.name));
      }
    } catch {
      // no Firefox here
    }
  }
  // cert9.db is the SQLite format (Firefox 58+, all current NSS); the legacy cert8.db format is not supported.
  return candidates.filter((dir) => existsSync(join(dir, 'cert9.db'))).map((dir) => `sql:${dir}`);
}

function explicitNssDb(arg: string): string {
  const dir = resolve(arg.replace(/^sql:/, ''));
  if (!existsSync(join(dir, 'cert9.db'))) {
    throw new UsageError(`--nss-db ${dir} holds no NSS database (cert9.db); create one with: certutil -N -d sql:${dir} --empty-password`);
  }
  return `sql:${dir}`;
}

async function nssHas(db: string, name: string, env: NodeJS.ProcessEnv): Promise<boolean> {
  try {
    await promisify(execFile)('certutil', ['-L', '-d', db, '-n', name], { env });
    return true;
  } catch {
    return false;
  }
}

async function run(command: string[], env: NodeJS.ProcessEnv): Promise<void> {
  try {
    await promisify(execFile)(command[0]!, command.slice(1), { env });
  } catch (err) {
    const { stderr, message } = err as { stderr?: string; message: string };
    const detail = (stderr?.trim() || message).split('\n').filter(Boolean).pop();
    throw new Error(`\`${formatCommand(command)}\` failed: ${detail}`);
  }
}

/** Admin tools like update-ca-certificates live in sbin, which a normal user's PATH may lack but sudo's has. */
const SBIN_DIRS = ['/usr/local/sbin', '/usr/sbin', '/sbin'];

function findExecutable(tool: string, env: NodeJS.ProcessEnv): string | undefined {
  for (const dir of [...(env.PATH ?? '').split(delimiter), ...SBIN_DIRS]) {
    if (!dir) continue;
    const candidate = join(dir, tool);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not in this directory
    }
  }
  return undefined;
}

/** Shell-style quoting, so what --dry-run prints can be pasted into a shell as is. */
function formatCommand(command: string[]): string {
  return command.map((arg) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`)).join(' ');
}
