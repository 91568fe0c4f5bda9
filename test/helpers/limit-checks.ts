/**
 * Requests for the tests of what a client may ask (request-limits.ts): a completion or chat
 * body with the fields under test, posted to a gateway on one engine, and the checks that it is
 * refused with 400 naming the field before any engine sees it, or forwarded and answered.
 */
import assert from 'node:assert/strict';
import type { GatewayOnEngine } from './gateway-on-engine.js';

export const LIMIT_PATHS = {
  completions: { path: '/v1/completions', body: { model: 'm', prompt: 'hi' } },
  chat: { path: '/v1/chat/completions', body: { model: 'm', messages: [{ role: 'user', content: 'hi' }] } },
} as const;

/** The body of a request to `path` with `fields` set over its base body. */
export function bodyWith(path: string, fields: object): object {
  return { ...(path === LIMIT_PATHS.chat.path ? LIMIT_PATHS.chat.body : LIMIT_PATHS.completions.body), ...fields };
}

/** POSTs `text` to the gateway; the status, the error body, the answer's text, and how many requests reached the engine. */
export async function postText(setup: GatewayOnEngine, path: string, text: string, query = '') {
  const before = setup.completions();
  const res = await fetch(`http://127.0.0.1:${setup.port}${path}${query}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: text,
  });
  const answer = await res.text();
  const error = (JSON.parse(answer) as { error?: { param: string | null; message: string; type: string } }).error;
  return { status: res.status, error, text: answer, reached: setup.completions() - before };
}

/**
 * Asserts the request with `fields` is refused with 400 naming `param`, no engine seeing it, for
 * each of `queries` (a query string takes a request past the fast path to Fastify's route).
 * Returns the error's message.
 */
export async function refused(
  setup: GatewayOnEngine,
  path: string,
  fields: object,
  param: string,
  queries: readonly string[] = [''],
): Promise<string> {
  let message = '';
  for (const query of queries) {
    const r = await postText(setup, path, JSON.stringify(bodyWith(path, fields)), query);
    assert.equal(r.status, 400, `${path}${query} ${JSON.stringify(fields).slice(0, 80)}: ${r.text.slice(0, 200)}`);
    assert.equal(r.error?.param, param);
    assert.equal(r.error?.type, 'invalid_request_error');
    assert.equal(r.reached, 0, 'nothing reaches the engine');
    message = r.error!.message;
  }
  return message;
}

/** Asserts the request with `fields` is forwarded to the engine and answered. */
export async function passes(setup: GatewayOnEngine, path: string, fields: object): Promise<void> {
  const r = await postText(setup, path, JSON.stringify(bodyWith(path, fields)));
  assert.equal(r.status, 200, r.text.slice(0, 200));
  assert.equal(r.reached, 1);
}
