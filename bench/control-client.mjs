/**
 * A client for the daemon's control API (what the CLI uses), for the replay bench:
 * POST /__mitm-replay/api/sessions, POST …/sessions/<id>/end. Loopback only.
 */
import http from 'node:http';

export class ControlClient {
  constructor(port, token) {
    this.port = port;
    this.token = token;
    // one keep-alive connection for control calls, as a long-lived CLI/daemon client would have
    this.agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  }

  request(method, path, body, timeoutMs = 60_000) {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port: this.port,
          method,
          path: `/__mitm-replay/api${path}`,
          headers: { authorization: `Bearer ${this.token}`, 'content-type': 'application/json', ...(payload ? { 'content-length': payload.length } : {}) },
          agent: this.agent,
          timeout: timeoutMs,
        },
        (res) => {
          const chunks = [];
          res.on('data', (c) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            let parsed;
            try {
              parsed = JSON.parse(text);
            } catch {
              return reject(new Error(`control ${method} ${path}: ${res.statusCode} ${text.slice(0, 200)}`));
            }
            if (res.statusCode >= 400) reject(new Error(`control ${method} ${path}: ${res.statusCode} ${parsed.error ?? text}`));
            else resolve(parsed);
          });
        },
      );
      req.on('timeout', () => req.destroy(new Error(`control ${method} ${path}: no answer within ${timeoutMs} ms`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  createSession(request) {
    return this.request('POST', '/sessions', request);
  }

  endSession(id, result = {}) {
    return this.request('POST', `/sessions/${encodeURIComponent(id)}/end`, result);
  }

  close() {
    this.agent.destroy();
  }
}
