import { execFile } from 'node:child_process';
import { X509Certificate, createPrivateKey, generateKeyPairSync } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { connect, TLSSocket } from 'node:tls';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadOrCreateAuthority, type CertificateAuthority } from '../src/ca/authority.js';
import { LeafMinter, normalizeHost } from '../src/ca/leaf.js';

const run = promisify(execFile);
const repo = join(dirname(fileURLToPath(import.meta.url)), '..');
const DAY_MS = 24 * 60 * 60 * 1000;

const tempDirs: string[] = [];
async function tempDir(prefix = 'mitm-replay-ca-'): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  tempDirs.push(dir);
  return dir;
}
afterAll(async () => {
  await Promise.all(tempDirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

describe('loadOrCreateAuthority', () => {
  it('creates the CA once and reuses it, with a private home and key', async () => {
    const home = join(await tempDir(), 'home');
    const first = await loadOrCreateAuthority(home);
    expect(first.created).toBe(true);
    expect(first.certPath).toBe(join(home, 'certs', 'ca.pem'));
    expect(first.keyPath).toBe(join(home, 'certs', 'ca-key.pem'));
    expect(first.bundlePath).toBe(join(home, 'certs', 'bundle.pem'));

    const second = await loadOrCreateAuthority(home);
    expect(second.created).toBe(false);
    expect(second.certPem).toBe(first.certPem);
    expect(second.keyPem).toBe(first.keyPem);

    expect((await stat(home)).mode & 0o777).toBe(0o700);
    expect((await stat(join(home, 'certs'))).mode & 0o777).toBe(0o700);
    expect((await stat(first.keyPath)).mode & 0o777).toBe(0o600);
    expect(await readFile(first.keyPath, 'utf8')).toBe(first.keyPem);
    expect(await readFile(first.certPath, 'utf8')).toBe(first.certPem);
  });

  it('makes a 10-year CA certificate with the right constraints', async () => {
    const ca = await loadOrCreateAuthority(await tempDir());
    const cert = new X509Certificate(ca.certPem);
    expect(cert.ca).toBe(true);
    expect(cert.subject).toMatch(/^O=mitm-replay\nCN=mitm-replay CA \S+ [0-9a-f]{6}$/);
    expect(cert.issuer).toBe(cert.subject);
    expect(cert.verify(cert.publicKey)).toBe(true); // self-signed, and the node:crypto signature is valid
    expect(cert.checkPrivateKey(createPrivateKey(ca.keyPem))).toBe(true);
    const years = (Date.parse(cert.validTo) - Date.parse(cert.validFrom)) / (365.25 * DAY_MS);
    expect(years).toBeGreaterThan(9.9);
    expect(years).toBeLessThan(10.1);

    const caFile = join(await tempDir(), 'ca.pem');
    await writeFile(caFile, ca.certPem);
    const { stdout } = await run('openssl', ['x509', '-in', caFile, '-noout', '-ext', 'basicConstraints,keyUsage,subjectKeyIdentifier']);
    expect(stdout).toMatch(/Basic Constraints: critical\n\s+CA:TRUE/);
    expect(stdout).toMatch(/Key Usage: critical\n\s+Certificate Sign, CRL Sign/);
    expect(stdout).toMatch(/Subject Key Identifier:\s*\n\s+[0-9A-F:]{59}/);
  });

  it('gives concurrent callers in one process the same CA', async () => {
    const home = await tempDir();
    const results = await Promise.all(Array.from({ length: 5 }, () => loadOrCreateAuthority(home)));
    expect(new Set(results.map((ca) => ca.certPem)).size).toBe(1);
    expect(results.filter((ca) => ca.created)).toHaveLength(1);
    expect(await readFile(results[0]!.certPath, 'utf8')).toBe(results[0]!.certPem);
  });

  it('gives processes that start at once the same CA', async () => {
    // Transpile the module (and home.ts) so plain `node` processes can run it.
    const build = await tempDir('mitm-replay-ca-build-');
    await mkdir(join(build, 'ca'));
    await symlink(join(repo, 'node_modules'), join(build, 'node_modules'));
    await writeFile(join(build, 'package.json'), '{"type":"module"}');
    for (const file of ['home.ts', 'ca/authority.ts']) {
      const source = await readFile(join(repo, 'src', file), 'utf8');
      const { outputText } = ts.transpileModule(source, {
        compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, esModuleInterop: true },
      });
      await writeFile(join(build, file.replace(/\.ts$/, '.js')), outputText);
    }
    const home = await tempDir();
    const script = `const { loadOrCreateAuthority, certificateFingerprint } = await import(${JSON.stringify(join(build, 'ca/authority.js'))});
      const ca = await loadOrCreateAuthority(${JSON.stringify(home)});
      console.log(JSON.stringify({ fingerprint: certificateFingerprint(ca.certPem), created: ca.created }));`;
    const outputs = await Promise.all(Array.from({ length: 4 }, () => run(process.execPath, ['--input-type=module', '-e', script])));
    const results = outputs.map(({ stdout }) => JSON.parse(stdout) as { fingerprint: string; created: boolean });
    expect(new Set(results.map((r) => r.fingerprint)).size).toBe(1);
    expect(results.filter((r) => r.created)).toHaveLength(1);
    const onDisk = await loadOrCreateAuthority(home);
    expect(new X509Certificate(onDisk.certPem).checkPrivateKey(createPrivateKey(onDisk.keyPem))).toBe(true);
  });

  it('finishes a CA whose creator crashed between key and certificate', async () => {
    const home = await tempDir();
    await mkdir(join(home, 'certs'), { recursive: true });
    const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const keyPem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    await writeFile(join(home, 'certs', 'ca-key.pem'), keyPem, { mode: 0o600 });
    const ca = await loadOrCreateAuthority(home);
    expect(ca.created).toBe(true);
    expect(ca.keyPem).toBe(keyPem);
    expect(new X509Certificate(ca.certPem).checkPrivateKey(privateKey)).toBe(true);
  });

  it('refuses a certificate whose key was removed', async () => {
    const home = await tempDir();
    const ca = await loadOrCreateAuthority(home);
    await rm(ca.keyPath);
    await expect(loadOrCreateAuthority(home)).rejects.toThrow(/has no .*ca-key\.pem; move it away/);
  });

  it('refuses a cert and key that do not belong together', async () => {
    const [a, b] = [await tempDir(), await tempDir()];
    const caA = await loadOrCreateAuthority(a);
    const caB = await loadOrCreateAuthority(b);
    await writeFile(caA.keyPath, caB.keyPem, { mode: 0o600 });
    await expect(loadOrCreateAuthority(a)).rejects.toThrow(/do not belong together/);
  });

  it('writes bundle.pem with the system roots and our CA, and repairs it', async () => {
    const ca = await loadOrCreateAuthority(await tempDir());
    const countCerts = (pem: string) => pem.split('-----BEGIN CERTIFICATE-----').length - 1;
    const bundle = await readFile(ca.bundlePath, 'utf8');
    expect(bundle).toContain(ca.certPem.trim());
    expect(countCerts(bundle)).toBeGreaterThan(10);

    await rm(ca.bundlePath);
    await loadOrCreateAuthority(join(ca.certPath, '..', '..'));
    expect(await readFile(ca.bundlePath, 'utf8')).toBe(bundle);

    await writeFile(ca.bundlePath, 'stale\n');
    await loadOrCreateAuthority(join(ca.certPath, '..', '..'));
    expect(await readFile(ca.bundlePath, 'utf8')).toBe(bundle);
  });
});

describe('LeafMinter', () => {
  let ca: CertificateAuthority;
  let caFile: string;
  let dir: string;

  beforeAll(async () => {
    dir = await tempDir();
    ca = await loadOrCreateAuthority(join(dir, 'home'));
    caFile = ca.certPath;
  });

  /**
   * A TLS server the way the proxy uses the minter: a context for the address the client asked for,
   * replaced through SNI when the client names a host.
   */
  async function startTlsServer(minter: LeafMinter, listenHost: string): Promise<{ port: number; server: Server }> {
    const server = createServer({ pauseOnConnect: true }, (socket) => {
      minter.secureContextFor(listenHost).then((secureContext) => {
        const tlsSocket = new TLSSocket(socket, {
          isServer: true,
          secureContext,
          SNICallback: (name, done) => minter.secureContextFor(name).then((ctx) => done(null, ctx), done),
        });
        tlsSocket.on('secure', () => tlsSocket.end('hello'));
        tlsSocket.on('error', () => tlsSocket.destroy());
      }, () => socket.destroy());
    });
    await new Promise<void>((resolve) => server.listen(0, listenHost, resolve));
    return { port: (server.address() as AddressInfo).port, server };
  }

  async function handshake(options: { host: string; port: number; servername?: string }) {
    return new Promise<{ authorized: boolean; error?: string; subjectaltname?: string; body: string }>((resolve, reject) => {
      const socket = connect({ ...options, ca: ca.certPem }, () => {
        let body = '';
        socket.setEncoding('utf8');
        socket.on('data', (chunk: string) => (body += chunk));
        socket.on('end', () =>
          resolve({
            authorized: socket.authorized,
            error: socket.authorizationError?.toString(),
            subjectaltname: socket.getPeerCertificate().subjectaltname,
            body,
          }),
        );
      });
      socket.on('error', reject);
    });
  }

  async function opensslVerify(certPem: string, ...checks: string[]): Promise<string> {
    const leafFile = join(dir, `leaf-${Math.random().toString(16).slice(2)}.pem`);
    await writeFile(leafFile, certPem);
    const { stdout } = await run('openssl', ['verify', '-CAfile', caFile, '-purpose', 'sslserver', ...checks, leafFile]);
    return stdout.trim().replace(leafFile, 'leaf.pem');
  }

  it('mints a DNS leaf that Node and openssl accept', async () => {
    const minter = new LeafMinter(ca);
    const { server, port } = await startTlsServer(minter, '127.0.0.1');
    try {
      const result = await handshake({ host: '127.0.0.1', port, servername: 'api.example.test' });
      expect(result).toMatchObject({ authorized: true, subjectaltname: 'DNS:api.example.test', body: 'hello' });
    } finally {
      server.close();
    }
    const { certPem } = await minter.mintLeafCertificate('api.example.test');
    expect(await opensslVerify(certPem, '-verify_hostname', 'api.example.test')).toBe('leaf.pem: OK');
    const cert = new X509Certificate(certPem);
    expect(cert.subjectAltName).toBe('DNS:api.example.test');
    expect(cert.subject).toBe('CN=api.example.test');
    expect(cert.ca).toBe(false);
    expect(cert.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
  });

  it.each(['127.0.0.1', '::1'])('mints an IP leaf for %s that Node and openssl accept', async (ip) => {
    const minter = new LeafMinter(ca);
    const { server, port } = await startTlsServer(minter, ip);
    try {
      // No servername: Node sends no SNI for an IP and checks the IP against the certificate's iPAddress SAN.
      const result = await handshake({ host: ip, port });
      expect(result).toMatchObject({ authorized: true, body: 'hello' });
      expect(result.subjectaltname).toMatch(/^IP Address:/);
    } finally {
      server.close();
    }
    const { certPem } = await minter.mintLeafCertificate(ip);
    expect(await opensslVerify(certPem, '-verify_ip', ip)).toBe('leaf.pem: OK');
    const cert = new X509Certificate(certPem);
    expect(cert.subjectAltName).toMatch(/^IP Address:[0-9.:A-F]+$/i);
    expect(cert.checkIP(ip)).toBe(ip);
  });

  it('keeps leaves short-lived', async () => {
    for (const validityDays of [undefined, 90]) {
      const { certPem } = await new LeafMinter(ca, { validityDays }).mintLeafCertificate('short.example.test');
      const cert = new X509Certificate(certPem);
      const days = (Date.parse(cert.validTo) - Date.now()) / DAY_MS;
      expect(days).toBeGreaterThan((validityDays ?? 30) - 0.01);
      expect(days).toBeLessThanOrEqual(validityDays ?? 30);
      expect(Date.parse(cert.validFrom)).toBeLessThan(Date.now() - 59 * 60 * 1000); // clock-skew slack
    }
    expect(() => new LeafMinter(ca, { validityDays: 91 })).toThrow(RangeError);
    expect(() => new LeafMinter(ca, { validityDays: 0 })).toThrow(RangeError);
  });

  it('serves the second connection for a host from the cache', async () => {
    const minter = new LeafMinter(ca);
    const { server, port } = await startTlsServer(minter, '127.0.0.1');
    try {
      expect((await handshake({ host: '127.0.0.1', port })).authorized).toBe(true);
      expect(minter.stats).toEqual({ hits: 0, misses: 1, size: 1 });
      expect((await handshake({ host: '127.0.0.1', port })).authorized).toBe(true);
      expect(minter.stats).toEqual({ hits: 1, misses: 1, size: 1 });
    } finally {
      server.close();
    }
  });

  it('mints once for concurrent requests, one context per host, evicting beyond cacheSize', async () => {
    const minter = new LeafMinter(ca, { cacheSize: 2 });
    const contexts = await Promise.all([minter.secureContextFor('a.test'), minter.secureContextFor('A.TEST.'), minter.secureContextFor('a.test')]);
    expect(new Set(contexts).size).toBe(1);
    expect(minter.stats).toEqual({ hits: 2, misses: 1, size: 1 });
    await minter.secureContextFor('b.test');
    await minter.secureContextFor('c.test');
    expect(minter.stats.size).toBe(2);
  });

  it('normalizes hosts and rejects what is not one', () => {
    expect(normalizeHost('[::1]')).toBe('::1');
    expect(normalizeHost('::FFFF:127.0.0.1')).toBe('::ffff:7f00:1');
    expect(normalizeHost('Api.Example.TEST.')).toBe('api.example.test');
    for (const bad of ['', 'a b', 'x/y', 'a..b', 'ä.test', ':::']) expect(() => normalizeHost(bad)).toThrow(TypeError);
  });

  it('rejects (does not throw) for a bad host, and serves the same context for [::1] and ::1', async () => {
    const minter = new LeafMinter(ca);
    await expect(minter.secureContextFor('bad host')).rejects.toThrow(TypeError);
    expect(await minter.secureContextFor('[::1]')).toBe(await minter.secureContextFor('::1'));
  });

  // The figure (event-loop delay p99 <= 5 ms while minting 100 hosts) is measured in bench/, not here: timed
  // assertions flake on a shared 2-core machine. This test checks the structure that makes it possible:
  // minting yields to the event loop between hosts instead of running as one blocking stretch.
  it('yields to the event loop while minting 100 hosts', async () => {
    const minter = new LeafMinter(ca);
    await minter.secureContextFor('warm-up.test');
    let turns = 0;
    let minting = true;
    const tick = () => {
      turns++;
      if (minting) setImmediate(tick);
    };
    setImmediate(tick);
    const contexts = await Promise.all(Array.from({ length: 100 }, (_, i) => minter.secureContextFor(`host-${i}.test`)));
    minting = false;
    expect(new Set(contexts).size).toBe(100);
    expect(minter.stats.misses).toBe(101);
    // one blocking stretch would give a handful of turns; per-host yielding gives at least one per host
    expect(turns).toBeGreaterThanOrEqual(100);
  });
});
