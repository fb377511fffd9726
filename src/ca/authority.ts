import { X509Certificate, createPrivateKey, generateKeyPair, randomBytes, sign, type KeyObject } from 'node:crypto';
import { open, readFile, rename, rm, stat, chmod } from 'node:fs/promises';
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
/** A lock older than this is left over from a crashed process (generation takes well under a second). */
const STALE_LOCK_MS = 30_000;
const LOCK_POLL_MS = 25;

/** Where the operating system keeps its root bundle; the first one that exists wins. */
const SYSTEM_ROOT_BUNDLES = ['/etc/ssl/certs/ca-certificates.crt', '/etc/pki/tls/certs/ca-bundle.crt', '/etc/ssl/cert.pem'];

const generateKeyPairAsync = promisify(generateKeyPair);
const signAsync = promisify(sign);

/**
 * Loads certs/ca.pem + certs/ca-key.pem from the home, or creates them.
 * Also makes sure certs/bundle.pem (system roots + our CA) exists and contains our CA.
 */
export async function loadOrCreateAuthority(home: string): Promise<CertificateAuthority> {
  const paths = ensureHome(home);
  let ca = await readAuthority(paths);
  if (!ca) ca = await createUnderLock(paths);
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
export function encodeToBeSigned(cert: forge.pki.Certificate, issuerDn?: forge.asn1.Asn1): Buffer {
  cert.siginfo.algorithmOid = forge.pki.oids.sha256WithRSAEncryption;
  // getTBSCertificate is public in forge but missing from @types/node-forge.
  const tbs = (forge.pki as unknown as { getTBSCertificate(c: forge.pki.Certificate): forge.asn1.Asn1 }).getTBSCertificate(cert);
  if (issuerDn) (tbs.value as forge.asn1.Asn1[])[3] = issuerDn;
  return Buffer.from(forge.asn1.toDer(tbs).getBytes(), 'binary');
}

/** AlgorithmIdentifier { sha256WithRSAEncryption (1.2.840.113549.1.1.11), NULL }, as in the TBSCertificate. */
const SHA256_WITH_RSA = Buffer.from('300d06092a864886f70d01010b0500', 'hex');

/**
 * Step 2: sign the TBSCertificate off the main thread and wrap it as Certificate ::= SEQUENCE { tbs, algorithm,
 * BIT STRING signature }. Assembling these three DER pieces here, instead of handing the signature back to forge's
 * certificateToPem, means no forge object stays alive while signatures are pending: with 100 mints in flight,
 * those object graphs made young-generation GC pauses of 3-5 ms.
 */
export async function signEncoded(tbsDer: Buffer, key: KeyObject): Promise<string> {
  const signature = await signAsync('sha256', tbsDer, key);
  const der = derElement(0x30, Buffer.concat([tbsDer, SHA256_WITH_RSA, derElement(0x03, Buffer.concat([Buffer.of(0), signature]))]));
  const base64Lines = der.toString('base64').match(/.{1,64}/g)!.join('\n');
  return `-----BEGIN CERTIFICATE-----\n${base64Lines}\n-----END CERTIFICATE-----\n`;
}

/** A DER tag-length-value with definite length (certificates stay far below 64 KiB). */
function derElement(tag: number, content: Buffer): Buffer {
  const n = content.length;
  if (n >= 0x10000) throw new RangeError('DER element too long');
  const header = n < 0x80 ? [tag, n] : n < 0x100 ? [tag, 0x81, n] : [tag, 0x82, n >> 8, n & 0xff];
  return Buffer.concat([Buffer.from(header), content]);
}

/** 16 random bytes as a positive, minimally encoded DER INTEGER (first byte 0x01..0x7f). */
export function randomSerialHex(): string {
  const bytes = randomBytes(16);
  bytes[0] = bytes[0]! & 0x7f || 0x01;
  return bytes.toString('hex');
}

async function readAuthority(paths: HomePaths): Promise<CertificateAuthority | undefined> {
  // ca.pem is written last, so its presence means the pair is complete (see createUnderLock).
  const certPem = await readIfExists(paths.caCert);
  if (certPem === undefined) return undefined;
  const keyPem = await readIfExists(paths.caKey);
  if (keyPem === undefined) return undefined;
  if (!new X509Certificate(certPem).checkPrivateKey(createPrivateKey(keyPem))) {
    throw new Error(`${paths.caCert} and ${paths.caKey} do not belong together; move them away to create a new CA`);
  }
  // A key readable by others is a key anyone on the machine can intercept with; tighten it silently.
  if (((await stat(paths.caKey)).mode & 0o077) !== 0) await chmod(paths.caKey, 0o600);
  return { certPem, keyPem, certPath: paths.caCert, keyPath: paths.caKey, bundlePath: paths.bundle, created: false };
}

/** Only one process generates; the others wait for the lock and then read what it wrote. */
async function createUnderLock(paths: HomePaths): Promise<CertificateAuthority> {
  const lockPath = `${paths.certsDir}/.ca.lock`;
  await acquireLock(lockPath);
  try {
    const existing = await readAuthority(paths);
    if (existing) return existing;
    const { certPem, keyPem } = await generateAuthority();
    // Key first, cert last: readers treat ca.pem as "the pair is complete".
    await writeAtomic(paths.caKey, keyPem, 0o600);
    await writeAtomic(paths.caCert, certPem, 0o644);
    return { certPem, keyPem, certPath: paths.caCert, keyPath: paths.caKey, bundlePath: paths.bundle, created: true };
  } finally {
    await rm(lockPath, { force: true });
  }
}

async function acquireLock(lockPath: string): Promise<void> {
  for (;;) {
    try {
      const handle = await open(lockPath, 'wx', 0o600);
      await handle.writeFile(String(process.pid));
      await handle.close();
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    if (await lockIsStale(lockPath)) {
      await rm(lockPath, { force: true });
      continue;
    }
    await new Promise((resolve) => setTimeout(resolve, LOCK_POLL_MS));
  }
}

async function lockIsStale(lockPath: string): Promise<boolean> {
  try {
    const [info, owner] = await Promise.all([stat(lockPath), readFile(lockPath, 'utf8')]);
    if (Date.now() - info.mtimeMs > STALE_LOCK_MS) return true;
    const pid = Number(owner);
    // An empty file means the owner is between open and write; give it time.
    if (!Number.isInteger(pid) || pid <= 0) return false;
    try {
      process.kill(pid, 0);
      return false;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === 'ESRCH';
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false; // released meanwhile; retry open
    throw err;
  }
}

async function generateAuthority(): Promise<{ certPem: string; keyPem: string }> {
  const { publicKey, privateKey } = await generateKeyPairAsync('rsa', { modulusLength: 2048 });
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(publicKey.export({ type: 'spki', format: 'pem' }).toString());
  cert.serialNumber = randomSerialHex();
  const now = Date.now();
  cert.validity.notBefore = new Date(now - 60 * 60 * 1000);
  const notAfter = new Date(now);
  notAfter.setFullYear(notAfter.getFullYear() + CA_VALIDITY_YEARS);
  cert.validity.notAfter = notAfter;
  // The hostname and a random suffix tell apart CAs from different machines/homes in a trust store listing.
  const cn = `mitm-replay CA ${hostname()} ${randomBytes(3).toString('hex')}`;
  const subject = [
    { shortName: 'O', value: 'mitm-replay', valueTagClass: utf8 },
    { shortName: 'CN', value: cn, valueTagClass: utf8 },
  ];
  cert.setSubject(subject);
  cert.setIssuer(subject);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  const certPem = await signEncoded(encodeToBeSigned(cert), privateKey);
  const keyPem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  return { certPem, keyPem };
}

/** UTF8String rather than forge's default PrintableString, which cannot hold '_' (allowed in hostnames). */
export const utf8 = forge.asn1.Type.UTF8 as unknown as forge.asn1.Class;

async function ensureBundle(paths: HomePaths, caPem: string): Promise<void> {
  const current = await readIfExists(paths.bundle);
  if (current?.includes(caPem.trim())) return;
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
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  const handle = await open(tmp, 'wx', mode);
  try {
    await handle.chmod(mode); // open's mode is filtered by the umask; make it exact
    await handle.writeFile(data);
    await handle.sync();
  } finally {
    await handle.close();
  }
  try {
    await rename(tmp, file);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
}
