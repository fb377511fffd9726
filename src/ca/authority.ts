import { X509Certificate, createPrivateKey, createPublicKey, generateKeyPair, randomBytes, sign, type KeyObject } from 'node:crypto';
import { chmod, link, mkdir, open, readFile, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { hostname } from 'node:os';
import { rootCertificates } from 'node:tls';
import { promisify } from 'node:util';
import forge from 'node-forge';
import { ensureHome, homePaths, type HomePaths } from '../home.js';

export interface CertificateAuthority {
  certPem: string;
  keyPem: string;
  certPath: string;
  keyPath: string;
  bundlePath: string;
  /** true when this call generated the CA. */
  created: boolean;
}

const CA_VALIDITY_YEARS = 10;
/** How long to wait for the process that committed the key to commit its certificate (it needs milliseconds). */
const CERT_GRACE_MS = 2_000;

/** Where the operating system keeps its root bundle; the first one that exists wins. */
const SYSTEM_ROOT_BUNDLES = ['/etc/ssl/certs/ca-certificates.crt', '/etc/pki/tls/certs/ca-bundle.crt', '/etc/ssl/cert.pem'];

/** Name attributes as UTF8String, not forge's default PrintableString, which cannot hold '_' (seen in host names). */
export const UTF8_STRING = forge.asn1.Type.UTF8 as unknown as forge.asn1.Class; // @types/node-forge mistypes valueTagClass

const generateKeyPairAsync = promisify(generateKeyPair);
const signAsync = promisify(sign);

/**
 * Loads certs/ca.pem + certs/ca-key.pem from the home, or creates them.
 * Also makes sure certs/bundle.pem (system roots + our CA) exists and contains our CA.
 */
export async function loadOrCreateAuthority(home: string, options: { nameConstraints?: string[] } = {}): Promise<CertificateAuthority> {
  const paths = ensureHome(home);
  const ca = (await readAuthority(paths)) ?? (await createAuthority(paths, options.nameConstraints));
  await ensureBundle(paths, ca.certPem);
  return ca;
}

/** The CA already in the home, or undefined; never creates anything (used by `trust-ca --dry-run`/`--uninstall`). */
export async function loadAuthority(home: string): Promise<CertificateAuthority | undefined> {
  return readAuthority(homePaths(home));
}

/** SHA-256 of the certificate's DER, lowercase hex without colons. */
export function certificateFingerprint(certPem: string): string {
  return new X509Certificate(certPem).fingerprint256.replaceAll(':', '').toLowerCase();
}

/**
 * Certificates are built with node-forge but signed with node:crypto (sha256WithRSAEncryption): node:crypto's
 * async sign runs on the libuv thread pool, while forge's pure-JS RSA would block the event loop ~18 ms per cert.
 *
 * Step 1 (synchronous, ~0.15 ms): encode the TBSCertificate with the signature algorithm fixed to
 * sha256WithRSAEncryption. `issuerDn`, if given, replaces the issuer forge would re-encode from parsed
 * attributes: that re-encoding can differ byte-wise from the CA's own subject (multi-valued RDNs, other string
 * types), and clients build chains by comparing names.
 */
export function encodeToBeSigned(cert: forge.pki.Certificate, issuerDn?: forge.asn1.Asn1, subjectPublicKeyInfo?: forge.asn1.Asn1): Buffer {
  cert.siginfo.algorithmOid = forge.pki.oids.sha256WithRSAEncryption;
  cert.signatureOid = forge.pki.oids.sha256WithRSAEncryption;
  // getTBSCertificate is public in forge but missing from @types/node-forge.
  const tbs = (forge.pki as unknown as { getTBSCertificate(c: forge.pki.Certificate): forge.asn1.Asn1 }).getTBSCertificate(cert);
  if (issuerDn) (tbs.value as forge.asn1.Asn1[])[3] = issuerDn;
  // forge can only encode RSA keys; an EC (or any) key's SubjectPublicKeyInfo is spliced in as DER.
  if (subjectPublicKeyInfo) (tbs.value as forge.asn1.Asn1[])[6] = subjectPublicKeyInfo;
  // certificateToAsn1 uses cert.tbsCertificate when set instead of rebuilding it, so the bytes signed here are
  // exactly the bytes emitted, issuer splice included.
  cert.tbsCertificate = tbs;
  return Buffer.from(forge.asn1.toDer(tbs).getBytes(), 'binary');
}

/** Step 2: sign the encoded TBSCertificate off the main thread, then serialize the certificate (PEM). */
export async function signEncoded(cert: forge.pki.Certificate, tbsDer: Buffer, key: KeyObject): Promise<string> {
  const signature = await signAsync('sha256', tbsDer, key);
  cert.signature = signature.toString('binary'); // forge keeps byte strings; certificateToAsn1 adds the BIT STRING's 0x00
  return forge.pki.certificateToPem(cert);
}

/** 16 random bytes as a positive, minimally encoded DER INTEGER (first byte 0x01..0x7f). */
export function randomSerialHex(): string {
  const bytes = randomBytes(16);
  bytes[0] = bytes[0]! & 0x7f || 0x01;
  return bytes.toString('hex');
}

async function readAuthority(paths: HomePaths): Promise<CertificateAuthority | undefined> {
  const certPem = await readIfExists(paths.caCert);
  const keyPem = await readIfExists(paths.caKey);
  if (keyPem === undefined) {
    // The key is always committed before the certificate, so a lone certificate is not a crash leftover:
    // someone removed the key. Making a new CA silently would break every store that trusts the old one.
    if (certPem !== undefined) throw new Error(`${paths.caCert} has no ${paths.caKey}; move it away to create a new CA`);
    return undefined;
  }
  if (certPem === undefined) return undefined; // being created right now, or a crash in between: see createAuthority
  if (!new X509Certificate(certPem).checkPrivateKey(createPrivateKey(keyPem))) {
    throw new Error(`${paths.caCert} and ${paths.caKey} do not belong together; move them away to create a new CA`);
  }
  // A key readable by others is a key anyone on the machine can intercept with; tighten it silently.
  if (((await stat(paths.caKey)).mode & 0o077) !== 0) await chmod(paths.caKey, 0o600);
  return { certPem, keyPem, certPath: paths.caCert, keyPath: paths.caKey, bundlePath: paths.bundle, created: false };
}

/**
 * Creates the CA without a lock file (which a crashed process would leave behind): each file is committed with
 * link(), which, unlike rename(), fails when the name exists, so exactly one writer wins each file.
 * The key is committed first, and a certificate is only ever made for the committed key, so whichever certificate
 * wins belongs to the key on disk even when several processes start at once.
 */
async function createAuthority(paths: HomePaths, nameConstraints?: string[]): Promise<CertificateAuthority> {
  let ourCert: string | undefined;
  let keyPem = await readIfExists(paths.caKey);
  if (keyPem === undefined) {
    const { privateKey } = await generateKeyPairAsync('rsa', { modulusLength: 2048 });
    const ourKey = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    if (await commitExclusive(paths.caKey, ourKey, 0o600)) {
      keyPem = ourKey;
      ourCert = await selfSignedCaCertificate(privateKey, nameConstraints);
    } else {
      keyPem = await readFile(paths.caKey, 'utf8');
    }
  }
  // If another process committed the key, it commits its certificate milliseconds later. If it crashed in
  // between, any certificate for the committed key will do, so make one after a grace period.
  if (ourCert === undefined && (await waitForFile(paths.caCert, CERT_GRACE_MS)) === undefined) {
    ourCert = await selfSignedCaCertificate(createPrivateKey(keyPem), nameConstraints);
  }
  const created = ourCert !== undefined && (await commitExclusive(paths.caCert, ourCert, 0o644));
  const ca = await readAuthority(paths); // whichever certificate won, re-read and check the pair
  if (!ca) throw new Error(`${paths.caCert} vanished while creating the CA`);
  return { ...ca, created };
}

/** Writes data to a temp file and links it to file. Returns false, writing nothing, if file already exists. */
async function commitExclusive(file: string, data: string, mode: number): Promise<boolean> {
  const tmp = await writeTemp(file, data, mode);
  try {
    await link(tmp, file);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  } finally {
    await rm(tmp, { force: true });
  }
}

async function waitForFile(file: string, timeoutMs: number): Promise<string | undefined> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = await readIfExists(file);
    if (text !== undefined || Date.now() >= deadline) return text;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/**
 * The DNS names a name-constrained CA may issue for, from an intercept policy: `api.openai.com` permits that
 * host (and names below it), `*.corp.example` → `corp.example`; a wildcard inside a name widens to the part
 * after it (`bedrock-runtime.*.amazonaws.com` → `amazonaws.com`). `*` cannot be constrained.
 */
export function constraintsFor(intercept: string[]): string[] {
  const names = intercept.map((pattern) => {
    if (pattern === '*') throw new NameConstraintsError("--name-constraints needs an intercept list; '*' (decrypt everything) cannot be constrained");
    const labels = pattern.split('.');
    const lastWildcard = labels.lastIndexOf('*');
    return labels.slice(lastWildcard + 1).join('.');
  });
  return [...new Set(names.filter((n) => n.includes('.')))].sort();
}

export class NameConstraintsError extends Error {}

/**
 * X.509 NameConstraints (RFC 5280 4.2.1.10): the given dNSName subtrees, plus loopback addresses (127.0.0.0/8,
 * ::1) so the daemon's own https base-URL route keeps working while every other IP address is refused.
 */
type Extension = { id: string; critical: boolean; value: forge.asn1.Asn1 | string };

function nameConstraintsExtension(names: string[]): Extension {
  const { asn1 } = forge;
  const subtree = (name: forge.asn1.Asn1) => asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [name]);
  const bytes = (list: number[]) => String.fromCharCode(...list);
  const loopback = [
    bytes([127, 0, 0, 0, 255, 0, 0, 0]),
    bytes([...Array(15).fill(0), 1, ...Array(16).fill(255)]),
  ];
  const subtrees = [
    ...names.map((name) => subtree(asn1.create(asn1.Class.CONTEXT_SPECIFIC, 2, false, name))),
    ...loopback.map((range) => subtree(asn1.create(asn1.Class.CONTEXT_SPECIFIC, 7, false, range))),
  ];
  return {
    id: '2.5.29.30',
    critical: true,
    value: asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [asn1.create(asn1.Class.CONTEXT_SPECIFIC, 0, true, subtrees)]),
  };
}

async function selfSignedCaCertificate(privateKey: KeyObject, nameConstraints?: string[] | Extension): Promise<string> {
  const constraints = Array.isArray(nameConstraints) ? (nameConstraints.length > 0 ? nameConstraintsExtension(nameConstraints) : undefined) : nameConstraints;
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(createPublicKey(privateKey).export({ type: 'spki', format: 'pem' }).toString());
  cert.serialNumber = randomSerialHex();
  const now = Date.now();
  cert.validity.notBefore = new Date(now - 60 * 60 * 1000); // slack for clients whose clock is behind
  const notAfter = new Date(now);
  notAfter.setFullYear(notAfter.getFullYear() + CA_VALIDITY_YEARS);
  cert.validity.notAfter = notAfter;
  // The hostname and a random suffix tell apart CAs of different machines and homes in a trust store listing.
  const cn = `mitm-replay CA ${hostname()} ${randomBytes(3).toString('hex')}`;
  const subject = [
    { shortName: 'O', value: 'mitm-replay', valueTagClass: UTF8_STRING },
    { shortName: 'CN', value: cn, valueTagClass: UTF8_STRING },
  ];
  cert.setSubject(subject);
  cert.setIssuer(subject);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
    // A constrained CA can only vouch for the intercepted hosts, whoever trusts it.
    ...(constraints ? [constraints] : []),
  ] as never);
  return signEncoded(cert, encodeToBeSigned(cert), privateKey);
}

/**
 * Rotation, step 1: a new key and CA certificate beside the current ones (`certs/ca.next.pem`,
 * `certs/ca-key.next.pem`), with the current CA's name constraints if it has any. Nothing uses them until
 * `commitRotation`; the caller installs the new certificate into the trust stores in between, so no store is
 * ever left without a CA it needs.
 */
export async function prepareRotation(home: string): Promise<{ current: CertificateAuthority; next: CertificateAuthority }> {
  const paths = ensureHome(home);
  const current = await readAuthority(paths);
  if (!current) throw new Error(`no CA in ${paths.certsDir} to rotate; 'mitm-replay trust-ca' creates one`);
  // the constraints extension is copied as it is (DER), so the new CA vouches for exactly the same names
  const parsed = forge.pki.certificateFromPem(current.certPem) as unknown as { getExtension(options: { id: string }): { value: string } | null };
  const constraints = parsed.getExtension({ id: '2.5.29.30' });
  const { privateKey } = await generateKeyPairAsync('rsa', { modulusLength: 2048 });
  const keyPem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const certPem = await selfSignedCaCertificate(privateKey, constraints ? { id: '2.5.29.30', critical: true, value: constraints.value } : undefined);
  const next = { certPem, keyPem, certPath: join(paths.certsDir, 'ca.next.pem'), keyPath: join(paths.certsDir, 'ca-key.next.pem'), bundlePath: paths.bundle, created: true };
  await writeAtomic(next.keyPath, keyPem, 0o600);
  await writeAtomic(next.certPath, certPem, 0o644);
  return { current, next };
}

/**
 * Rotation, step 2: the new CA becomes the home's CA. The old certificate is kept in `certs/retired/` (to find
 * and remove trust installs made by hand); the old key is deleted (retired: nothing can sign with it again);
 * `bundle.pem` holds the system roots and the new CA only. Returns the retired certificate's path.
 */
export async function commitRotation(home: string, current: CertificateAuthority, next: CertificateAuthority): Promise<string> {
  const paths = ensureHome(home);
  const retiredDir = join(paths.certsDir, 'retired');
  await mkdir(retiredDir, { recursive: true, mode: 0o700 });
  const retired = join(retiredDir, `ca-${certificateFingerprint(current.certPem).slice(0, 16)}.pem`);
  await writeAtomic(retired, current.certPem, 0o644);
  // The certificate first: a crash between the two renames leaves a pair readAuthority refuses ("do not belong
  // together"), never a key silently paired with the wrong certificate.
  await rename(next.certPath, paths.caCert);
  await rename(next.keyPath, paths.caKey);
  await writeBundle(paths, next.certPem);
  return retired;
}

async function ensureBundle(paths: HomePaths, caPem: string): Promise<void> {
  const current = await readIfExists(paths.bundle);
  if (current?.includes(caPem.trim())) return;
  await writeBundle(paths, caPem);
}

async function writeBundle(paths: HomePaths, caPem: string): Promise<void> {
  const roots = await systemRoots();
  await writeAtomic(paths.bundle, `${roots.trim()}\n${caPem.trim()}\n`, 0o644);
}

async function systemRoots(): Promise<string> {
  for (const file of SYSTEM_ROOT_BUNDLES) {
    const text = await readIfExists(file);
    if (text !== undefined) return text;
  }
  return rootCertificates.join('\n');
}

async function readIfExists(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

/** Write to a unique temp file in the same directory, then rename: readers never see a half-written file. */
async function writeAtomic(file: string, data: string, mode: number): Promise<void> {
  const tmp = await writeTemp(file, data, mode);
  try {
    await rename(tmp, file);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
}

/** A fully written and synced file next to `file` (same file system, so rename and link work). */
async function writeTemp(file: string, data: string, mode: number): Promise<string> {
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  const handle = await open(tmp, 'wx', mode);
  try {
    await handle.chmod(mode); // open's mode is filtered by the umask; make it exact
    await handle.writeFile(data);
    await handle.sync();
  } catch (err) {
    await handle.close();
    await rm(tmp, { force: true });
    throw err;
  }
  await handle.close();
  return tmp;
}
