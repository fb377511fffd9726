import type { StoredExchange } from '../../src/trace/schema.js';

/** A complete chat-completions exchange as the store keeps it (for tests of the store and formats). */
export function chatExchange(seq: number, body: string | Buffer, response: string | Buffer = '{}'): StoredExchange {
  const requestBody = Buffer.from(body);
  const responseBody = Buffer.from(response);
  const requestHead = Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\nContent-Length: ${requestBody.length}\r\n\r\n`);
  const responseHead = Buffer.from(`HTTP/1.1 200 OK\r\nContent-Length: ${responseBody.length}\r\n\r\n`);
  return {
    record: {
      seq,
      kind: 'http',
      state: 'complete',
      origin: { scheme: 'https', host: 'api.openai.com', port: 443 },
      route: 'connect',
      startedAt: 1_800_000_000_000 + seq,
      timings: { requestEndMs: 1, responseHeadMs: 2, endMs: 3 },
      request: { method: 'POST', target: '/v1/chat/completions', droppedHeaders: [], headLength: requestHead.length, bodyLength: requestBody.length, flags: [] },
      response: { status: 200, headLength: responseHead.length, bodyLength: responseBody.length, flags: [], chunks: [[2, responseBody.length]] },
      redactions: [],
    },
    requestHead,
    requestBody,
    responseHead,
    responseBody,
  };
}
