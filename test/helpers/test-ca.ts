/**
 * Test fixture: a throwaway "upstream" certificate authority.
 *
 * This CA plays the role of the public web PKI for the test upstream server
 * (see upstream.ts). It is deliberately separate from the proxy's own CA: the
 * proxy must be told to trust `caPath` for its upstream connections, while
 * clients trust the proxy's CA.
 *
 * Keys come from node:crypto (RSA 2048); certificates are built and signed
 * with node-forge (SHA-256). The only file written is `upstream-ca.pem` (the
 * CA *certificate*), inside a fresh temp dir; private keys stay in memory.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import forge from 'node-forge';

export const DEFAULT_UPSTREAM_NAMES: readonly string[] = [
  'api.openai.com',
  'api.anthropic.com',
  'tools.example.test',
  'localhost',
  '127.0.0.1',
  '::1',
];

export interface IssueOptions {
  /** Validity start; default: one day ago. */
  notBefore?: Date;
  /** Validity end; default: 30 days from now. Pass a past date for an expired certificate. */
  notAfter?: Date;
}

export interface ServerCert {
  certPem: string;
  keyPem: string;
  names: string[];
}

export interface TestCa {
  /** Temp dir owned by this fixture (removed by cleanup()). */
  dir: string;
  /** `${dir}/upstream-ca.pem` — the CA certificate, for NODE_EXTRA_CA_CERTS / --upstream-ca style options. */
  caPath: string;
  caCertPem: string;
  /** In memory only; never written to disk. */
  caKeyPem: string;
  /** Server certificate (leaf) for `names`, signed by the CA. Pass to startTestUpstream({ tls: { certPem, keyPem } }). */
  certPem: string;
  keyPem: string;
  names: string[];
  /** Issue another leaf from the same CA (e.g. a different name set, or an expired certificate). */
  issue(names: string[], options?: IssueOptions): ServerCert;
  /** Removes the temp dir. */
  cleanup(): Promise<void>;
}

const DAY_MS = 24 * 60 * 60 * 1000;

function generateRsaKeyPem(): { privatePem: string; publicPem: string } {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  return { privatePem: privateKey, publicPem: publicKey };
}

/** Positive, 16-byte serial number as hex (forge wants hex; a leading 0x00..0x7f keeps it positive). */
function randomSerial(): string {
  const bytes = randomBytes(16);
  bytes[0] = bytes[0]! & 0x7f;
  return bytes.toString('hex');
}

function createCaCert(commonName: string): { certPem: string; keyPem: string; cert: forge.pki.Certificate; key: forge.pki.rsa.PrivateKey } {
  const { privatePem, publicPem } = generateRsaKeyPem();
  const key = forge.pki.privateKeyFromPem(privatePem);
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(publicPem);
  cert.serialNumber = randomSerial();
  cert.validity.notBefore = new Date(Date.now() - DAY_MS);
  cert.validity.notAfter = new Date(Date.now() + 365 * DAY_MS);
  const subject = [
    { name: 'commonName', value: commonName },
    { name: 'organizationName', value: 'mitm-replay tests (throwaway)' },
  ];
  cert.setSubject(subject);
  cert.setIssuer(subject);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, digitalSignature: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  cert.sign(key, forge.md.sha256.create());
  return { certPem: forge.pki.certificateToPem(cert), keyPem: privatePem, cert, key };
}

function issueLeaf(
  ca: { cert: forge.pki.Certificate; key: forge.pki.rsa.PrivateKey },
  names: string[],
  options: IssueOptions = {},
): ServerCert {
  if (names.length === 0) throw new Error('issue: at least one name is required');
  const { privatePem, publicPem } = generateRsaKeyPem();
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(publicPem);
  cert.serialNumber = randomSerial();
  cert.validity.notBefore = options.notBefore ?? new Date(Date.now() - DAY_MS);
  cert.validity.notAfter = options.notAfter ?? new Date(Date.now() + 30 * DAY_MS);
  cert.setSubject([{ name: 'commonName', value: names[0]! }]);
  cert.setIssuer(ca.cert.subject.attributes);
  const altNames = names.map((name) => (isIP(name) ? { type: 7, ip: name } : { type: 2, value: name }));
  cert.setExtensions([
    { name: 'basicConstraints', cA: false, critical: true },
    { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
    { name: 'extKeyUsage', serverAuth: true },
    { name: 'subjectAltName', altNames },
    { name: 'subjectKeyIdentifier' },
    // forge computes the key identifier from the issuer's public key.
    { name: 'authorityKeyIdentifier', keyIdentifier: ca.cert.generateSubjectKeyIdentifier().getBytes() },
  ]);
  cert.sign(ca.key, forge.md.sha256.create());
  return { certPem: forge.pki.certificateToPem(cert), keyPem: privatePem, names: [...names] };
}

/**
 * Creates a throwaway upstream CA in a new temp dir and a server certificate for `names`
 * (DNS names and IP literals; defaults to DEFAULT_UPSTREAM_NAMES).
 */
export async function createTestCa(names: readonly string[] = DEFAULT_UPSTREAM_NAMES): Promise<TestCa> {
  const dir = await mkdtemp(join(tmpdir(), 'mitm-replay-upstream-ca-'));
  const ca = createCaCert('mitm-replay test upstream CA');
  const leaf = issueLeaf(ca, [...names]);
  const caPath = join(dir, 'upstream-ca.pem');
  await writeFile(caPath, ca.certPem, { mode: 0o644 });
  return {
    dir,
    caPath,
    caCertPem: ca.certPem,
    caKeyPem: ca.keyPem,
    certPem: leaf.certPem,
    keyPem: leaf.keyPem,
    names: leaf.names,
    issue: (leafNames, options) => issueLeaf(ca, leafNames, options),
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
}
