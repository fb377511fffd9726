import { decodeEntityBody } from '../capture/content-coding.js';
import type { StoredExchange } from './schema.js';

/** What `show` pulls out of an exchange: decoded bodies, SSE frames, model, token usage, tool calls. */
export interface ExchangeInsight {
  requestBody: Buffer;
  responseBody: Buffer;
  /** SSE frames of a text/event-stream response (each frame's lines, without the blank separator) */
  frames: string[];
  model: string | null;
  usage: { input: number | null; output: number | null } | null;
  toolCalls: string[];
}

const MAX_DECODED = 64 * 1024 * 1024;

function headerOf(head: Buffer, name: string): string | undefined {
  const match = new RegExp(`\\r\\n${name}[ \\t]*:[ \\t]*([^\\r]*)`, 'i').exec(head.toString('latin1'));
  return match?.[1]?.trim();
}

export function decodedBody(head: Buffer, body: Buffer): Buffer {
  return decodeEntityBody(body, headerOf(head, 'transfer-encoding'), headerOf(head, 'content-encoding'), MAX_DECODED);
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

export function sseFrames(text: string): string[] {
  return text
    .split(/\r?\n\r?\n/)
    .map((f) => f.trim())
    .filter(Boolean);
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Collects model, usage and tool-call names from one JSON document (a response, or one SSE frame's data). */
function collect(doc: unknown, found: { model: string | null; input: number | null; output: number | null; tools: string[] }): void {
  if (!isObject(doc)) return;
  if (typeof doc.model === 'string') found.model ??= doc.model;
  const message = isObject(doc.message) ? doc.message : null; // Anthropic message_start
  if (message) collect(message, found);
  const usage = isObject(doc.usage) ? doc.usage : null;
  if (usage) {
    const input = usage.prompt_tokens ?? usage.input_tokens;
    const output = usage.completion_tokens ?? usage.output_tokens;
    if (typeof input === 'number') found.input = input;
    if (typeof output === 'number') found.output = output;
  }
  // OpenAI: choices[].message.tool_calls / choices[].delta.tool_calls
  for (const choice of Array.isArray(doc.choices) ? doc.choices : []) {
    if (!isObject(choice)) continue;
    for (const holder of [choice.message, choice.delta]) {
      if (!isObject(holder) || !Array.isArray(holder.tool_calls)) continue;
      for (const call of holder.tool_calls) {
        const name = isObject(call) && isObject(call.function) ? call.function.name : undefined;
        if (typeof name === 'string' && name) found.tools.push(name);
      }
    }
  }
  // Anthropic: content[] tool_use blocks, or a content_block_start frame
  const blocks = [...(Array.isArray(doc.content) ? doc.content : []), doc.content_block];
  for (const block of blocks) {
    if (isObject(block) && block.type === 'tool_use' && typeof block.name === 'string') found.tools.push(block.name);
  }
}

export function inspectExchange(ex: StoredExchange): ExchangeInsight {
  const requestBody = decodedBody(ex.requestHead, ex.requestBody);
  const responseBody = decodedBody(ex.responseHead, ex.responseBody);
  const found = { model: null as string | null, input: null as number | null, output: null as number | null, tools: [] as string[] };
  const streaming = /text\/event-stream/i.test(headerOf(ex.responseHead, 'content-type') ?? '');
  const frames = streaming ? sseFrames(responseBody.toString('utf8')) : [];
  if (streaming) {
    for (const frame of frames) {
      for (const line of frame.split(/\r?\n/)) if (line.startsWith('data:')) collect(parseJson(line.slice(5).trim()), found);
    }
  } else {
    collect(parseJson(responseBody.toString('utf8')), found);
  }
  const request = parseJson(requestBody.toString('utf8'));
  if (!found.model && isObject(request) && typeof request.model === 'string') found.model = request.model;
  return {
    requestBody,
    responseBody,
    frames,
    model: found.model,
    usage: found.input === null && found.output === null ? null : { input: found.input, output: found.output },
    toolCalls: [...new Set(found.tools)],
  };
}

/** A body as text for a report or the trace viewer: UTF-8 when it is valid UTF-8, else base64; at most `max` bytes. */
export interface BodyText {
  text: string;
  encoding: 'utf8' | 'base64';
  /** the whole body's length */
  bytes: number;
  /** how many of its bytes `text` holds */
  shown: number;
  truncated: boolean;
}

export function bodyText(body: Buffer, max: number): BodyText {
  const truncated = body.length > max;
  let part = truncated ? body.subarray(0, max) : body;
  const utf8 = part.toString('utf8');
  if (Buffer.byteLength(utf8) === part.length && !utf8.includes('\uFFFD')) return { text: utf8, encoding: 'utf8', bytes: body.length, shown: part.length, truncated };
  // A cut through a multi-byte character is not binary: drop the partial character at the end.
  if (truncated) {
    for (let back = 1; back <= 3 && part.length > 0; back++) {
      part = body.subarray(0, max - back);
      const text = part.toString('utf8');
      if (!text.includes('\uFFFD')) return { text, encoding: 'utf8', bytes: body.length, shown: part.length, truncated };
    }
    part = body.subarray(0, max);
  }
  return { text: part.toString('base64'), encoding: 'base64', bytes: body.length, shown: part.length, truncated };
}
