/**
 * Reading what an engine answers on its side endpoints (/metrics, /health, /v1/models,
 * /tokenize) with a bound on its size: an engine that sends an endless or enormous body must
 * not make the router hold it all. Time is bounded by the caller's abort signal.
 */
export class BodyTooLargeError extends Error {
  constructor(what: string, maxBytes: number) {
    super(`${what} is larger than ${maxBytes} bytes`);
    this.name = 'BodyTooLargeError';
  }
}

/** The body as UTF-8 text; throws BodyTooLargeError (and stops reading it) past `maxBytes`. */
export async function readBoundedText(
  body: AsyncIterable<Uint8Array> | null | undefined,
  maxBytes: number,
  what: string,
): Promise<string> {
  if (!body) return '';
  const parts: Uint8Array[] = [];
  let size = 0;
  // leaving the loop early (the throw) cancels the body
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > maxBytes) throw new BodyTooLargeError(what, maxBytes);
    parts.push(chunk);
  }
  return Buffer.concat(parts, size).toString('utf8');
}
