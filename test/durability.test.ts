import { describe, expect, it } from 'vitest';
import { spawn } from 'node:child_process';
import https from 'node:https';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { BIN, run, runCli, startCliDaemon } from './helpers/cli.js';
import { readTrace, useUpstreamFixture } from './helpers/cli-fixture.js';
import { TunnelAgent, request, startHarness } from './helpers/proxy.js';

const fx = useUpstreamFixture('durability');

function daemonArgs(trace: string): string[] {
  return ['--trace', trace, '--intercept', '+tools.example.test', ...fx.routing()];
}

/** Starts a slow SSE download through the daemon with curl; resolves once the first bytes arrived. */
function startSlowStream(port: number, home: string, id: string) {
  const child = spawn('curl', ['-sS', '-N', '-x', `http://127.0.0.1:${port}`, '--cacert', join(home, 'certs', 'ca.pem'), '-H', `x-test-id: ${id}`, 'https://tools.example.test/sse-timed?frames=40&gap=100'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const firstBytes = new Promise<void>((resolve) => child.stdout.once('data', () => resolve()));
  const exited = new Promise<number | null>((resolve) => child.once('close', resolve));
  return { child, firstBytes, exited };
}

describe('crash safety and clean shutdown', () => {
  it('SIGKILL mid-stream: completed exchanges survive intact, the cut-off one is marked incomplete on restart', async () => {
    const home = fx.freshHome();
    const daemon = await startCliDaemon(daemonArgs('crash'), home);
    expect(statSync(join(home, 'daemon.json')).mode & 0o777).toBe(0o600);
    expect(statSync(home).mode & 0o777).toBe(0o700);
    const done = await run('curl', ['-sS', '-x', `http://127.0.0.1:${daemon.port}`, '--cacert', join(home, 'certs', 'ca.pem'), '-H', 'x-test-id: before-crash', 'https://tools.example.test/gzip', '-o', join(fx.work, 'gz.out')]);
    expect(done.code, done.stderr).toBe(0);
    const slow = startSlowStream(daemon.port, home, 'cut-off');
    await slow.firstBytes;
    await new Promise((r) => setTimeout(r, 150)); // the open marker's batch (docs/decisions.md §15)
    daemon.child.kill('SIGKILL');
    await new Promise((r) => daemon.child.once('exit', r));
    await slow.exited;
    // restart: the store opens and the open exchange is marked incomplete
    const again = await startCliDaemon(daemonArgs('crash'), home);
    again.child.kill('SIGTERM');
    expect(await new Promise((r) => again.child.once('exit', r))).toBe(0);
    const exchanges = await readTrace(home, 'crash');
    expect(exchanges).toHaveLength(2);
    const [first, second] = exchanges;
    expect(first!.record.state).toBe('complete');
    expect(first!.responseBody.equals(fx.upstream.sent.get('before-crash')!)).toBe(true);
    expect(second!.record.state).toBe('incomplete');
    expect(second!.record.error!.code).toBe('cut-off');
    expect(second!.requestHead.toString()).toContain('x-test-id: cut-off');
  });

  it('SIGKILL while 50 streams are recorded: completed exchanges intact (as the clients got them), the 50 marked incomplete', async () => {
    const home = fx.freshHome();
    const daemon = await startCliDaemon(daemonArgs('fifty'), home);
    const ca = readFileSync(join(home, 'certs', 'ca.pem'), 'utf8');
    const agent = new TunnelAgent(daemon.port, undefined, { maxSockets: 64 });
    const completed: Buffer[] = [];
    // large bodies, so they are stored as chunks (format 2): a resent conversation up, a download down
    const conversation = Array.from({ length: 400 }, (_, i) => `turn ${i}: the agent said something long enough to repeat`).join('\n');
    const sentBodies: string[] = [];
    for (let i = 0; i < 5; i++) {
      const body = `${conversation}\nnew turn ${i}`;
      sentBodies.push(body);
      const res = i % 2 === 0
        ? await request(`https://tools.example.test/echo?n=${i}`, { agent, ca, method: 'POST', body, headers: { 'x-test-id': `done-${i}`, 'content-type': 'text/plain' } })
        : await request(`https://tools.example.test/large?mb=0.05&n=${i}`, { agent, ca, headers: { 'x-test-id': `done-${i}` } });
      completed.push(res.body);
    }
    // 50 streams, each still running when the daemon dies
    const firstBytes: Promise<void>[] = [];
    const streams = Array.from({ length: 50 }, (_, i) => {
      let started!: () => void;
      firstBytes.push(new Promise<void>((resolve) => (started = resolve)));
      const req = https.request('https://tools.example.test/sse-timed?frames=100&gap=100', { agent, ca, headers: { 'x-test-id': `stream-${i}` } }, (res) => {
        res.once('data', () => started());
        res.on('data', () => undefined);
        res.on('error', () => undefined);
      });
      req.on('error', () => undefined);
      req.end();
      return req;
    });
    await Promise.all(firstBytes);
    await new Promise((r) => setTimeout(r, 150)); // see the SIGKILL-of-record test below
    daemon.child.kill('SIGKILL');
    await new Promise((r) => daemon.child.once('exit', r));
    for (const req of streams) req.destroy();
    agent.destroy();
    const again = await startCliDaemon(daemonArgs('fifty'), home);
    again.child.kill('SIGTERM');
    expect(await new Promise((r) => again.child.once('exit', r))).toBe(0);
    const exchanges = await readTrace(home, 'fifty');
    const done = exchanges.filter((e) => e.record.state === 'complete');
    expect(done).toHaveLength(5);
    for (const [i, ex] of done.entries()) {
      expect(ex.responseBody.equals(completed[i]!)).toBe(true);
      if (i % 2 === 0) expect(ex.requestBody.toString()).toBe(sentBodies[i]);
    }
    expect(completed[1]!.length).toBe(Math.floor(0.05 * 1024 * 1024));
    expect(sentBodies[0]!.length).toBeGreaterThan(16 * 1024);
    const cut = exchanges.filter((e) => e.record.state === 'incomplete');
    expect(cut).toHaveLength(50);
    expect(cut.every((e) => e.record.error?.code === 'cut-off')).toBe(true);
    expect(new Set(cut.map((e) => /x-test-id: (stream-\d+)/.exec(e.requestHead.toString())![1])).size).toBe(50);
  });

  it('SIGKILL of `record` (its in-process daemon dies with it): the next start marks the cut-off exchange incomplete', async () => {
    const home = fx.freshHome();
    const script = join(fx.work, `killed-${Date.now()}.sh`);
    writeFileSync(
      script,
      `#!/bin/sh\ncurl -sS -o /dev/null -H 'x-test-id: before-kill' https://tools.example.test/echo\ncurl -sS -N -H 'x-test-id: killed' 'https://tools.example.test/sse-timed?frames=100&gap=100'\n`,
      { mode: 0o755 },
    );
    const child = spawn(process.execPath, [BIN, 'record', '--home', home, '--trace', 'killed', '--no-workspace', '--intercept', '+tools.example.test', ...fx.routing(), '--', script], {
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    await new Promise<void>((resolve) => child.stdout!.once('data', () => resolve()));
    // The open marker is written (batched) as the request starts; give it the few ms it needs on a busy
    // machine: a process killed within an exchange's first milliseconds may leave no trace of it
    // (docs/decisions.md §15).
    await new Promise((r) => setTimeout(r, 150));
    process.kill(-child.pid!, 'SIGKILL');
    await new Promise((r) => child.once('exit', r));
    // any later start on the home recovers the store
    expect((await runCli(['record', '--home', home, '--trace', 'after', '--no-workspace', ...fx.routing(), '--', 'true'])).code).toBe(0);
    const exchanges = await readTrace(home, 'killed');
    expect(exchanges.map((e) => [/x-test-id: (\S+)/.exec(e.requestHead.toString())![1], e.record.state])).toEqual([
      ['before-kill', 'complete'],
      ['killed', 'incomplete'],
    ]);
  });

  it('SIGTERM with a stream in flight: exit 0, the in-flight exchange is kept and marked incomplete', async () => {
    const home = fx.freshHome();
    const daemon = await startCliDaemon(daemonArgs('term'), home);
    const slow = startSlowStream(daemon.port, home, 'in-flight');
    await slow.firstBytes;
    daemon.child.kill('SIGTERM');
    expect(await new Promise((r) => daemon.child.once('exit', r))).toBe(0);
    await slow.exited;
    const exchanges = await readTrace(home, 'term');
    expect(exchanges).toHaveLength(1);
    expect(exchanges[0]!.record.state).toBe('incomplete');
    expect(exchanges[0]!.record.error!.code).toBe('shutdown');
    expect(exchanges[0]!.record.response!.chunks.length).toBeGreaterThan(0);
  });
});

describe('client aborts and plain HTTP', () => {
  it('a client that hangs up right after a large download does not leave a paused upstream connection in the pool', async () => {
    // Found by bench/repro-paused-upstream.mjs: the daemon pauses the upstream socket when the client falls
    // behind; the response can complete while paused, and if the client then hangs up no 'drain' resumes it.
    // The daemon runs in its own process here, so the client really does fall behind.
    const home = fx.freshHome();
    const daemon = await startCliDaemon(['--intercept', '+tools.example.test', ...fx.routing()], home);
    const ca = readFileSync(join(home, 'certs', 'ca.pem'), 'utf8');
    try {
      for (let trial = 0; trial < 6; trial++) {
        const big = new TunnelAgent(daemon.port);
        const res = await request('https://tools.example.test/large?mb=4', { agent: big, ca });
        expect(res.body.length).toBe(4 * 1024 * 1024);
        big.destroy();
        const agent = new TunnelAgent(daemon.port);
        const next = await Promise.race([
          request('https://tools.example.test/echo', { agent, ca }),
          new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`trial ${trial}: no answer within 2 s`)), 2000)),
        ]);
        agent.destroy();
        expect(next.status).toBe(200);
      }
    } finally {
      daemon.child.kill('SIGTERM');
      await new Promise((r) => daemon.child.once('exit', r));
    }
  });

  it('a client that disconnects aborts the upstream request; recorded as client-aborted', async () => {
    const h = await startHarness();
    try {
      const agent = new TunnelAgent(h.daemon.port);
      await new Promise<void>((resolve, reject) => {
        const req = https.request('https://tools.example.test/sse-timed?frames=30&gap=50', { agent, ca: h.caPem, headers: { 'x-test-id': 'abort' } }, (res) => {
          res.once('data', () => {
            req.destroy();
            resolve();
          });
        });
        req.on('error', () => undefined);
        req.end();
        setTimeout(() => reject(new Error('no data')), 5000);
      });
      agent.destroy();
      await new Promise((r) => setTimeout(r, 400));
      const ex = (await h.exchanges()).find((e) => e.requestHead.includes('x-test-id: abort'))!;
      expect(ex.record.state).toBe('incomplete');
      expect(ex.record.error!.code).toBe('client-aborted');
      // the upstream stopped well before its 30 frames
      expect(h.upstream.frameSentAt.get('abort')!.length).toBeLessThan(15);
    } finally {
      await h.close();
    }
  });

  it('plain http:// absolute-form proxy requests are forwarded and recorded in origin form', async () => {
    const h = await startHarness({ upstreamPlain: true });
    try {
      const via = await run('curl', ['-sS', '-x', `http://127.0.0.1:${h.daemon.port}`, '-H', 'x-test-id: plain', 'http://tools.example.test/echo?x=1']);
      expect(via.code, via.stderr).toBe(0);
      expect(JSON.parse(via.stdout).url).toBe('/echo?x=1');
      const ex = (await h.exchanges()).find((e) => e.requestHead.includes('x-test-id: plain'))!;
      expect(ex.record.route).toBe('proxy');
      expect(ex.record.origin).toEqual({ scheme: 'http', host: 'tools.example.test', port: 80 });
      expect(ex.requestHead.toString()).toMatch(/^GET \/echo\?x=1 HTTP\/1\.1\r\n/);
      expect(ex.record.request!.clientTarget).toBe('http://tools.example.test/echo?x=1');
      expect(ex.record.request!.droppedHeaders).toContain('Proxy-Connection');
    } finally {
      await h.close();
    }
  });
});
