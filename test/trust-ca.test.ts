import { execFile, execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { X509Certificate } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { certificateFingerprint, loadOrCreateAuthority } from '../src/ca/authority.js';
import { runTrustCa } from '../src/cli/trust-ca.js';
import { LeafMinter } from '../src/ca/leaf.js';
import { startCliDaemon } from './helpers/cli.js';

const run = promisify(execFile);

const hasCertutil = (() => {
  try {
    execFileSync('certutil', ['-H'], { stdio: 'ignore' });
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== 'ENOENT'; // `certutil -H` exits non-zero even when present
  }
})();
// Locally a missing certutil skips the real NSS test; in CI it must be installed (apt-get install libnss3-tools).
const itWithCertutil = hasCertutil || process.env.CI === 'true' ? it : it.skip;

const tempDirs: string[] = [];
async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'mitm-replay-trust-'));
  tempDirs.push(dir);
  return dir;
}
afterAll(async () => {
  await Promise.all(tempDirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

/** Runs the command in-process with captured output; env replaces process.env for it. */
async function trustCa(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  let stdout = '';
  let stderr = '';
  const code = await runTrustCa(argv, {
    stdout: { write: (s: string) => (stdout += s) },
    stderr: { write: (s: string) => (stderr += s) },
    env,
  });
  return { code, stdout, stderr };
}

/** A temp dir with a home path (not created) and an empty NSS database. */
async function homeAndNssDb(): Promise<{ dir: string; home: string; db: string }> {
  const dir = await tempDir();
  const db = join(dir, 'nssdb');
  await mkdir(db);
  await run('certutil', ['-N', '-d', `sql:${db}`, '--empty-password']);
  return { dir, home: join(dir, 'home'), db };
}

/** Commands that change the system store need sudo unless we are root. */
const sudo = process.getuid?.() === 0 ? '' : 'sudo ';

describe('trust-ca', () => {
  itWithCertutil('--name-constraints creates a CA limited to the --intercept hosts, and installs it', async () => {
    const { dir, home, db } = await homeAndNssDb();
    const installed = await trustCa(['--home', home, '--nss-db', db, '--name-constraints', '--intercept', 'api.openai.com,*.corp.example']);
    expect(installed.code, installed.stderr).toBe(0);
    const text = execFileSync('openssl', ['x509', '-in', join(home, 'certs', 'ca.pem'), '-noout', '-text']).toString();
    expect(text).toMatch(/Name Constraints: critical\s+Permitted:\s+DNS:api\.openai\.com\s+DNS:corp\.example/);
    const bad = await trustCa(['--home', join(dir, 'other'), '--nss-db', db, '--name-constraints', '--intercept', '*']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('cannot be constrained');
  });

  itWithCertutil('installs into and removes from a real NSS database', async () => {
    const { home, db } = await homeAndNssDb();

    const installed = await trustCa(['--home', home, '--stores', 'nss', '--nss-db', db]);
    expect(installed.stderr).toBe('');
    expect(installed.code).toBe(0);
    // The CA did not exist: trust-ca created it.
    const ca = await loadOrCreateAuthority(home);
    expect(ca.created).toBe(false);
    const name = `mitm-replay-${certificateFingerprint(ca.certPem).slice(0, 8)}`;
    expect(installed.stdout).toContain(`Installed the CA`);
    expect(installed.stdout).toContain(`nss: sql:${db}`);
    expect(installed.stdout).toContain('Per-process trust needs no install at all');

    const listed = await run('certutil', ['-L', '-d', `sql:${db}`]);
    expect(listed.stdout).toMatch(new RegExp(`^${name}\\s+C,,\\s*$`, 'm'));
    // What is in the database is our certificate, not just our nickname.
    const exported = await run('certutil', ['-L', '-d', `sql:${db}`, '-n', name, '-a']);
    expect(certificateFingerprint(exported.stdout)).toBe(certificateFingerprint(ca.certPem));

    // Installing twice is harmless.
    expect((await trustCa(['--home', home, '--nss-db', db])).code).toBe(0);

    const removed = await trustCa(['--home', home, '--uninstall', '--nss-db', `sql:${db}`]);
    expect(removed.stderr).toBe('');
    expect(removed.code).toBe(0);
    expect(removed.stdout).toContain(`Removed the CA`);
    expect((await run('certutil', ['-L', '-d', `sql:${db}`])).stdout).not.toContain(name);

    // Removing what is not there is not an error.
    const again = await trustCa(['--home', home, '--uninstall', '--nss-db', db]);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('nothing changed');
  });

  describe('--dry-run plans each system store exactly and changes nothing', () => {
    const plans = {
      debian: (ca: string, name: string) => [
        `${sudo}install -m 0644 ${ca} /usr/local/share/ca-certificates/${name}.crt`,
        `${sudo}update-ca-certificates`,
      ],
      fedora: (ca: string, name: string) => [
        `${sudo}install -m 0644 ${ca} /etc/pki/ca-trust/source/anchors/${name}.pem`,
        `${sudo}update-ca-trust extract`,
      ],
      arch: (ca: string, name: string) => [
        `${sudo}install -m 0644 ${ca} /etc/ca-certificates/trust-source/anchors/${name}.crt`,
        `${sudo}trust extract-compat`,
      ],
      opensuse: (ca: string, name: string) => [
        `${sudo}install -m 0644 ${ca} /usr/share/pki/trust/anchors/${name}.pem`,
        `${sudo}update-ca-certificates`,
      ],
      macos: (ca: string) => [`${sudo}security add-trusted-cert -d -k /Library/Keychains/System.keychain ${ca}`],
    };
    const unplans = {
      debian: (_ca: string, name: string) => [`${sudo}rm -f /usr/local/share/ca-certificates/${name}.crt`, `${sudo}update-ca-certificates`],
      fedora: (_ca: string, name: string) => [`${sudo}rm -f /etc/pki/ca-trust/source/anchors/${name}.pem`, `${sudo}update-ca-trust extract`],
      arch: (_ca: string, name: string) => [`${sudo}rm -f /etc/ca-certificates/trust-source/anchors/${name}.crt`, `${sudo}trust extract-compat`],
      opensuse: (_ca: string, name: string) => [`${sudo}rm -f /usr/share/pki/trust/anchors/${name}.pem`, `${sudo}update-ca-certificates`],
      macos: (ca: string) => [`${sudo}security remove-trusted-cert -d ${ca}`],
    };

    it.each(Object.keys(plans) as Array<keyof typeof plans>)('%s', async (platform) => {
      const home = join(await tempDir(), 'home');
      const ca = await loadOrCreateAuthority(home);
      const name = `mitm-replay-${certificateFingerprint(ca.certPem).slice(0, 8)}`;
      const env = { ...process.env, MITM_REPLAY_TRUST_PLATFORM: platform };

      const install = await trustCa(['--home', home, '--dry-run', '--stores', 'system'], env);
      expect(install.stderr).toBe('');
      expect(install.code).toBe(0);
      const lines = install.stdout.split('\n').map((l) => l.trim());
      expect(lines[0]).toBe('Dry run: nothing was changed.');
      const commands = plans[platform](ca.certPath, name);
      for (const command of commands) expect(lines).toContain(command);
      const touched = platform === 'macos' ? '/Library/Keychains/System.keychain' : commands[0]!.split(' ').at(-1)!;
      expect(lines).toContain(`system (${platform}): change ${touched}`);
      if (platform !== 'macos') expect(existsSync(touched)).toBe(false);

      const uninstall = await trustCa(['--home', home, '--dry-run', '--uninstall', '--stores', 'system'], env);
      expect(uninstall.code).toBe(0);
      const unlines = uninstall.stdout.split('\n').map((l) => l.trim());
      for (const command of unplans[platform](ca.certPath, name)) expect(unlines).toContain(command);
    });
  });

  it('finds NSS databases in the usual places and does not create a CA for a dry run', async () => {
    const fakeHome = await tempDir();
    const pki = join(fakeHome, '.pki/nssdb');
    const profile = join(fakeHome, '.mozilla/firefox/abcd.default-release');
    const noDb = join(fakeHome, '.mozilla/firefox/Crash Reports');
    for (const dir of [pki, profile, noDb]) await mkdir(dir, { recursive: true });
    await writeFile(join(pki, 'cert9.db'), '');
    await writeFile(join(profile, 'cert9.db'), '');
    const home = join(fakeHome, 'mitm-home');

    const { code, stdout } = await trustCa(['--home', home, '--dry-run', '--stores', 'nss'], { ...process.env, HOME: fakeHome });
    expect(code).toBe(0);
    const lines = stdout.split('\n').map((l) => l.trim());
    const ca = join(home, 'certs/ca.pem');
    expect(lines).toContain(`certutil -A -d sql:${pki} -t C,,, -n mitm-replay-XXXXXXXX -i ${ca}`);
    expect(lines).toContain(`certutil -A -d sql:${profile} -t C,,, -n mitm-replay-XXXXXXXX -i ${ca}`);
    expect(stdout).not.toContain('Crash Reports');
    expect(stdout).toContain(`No CA in ${home} yet`);
    expect(existsSync(home)).toBe(false);
  });

  it('names the package when certutil is missing, before changing anything', async () => {
    const dir = await tempDir();
    await writeFile(join(dir, 'cert9.db'), '');
    const home = join(dir, 'home');
    const env = { ...process.env, PATH: join(dir, 'no-such-bin'), MITM_REPLAY_TRUST_PLATFORM: 'debian' };
    const { code, stdout, stderr } = await trustCa(['--home', home, '--nss-db', dir], env);
    expect(code).toBe(1);
    expect(stderr).toBe('mitm-replay trust-ca: certutil not found; install libnss3-tools\n');
    expect(stdout).toBe('');
  });

  it('prints usage for --help', async () => {
    const { code, stdout, stderr } = await trustCa(['--help']);
    expect(code).toBe(0);
    expect(stderr).toBe('');
    expect(stdout).toMatch(/^Usage: mitm-replay trust-ca /);
    expect(stdout).toContain('MITM_REPLAY_TRUST_PLATFORM');
  });

  it.each([
    [['--frobnicate'], 'unknown option --frobnicate'],
    [['--stores', 'system,java'], 'unknown store "java" (known: system, nss)'],
    [['--stores'], '--stores needs a value'],
    [['--home', '--dry-run'], '--home needs a value'],
    [['--dry-run=yes'], '--dry-run takes no value'],
    [['install'], 'unexpected argument "install"'],
  ])('rejects %j with exit code 2 and one line', async (argv, message) => {
    const { code, stdout, stderr } = await trustCa(argv);
    expect(code).toBe(2);
    expect(stdout).toBe('');
    expect(stderr).toBe(`mitm-replay trust-ca: ${message} (see mitm-replay trust-ca --help)\n`);
  });

  it('rejects an unknown MITM_REPLAY_TRUST_PLATFORM and an --nss-db without a database', async () => {
    const dir = await tempDir();
    const badPlatform = await trustCa(['--dry-run', '--home', dir], { ...process.env, MITM_REPLAY_TRUST_PLATFORM: 'windows' });
    expect(badPlatform.code).toBe(2);
    expect(badPlatform.stderr.trim().split('\n')).toHaveLength(1);
    const noDb = await trustCa(['--dry-run', '--home', dir, '--nss-db', dir]);
    expect(noDb.code).toBe(2);
    expect(noDb.stderr).toContain('holds no NSS database');
    expect(noDb.stderr.trim().split('\n')).toHaveLength(1);
  });

  itWithCertutil('--rotate: a new CA with the same constraints, the NSS install moved to it, the old key gone', async () => {
    const { home, db } = await homeAndNssDb();
    expect((await trustCa(['--home', home, '--nss-db', db, '--name-constraints', '--intercept', 'api.openai.com'])).code).toBe(0);
    const old = await loadOrCreateAuthority(home);
    const oldFp = certificateFingerprint(old.certPem);
    const installs = JSON.parse(readFileSync(join(home, 'certs', 'installs.json'), 'utf8'));
    expect(installs.installs).toEqual([{ store: 'nss', db: `sql:${db}`, name: `mitm-replay-${oldFp.slice(0, 8)}` }]);

    // the plan changes nothing
    const plan = await trustCa(['--home', home, '--rotate', '--dry-run']);
    expect(plan.code, plan.stderr).toBe(0);
    expect(plan.stdout).toContain(`certutil -A -d sql:${db} -t C,,, -n mitm-replay-XXXXXXXX`);
    expect(plan.stdout).toContain(`certutil -D -d sql:${db} -n mitm-replay-${oldFp.slice(0, 8)}`);
    expect(certificateFingerprint(readFileSync(join(home, 'certs', 'ca.pem'), 'utf8'))).toBe(oldFp);
    expect(readdirSync(join(home, 'certs')).sort()).toEqual(['bundle.pem', 'ca-key.pem', 'ca.pem', 'installs.json']);

    // refused while a daemon signs with the current CA
    const daemon = await startCliDaemon([], home);
    try {
      const busy = await trustCa(['--home', home, '--rotate']);
      expect(busy.code).toBe(1);
      expect(busy.stderr).toMatch(/a daemon \(pid \d+\) is running for .* stop it, then rotate/);
    } finally {
      daemon.child.kill('SIGTERM');
      await new Promise((resolve) => daemon.child.once('exit', resolve));
    }

    const rotated = await trustCa(['--home', home, '--rotate']);
    expect(rotated.code, rotated.stderr).toBe(0);
    const next = await loadOrCreateAuthority(home);
    const newFp = certificateFingerprint(next.certPem);
    expect(newFp).not.toBe(oldFp);
    expect(rotated.stdout).toContain(`mitm-replay-${newFp.slice(0, 8)} replaces mitm-replay-${oldFp.slice(0, 8)}`);
    // the store trusts the new CA and no longer the old one
    const listed = (await run('certutil', ['-L', '-d', `sql:${db}`])).stdout;
    expect(listed).toContain(`mitm-replay-${newFp.slice(0, 8)}`);
    expect(listed).not.toContain(`mitm-replay-${oldFp.slice(0, 8)}`);
    // same name constraints
    const text = execFileSync('openssl', ['x509', '-in', join(home, 'certs', 'ca.pem'), '-noout', '-text']).toString();
    expect(text).toMatch(/Name Constraints: critical\s+Permitted:\s+DNS:api\.openai\.com/);
    // the old key is nowhere in the home; the old certificate is retired; the bundle holds only the new CA
    const files = readdirSync(home, { recursive: true, withFileTypes: true }).filter((e) => e.isFile()).map((e) => readFileSync(join(e.parentPath, e.name), 'utf8'));
    expect(files.some((f) => f.includes(old.keyPem.trim()))).toBe(false);
    expect(readFileSync(join(home, 'certs', 'retired', `ca-${oldFp.slice(0, 16)}.pem`), 'utf8')).toBe(old.certPem);
    const bundle = readFileSync(join(home, 'certs', 'bundle.pem'), 'utf8');
    expect(bundle).toContain(next.certPem.trim());
    expect(bundle).not.toContain(old.certPem.trim());
    expect(statSync(join(home, 'certs', 'ca-key.pem')).mode & 0o777).toBe(0o600);
    // leaves minted now chain to the new CA only
    const leaf = new X509Certificate((await new LeafMinter(next).mintLeafCertificate('api.openai.com')).certPem);
    expect(leaf.verify(new X509Certificate(next.certPem).publicKey)).toBe(true);
    expect(leaf.verify(new X509Certificate(old.certPem).publicKey)).toBe(false);
    expect(JSON.parse(readFileSync(join(home, 'certs', 'installs.json'), 'utf8')).installs[0].name).toBe(`mitm-replay-${newFp.slice(0, 8)}`);
  });

  itWithCertutil('--rotate: when the new CA cannot be installed, nothing is rotated', async () => {
    const { dir, home, db } = await homeAndNssDb();
    expect((await trustCa(['--home', home, '--nss-db', db])).code).toBe(0);
    const before = readFileSync(join(home, 'certs', 'ca.pem'), 'utf8');
    const keyBefore = readFileSync(join(home, 'certs', 'ca-key.pem'), 'utf8');
    // a recorded install whose database has gone since
    const installs = JSON.parse(readFileSync(join(home, 'certs', 'installs.json'), 'utf8'));
    installs.installs.push({ store: 'nss', db: `sql:${join(dir, 'gone')}`, name: installs.installs[0].name });
    writeFileSync(join(home, 'certs', 'installs.json'), JSON.stringify(installs));
    const failed = await trustCa(['--home', home, '--rotate']);
    expect(failed.code).toBe(1);
    expect(failed.stderr).toMatch(/^mitm-replay trust-ca: .*; nothing was rotated \(the current CA is unchanged\)\n$/);
    expect(readFileSync(join(home, 'certs', 'ca.pem'), 'utf8')).toBe(before);
    expect(readFileSync(join(home, 'certs', 'ca-key.pem'), 'utf8')).toBe(keyBefore);
    expect(readdirSync(join(home, 'certs')).sort()).toEqual(['bundle.pem', 'ca-key.pem', 'ca.pem', 'installs.json']);
    // the database that worked trusts the current CA only (the new one was taken out again)
    const listed = (await run('certutil', ['-L', '-d', `sql:${db}`])).stdout;
    expect(listed.match(/mitm-replay-[0-9a-f]{8}/g)).toEqual([`mitm-replay-${certificateFingerprint(before).slice(0, 8)}`]);
  });

  it('--rotate: bad combinations and a home without a CA get one line', async () => {
    const dir = await tempDir();
    const bad = await trustCa(['--home', dir, '--rotate', '--uninstall']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^mitm-replay trust-ca: --rotate .* takes only --home and --dry-run \(see mitm-replay trust-ca --help\)\n$/);
    const none = await trustCa(['--home', join(dir, 'empty'), '--rotate']);
    expect(none.code).toBe(1);
    expect(none.stderr).toMatch(/^mitm-replay trust-ca: no CA in .* to rotate; 'mitm-replay trust-ca' creates one\n$/);
  });
});
