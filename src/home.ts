import { existsSync, mkdirSync, chmodSync, statSync } from 'node:fs';
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
  for (const dir of [root, paths.certsDir]) {
    if (existsSync(dir)) continue;
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    // mkdir's mode is filtered by the umask: a directory we just made is ours to tighten.
    chmodSync(dir, 0o700);
  }
  return paths;
}

export class HomePermissionsError extends Error {}

/**
 * The home holds a CA key that can impersonate any site to processes that trust it, and full transcripts:
 * refuse to run on a home (or key) that others can read, saying how to fix it. Existing directories are never
 * silently changed.
 */
export function checkHomePermissions(paths: HomePaths): void {
  const open = (path: string) => existsSync(path) && (statSync(path).mode & 0o077) !== 0;
  const mode = (path: string) => (statSync(path).mode & 0o777).toString(8).padStart(3, '0');
  for (const dir of [paths.root, paths.certsDir]) {
    if (open(dir)) throw new HomePermissionsError(`${dir} is accessible to other users (mode ${mode(dir)}): run 'chmod 700 ${dir}' and start again`);
  }
  if (open(paths.caKey)) throw new HomePermissionsError(`the CA key ${paths.caKey} is readable by other users (mode ${mode(paths.caKey)}): run 'chmod 600 ${paths.caKey}' (and consider 'mitm-replay trust-ca --uninstall' plus a new CA if others could have copied it)`);
}
