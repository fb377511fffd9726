import { mkdirSync, chmodSync, statSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';

/** Everything mitm-replay keeps for one user lives under one directory (the "home"). */
export interface HomePaths {
  root: string;
  certsDir: string;
  caCert: string;
  caKey: string;
  bundle: string;
  store: string;
  redactRules: string;
  stateFile: string;
}

export function resolveHome(explicit?: string): string {
  const chosen = explicit ?? process.env.MITM_REPLAY_HOME ?? join(homedir(), '.mitm-replay');
  return resolve(chosen);
}

export function homePaths(root: string): HomePaths {
  const certsDir = join(root, 'certs');
  return {
    root,
    certsDir,
    caCert: join(certsDir, 'ca.pem'),
    caKey: join(certsDir, 'ca-key.pem'),
    bundle: join(certsDir, 'bundle.pem'),
    store: join(root, 'traces'),
    redactRules: join(root, 'redact.json'),
    stateFile: join(root, 'daemon.json'),
  };
}

/** Creates the home (mode 0700) and its certs directory if missing; returns its paths. */
export function ensureHome(root: string): HomePaths {
  const paths = homePaths(root);
  mkdirSync(root, { recursive: true, mode: 0o700 });
  mkdirSync(paths.certsDir, { recursive: true, mode: 0o700 });
  // mkdir's mode is filtered by the umask and ignored for existing dirs; a fresh home is ours to tighten.
  for (const dir of [root, paths.certsDir]) {
    if ((statSync(dir).mode & 0o077) !== 0) chmodSync(dir, 0o700);
  }
  return paths;
}
