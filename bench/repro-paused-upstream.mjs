#!/usr/bin/env node
/**
 * Repro (found by the bench): a pooled upstream connection can be left paused, and the next request that gets
 * it from the pool is never answered.
 *
 * ForwardHandler.writeToClient (src/proxy/connection.ts) pauses the upstream socket when the client socket
 * is full and resumes it on the client's 'drain'. If the response completes while paused and the client then
 * closes (an agent that got its whole body and hangs up), 'drain' never comes: the upstream socket goes back
 * to the pool (UpstreamPool.release) still paused. The next request to that origin acquires it, writes its
 * request, and attaches a 'data' listener — which does not resume a stream paused with pause(). The
 * response sits in the socket's buffer until the client times out (or the 4 s idle timer had killed it first).
 *
 *   npm run build && node bench/repro-paused-upstream.mjs      (exit code 1 when the bug shows)
 */
import { createSecureContext } from 'node:tls';
import { createBenchCa } from './ca.mjs';
import { Conn, openTls } from './client.mjs';
import { BenchProcesses } from './harness.mjs';

const procs = new BenchProcesses('[repro]');
const ca = createBenchCa(['127.0.0.1']);
const timer = setTimeout(() => {
  console.error('repro: overall timeout');
  process.exit(2);
}, 60_000);
let hangs = 0;
const trials = 10;
try {
  const { port } = await procs.startUpstream({ certPem: ca.certPem, keyPem: ca.keyPem });
  const { port: proxyPort, caPem } = await procs.startDaemon({ home: procs.tempDir('mitm-replay-repro-'), upstreamPort: port, upstreamCaPem: ca.caCertPem });
  const secureContext = createSecureContext({ ca: caPem });
  const host = `127.0.0.1:${port}`;
  const open = async () => new Conn(await openTls({ proxyPort, host: '127.0.0.1', port, secureContext }));
  for (let trial = 0; trial < trials; trial++) {
    const big = await open();
    await big.request('/large?mb=4', { host, timeoutMs: 20_000 });
    big.close(); // hang up right after the last byte
    const next = await open();
    try {
      await next.request('/echo', { host, timeoutMs: 2_000 });
    } catch (err) {
      hangs++;
      console.log(`trial ${trial + 1}: ${err.message}`);
    } finally {
      next.close();
    }
  }
  console.log(`${hangs} of ${trials} requests after a large download were never answered`);
} finally {
  clearTimeout(timer);
  procs.shuttingDown = true;
  procs.cleanup(); // kills the daemon and the upstream, removes the daemon's home
}
process.exit(hangs > 0 ? 1 : 0);
