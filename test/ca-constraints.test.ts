import { afterAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { constraintsFor, loadOrCreateAuthority } from '../src/ca/authority.js';
import { LeafMinter } from '../src/ca/leaf.js';
import { haveTool, runCli } from './helpers/cli.js';

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
const temp = () => {
  const dir = mkdtempSync(join(tmpdir(), 'mitm-replay-nc-'));
  dirs.push(dir);
  return dir;
};

/** openssl's verdict on a leaf under a CA: 'OK' or its error line. */
function opensslVerify(caPem: string, leafPem: string): string {
  const dir = temp();
  writeFileSync(join(dir, 'ca.pem'), caPem);
  writeFileSync(join(dir, 'leaf.pem'), leafPem);
  try {
    return execFileSync('openssl', ['verify', '-CAfile', join(dir, 'ca.pem'), join(dir, 'leaf.pem')], { stdio: 'pipe' }).toString().includes(': OK') ? 'OK' : 'not ok';
  } catch (err) {
    return (err as { stdout?: Buffer; stderr?: Buffer }).stdout?.toString() + ((err as { stderr?: Buffer }).stderr?.toString() ?? '');
  }
}

/** Node's verdict: connect to a TLS server presenting the leaf, trusting the CA. */
async function nodeVerify(caPem: string, leaf: { certPem: string; keyPem: string }, host: string): Promise<string> {
  const server = tls.createServer({ cert: leaf.certPem, key: leaf.keyPem });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  try {
    return await new Promise<string>((resolve) => {
      const socket = tls.connect({ host: '127.0.0.1', port, servername: host, ca: caPem }, () => {
        resolve('OK');
        socket.destroy();
      });
      socket.on('error', (err: Error & { code?: string }) => resolve(err.code ?? err.message));
    });
  } finally {
    server.close();
  }
}

describe('name-constrained CA', () => {
  it('maps an intercept policy to DNS constraints, and refuses *', () => {
    expect(constraintsFor(['api.openai.com', '*.openai.azure.com', 'bedrock-runtime.*.amazonaws.com', 'tools.example.test'])).toEqual([
      'amazonaws.com',
      'api.openai.com',
      'openai.azure.com',
      'tools.example.test',
    ]);
    expect(() => constraintsFor(['*'])).toThrow(/cannot be constrained/);
  });

  it('OpenSSL and Node accept leaves for the intercepted hosts and reject one for another host', async () => {
    haveTool('openssl', ['version']);
    const ca = await loadOrCreateAuthority(temp(), { nameConstraints: ['api.openai.com', 'example.test'] });
    expect(ca.created).toBe(true);
    const minter = new LeafMinter(ca);
    const allowed = await minter.mintLeafCertificate('tools.example.test');
    const other = await minter.mintLeafCertificate('evil.example.com');
    expect(opensslVerify(ca.certPem, allowed.certPem)).toBe('OK');
    expect(opensslVerify(ca.certPem, other.certPem)).toMatch(/permitted subtree violation/i);
    expect(await nodeVerify(ca.certPem, allowed, 'tools.example.test')).toBe('OK');
    // Node refuses it too (it reports OpenSSL's permitted-subtree violation as an UNSPECIFIED verify error)
    const refused = await nodeVerify(ca.certPem, other, 'evil.example.com');
    expect(refused).not.toBe('OK');
    expect(refused).toMatch(/UNSPECIFIED|SUBTREE/i);
    // loopback IP leaves (the daemon's https base-URL route) stay valid; other addresses do not
    expect(opensslVerify(ca.certPem, (await minter.mintLeafCertificate('127.0.0.1')).certPem)).toBe('OK');
    expect(opensslVerify(ca.certPem, (await minter.mintLeafCertificate('10.1.2.3')).certPem)).toMatch(/permitted subtree violation/i);
    // an unconstrained CA (the default) signs for anything
    const plain = await loadOrCreateAuthority(temp());
    expect(opensslVerify(plain.certPem, (await new LeafMinter(plain).mintLeafCertificate('evil.example.com')).certPem)).toBe('OK');
  });

  it('record --name-constraints on a new home creates a constrained CA and still records the intercepted hosts', async () => {
    const home = temp();
    const result = await runCli(['record', '--home', home, '--no-workspace', '--name-constraints', '--intercept', 'api.openai.com', '--', 'true']);
    expect(result.code, result.stderr).toBe(0);
    const text = execFileSync('openssl', ['x509', '-in', join(home, 'certs', 'ca.pem'), '-noout', '-text']).toString();
    expect(text).toMatch(/X509v3 Name Constraints: critical\s+Permitted:\s+DNS:api\.openai\.com/);
    const star = await runCli(['record', '--home', temp(), '--no-workspace', '--name-constraints', '--intercept', '*', '--', 'true']);
    expect(star.code).toBe(125);
    expect(star.stderr).toContain('cannot be constrained');
  });
});
