import { describe, expect, it } from 'vitest';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCli } from './helpers/cli.js';

describe('home permissions', () => {
  it('the daemon refuses a home or CA key others can read, saying how to fix it; nothing is changed', async () => {
    const home = mkdtempSync(join(tmpdir(), 'mitm-replay-perms-'));
    try {
      // a first run creates the home, the CA and the key with private modes
      expect((await runCli(['record', '--home', home, '--no-workspace', '--', 'true'])).code).toBe(0);
      chmodSync(home, 0o755);
      const open = await runCli(['record', '--home', home, '--no-workspace', '--', 'true']);
      expect(open.code).toBe(125);
      expect(open.stderr.trim().split('\n')).toHaveLength(1);
      expect(open.stderr).toContain(`run 'chmod 700 ${home}'`);
      chmodSync(home, 0o700);
      chmodSync(join(home, 'certs', 'ca-key.pem'), 0o644);
      const daemon = await runCli(['daemon', '--home', home, '--listen', '127.0.0.1:0']);
      expect(daemon.code).toBe(1);
      expect(daemon.stderr).toContain(`run 'chmod 600 ${join(home, 'certs', 'ca-key.pem')}'`);
      chmodSync(join(home, 'certs', 'ca-key.pem'), 0o600);
      expect((await runCli(['record', '--home', home, '--no-workspace', '--', 'true'])).code).toBe(0);
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });
});
