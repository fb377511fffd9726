import { createPrivateKey, generateKeyPair, type KeyObject } from 'node:crypto';
import { isIP } from 'node:net';
import { availableParallelism } from 'node:os';
import { createSecureContext, type SecureContext } from 'node:tls';
import { promisify } from 'node:util';
import { LRUCache } from 'lru-cache';
import forge from 'node-forge';
import { encodeToBeSigned, randomSerialHex, signEncoded, UTF8_STRING, type CertificateAuthority } from './authority.js';

export interface LeafMinterOptions {
  /** Hosts whose secure context is kept (LRU). Default 1000. */
  cacheSize?: number;
  /** Leaf lifetime in days. Default 30, at most 90: a leaf is cheap to re-mint, so keep a leaked one short-lived. */
  validityDays?: number;
}

const MAX_VALIDITY_DAYS = 90;
const HOUR_MS = 60 * 60 * 1000;
const DAY_MS = 24 * HOUR_MS;

interface LeafKey {
  keyPem: string;
  /** the leaf key's SubjectPublicKeyInfo (ECDSA P-256), spliced into each certificate */
  spki: forge.asn1.Asn1;
}

/**
 * Mints per-host server certificates signed by our CA.
 * One ECDSA P-256 key pair serves every leaf of this minter (a key per host would cost a key generation per
 * host for nothing); the key never leaves the process.
 */
export class LeafMinter {
  readonly #caKey: KeyObject;
  /** The CA's subject exactly as encoded in its certificate, used verbatim as each leaf's issuer. */
  readonly #caSubject: forge.asn1.Asn1;
  /** The CA's subjectKeyIdentifier (binary string) for the leaves' authorityKeyIdentifier, if the CA has one. */
  readonly #caKeyId: string | undefined;
  readonly #validityDays: number;
  /** any RSA public key (the CA's): forge builds the TBS around it before the leaf's EC key info replaces it */
  readonly #placeholderPublicKey: forge.pki.PublicKey;
  readonly #cache: LRUCache<string, Promise<SecureContext>>;
  #leafKey: Promise<LeafKey> | undefined;
  #hits = 0;
  #misses = 0;

  constructor(ca: CertificateAuthority, options: LeafMinterOptions = {}) {
    const validityDays = options.validityDays ?? 30;
    if (!(validityDays > 0 && validityDays <= MAX_VALIDITY_DAYS)) {
      throw new RangeError(`validityDays must be in (0, ${MAX_VALIDITY_DAYS}], got ${validityDays}`);
    }
    this.#validityDays = validityDays;
    this.#cache = new LRUCache({ max: options.cacheSize ?? 1000 });
    this.#caKey = createPrivateKey(ca.keyPem);

    const caCert = forge.pki.certificateFromPem(ca.certPem);
    this.#placeholderPublicKey = caCert.publicKey;
    const ski = caCert.getExtension('subjectKeyIdentifier') as { subjectKeyIdentifier?: string } | undefined;
    this.#caKeyId = ski?.subjectKeyIdentifier ? forge.util.hexToBytes(ski.subjectKeyIdentifier) : undefined;
    this.#caSubject = subjectOf(ca.certPem);
  }

  get stats(): { hits: number; misses: number; size: number } {
    return { hits: this.#hits, misses: this.#misses, size: this.#cache.size };
  }

  /** Cached per host; concurrent callers for one host share a single mint (the promise is what is cached). */
  secureContextFor(host: string): Promise<SecureContext> {
    let name: string;
    try {
      name = normalizeHost(host);
    } catch (err) {
      return Promise.reject(err); // callers handle one failure path: the promise
    }
    const cached = this.#cache.get(name);
    if (cached) {
      this.#hits++;
      return cached;
    }
    this.#misses++;
    const pending = this.mintLeafCertificate(name).then(({ certPem, keyPem }) =>
      // createSecureContext costs ~0.9 ms (OpenSSL context, key and cert parsing), so it gets its own turn too.
      // The chain is just the leaf: our CA is a self-signed root, which a client must already trust and which
      // TLS allows the server to omit; adding it would cost another 0.35 ms per host.
      oneJobPerTurn(() => createSecureContext({ key: keyPem, cert: certPem })),
    );
    this.#cache.set(name, pending);
    // A failed mint must not poison the cache; the next caller retries.
    pending.catch(() => {
      if (this.#cache.get(name) === pending) this.#cache.delete(name);
    });
    return pending;
  }

  /** PEM certificate for host (IP literal -> iPAddress SAN, otherwise dNSName SAN) and the shared leaf key. */
  async mintLeafCertificate(host: string): Promise<{ certPem: string; keyPem: string }> {
    const name = normalizeHost(host);
    const leafKey = await this.#getLeafKey();

    // Building and encoding is synchronous (~0.15 ms); a burst of 100 hosts done in one go would block the
    // loop for 15 ms, so each certificate gets its own event-loop turn. Signing then happens off-thread.
    const cert = forge.pki.createCertificate();
    const tbsDer = await oneJobPerTurn(() => {
      // forge needs an RSA key object to build the TBS; the real (EC) key info replaces it when encoding.
      cert.publicKey = this.#placeholderPublicKey;
      cert.serialNumber = randomSerialHex();
      const now = Date.now();
      // An hour of slack absorbs clock skew between us and the client.
      cert.validity.notBefore = new Date(now - HOUR_MS);
      cert.validity.notAfter = new Date(now + this.#validityDays * DAY_MS);
      // X.520 caps a CN at 64 characters; clients match on the SAN anyway, so longer names go without a CN.
      // IP literals get no CN either: a name-constrained CA's DNS constraints would be applied to it.
      cert.setSubject(name.length <= 64 && !isIP(name) ? [{ shortName: 'CN', value: name, valueTagClass: UTF8_STRING }] : []);
      const altName = isIP(name) ? { type: 7, ip: name } : { type: 2, value: name };
      cert.setExtensions([
        { name: 'basicConstraints', cA: false },
        // ECDSA keys sign (ECDHE); they never encipher keys.
        { name: 'keyUsage', digitalSignature: true, critical: true },
        { name: 'extKeyUsage', serverAuth: true },
        { name: 'subjectAltName', altNames: [altName] },
        ...(this.#caKeyId ? [{ name: 'authorityKeyIdentifier', keyIdentifier: this.#caKeyId }] : []),
      ]);
      return encodeToBeSigned(cert, this.#caSubject, leafKey.spki);
    });
    const certPem = await withSigningSlot(() => signEncoded(cert, tbsDer, this.#caKey));
    return { certPem, keyPem: leafKey.keyPem };
  }

  #getLeafKey(): Promise<LeafKey> {
    if (!this.#leafKey) {
      const pending = generateLeafKey();
      // If generation failed, forget it so a later mint can try again.
      pending.catch(() => {
        if (this.#leafKey === pending) this.#leafKey = undefined;
      });
      this.#leafKey = pending;
    }
    return this.#leafKey;
  }
}

/** Tail of the queue of synchronous jobs; shared by all minters because they share the one event loop. */
let lastJob: Promise<unknown> = Promise.resolve();

/**
 * Runs a synchronous job in an event-loop turn of its own, one job per turn, in order.
 * An immediate queued while immediates are running waits for the next loop iteration, so timers and I/O
 * get to run between two jobs: the loop is never blocked for longer than one job.
 */
function oneJobPerTurn<T>(job: () => T): Promise<T> {
  const result = lastJob.then(
    () =>
      new Promise<T>((resolve, reject) => {
        setImmediate(() => {
          try {
            resolve(job());
          } catch (err) {
            reject(err);
          }
        });
      }),
  );
  lastJob = result.catch(() => undefined);
  return result;
}

/**
 * Signatures run on the libuv thread pool (4 threads), but they still need CPU: with every core busy signing,
 * the main thread and the garbage collector get preempted, and on 2 cores event-loop p99 went from ~2 ms to 5-9 ms.
 * Leaving one core to the main thread costs no throughput (the main thread's share is the bottleneck anyway).
 */
const maxConcurrentSigns = Math.max(1, availableParallelism() - 1);
let signsInFlight = 0;
const waitingForSign: Array<() => void> = [];

async function withSigningSlot<T>(sign: () => Promise<T>): Promise<T> {
  while (signsInFlight >= maxConcurrentSigns) await new Promise<void>((resolve) => waitingForSign.push(resolve));
  signsInFlight++;
  try {
    return await sign();
  } finally {
    signsInFlight--;
    waitingForSign.shift()?.();
  }
}

/**
 * The leaf key is ECDSA P-256, not RSA: every TLS handshake signs with it, and a P-256 signature costs ~0.03 ms
 * against ~0.4 ms for RSA-2048 (bench/README.md: handshakes dominated the daemon's profile while minting).
 */
async function generateLeafKey(): Promise<LeafKey> {
  const { publicKey, privateKey } = await promisify(generateKeyPair)('ec', { namedCurve: 'prime256v1' });
  const spkiDer = publicKey.export({ type: 'spki', format: 'der' });
  return {
    keyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    spki: forge.asn1.fromDer(spkiDer.toString('binary')),
  };
}

/** The subject Name of a certificate as parsed ASN.1, bytes as they are in the certificate. */
function subjectOf(certPem: string): forge.asn1.Asn1 {
  const der = forge.pem.decode(certPem)[0]!.body;
  const tbs = (forge.asn1.fromDer(der).value as forge.asn1.Asn1[])[0]!;
  const fields = tbs.value as forge.asn1.Asn1[];
  // v1 certificates have no explicit [0] version field, which shifts every index by one.
  const hasVersion = fields[0]!.tagClass === forge.asn1.Class.CONTEXT_SPECIFIC;
  return fields[hasVersion ? 5 : 4]!; // version?, serial, signature, issuer, validity, subject
}

/**
 * Lowercases, strips IPv6 brackets/zone and a trailing dot, and canonicalizes IPv6 (so "::ffff:1.2.3.4" and
 * "::ffff:102:304" share a certificate). Throws on anything that cannot be a DNS name or IP address.
 */
export function normalizeHost(host: string): string {
  let name = host.trim().toLowerCase();
  if (name.startsWith('[') && name.endsWith(']')) name = name.slice(1, -1);
  if (name.includes(':')) {
    name = name.replace(/%.*$/, '');
    if (isIP(name) !== 6) throw new TypeError(`not a host name or IP address: ${JSON.stringify(host)}`);
    return new URL(`http://[${name}]/`).hostname.slice(1, -1);
  }
  if (name.endsWith('.')) name = name.slice(0, -1);
  if (isIP(name)) return name;
  if (name.length > 253 || !/^[a-z0-9_-]+(\.[a-z0-9_-]+)*$/.test(name)) {
    throw new TypeError(`not a host name or IP address: ${JSON.stringify(host)}`);
  }
  return name;
}
