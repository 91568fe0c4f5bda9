import type { IncomingMessage, ServerResponse } from 'node:http';

/**
 * An error the mock engine answers with its status, in the OpenAI error shape; with `type`, in
 * vLLM's own (its `type`, and `code` the status: vLLM's ErrorResponse).
 */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param?: string,
    readonly type?: string,
  ) {
    super(message);
  }
}

/** Reads a JSON object body of at most `limit` bytes (413 over it, 400 when not an object). */
export async function readJson(req: IncomingMessage, limit: number): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) throw new HttpError(413, `request body over ${limit} bytes`);
    chunks.push(chunk as Buffer);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    throw new HttpError(400, 'the body is not valid JSON');
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw new HttpError(400, 'the body must be a JSON object');
  return body as Record<string, unknown>;
}

export function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** One server-sent event. */
export function sse(res: ServerResponse, body: unknown): void {
  res.write(`data: ${JSON.stringify(body)}\n\n`);
}
