/**
 * A stub OpenAI-compatible engine for the gateway benchmarks: it parses the request, then
 * streams `max_tokens` one-token SSE chunks (in bursts of 20, as decode steps would) and the
 * final chunk, without modelling a GPU or tokenizing, so that what a benchmark measures is the
 * router's cost and not the engine's. With --tokenizer it answers vLLM's /tokenize with the
 * model's tokenizer and chat template (ChatTokenizer), as `--tokenize engine` needs.
 *
 *   node --import tsx bench/stub-engine.ts --port 0 [--tokenizer DIR]
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { ChatTokenizer } from '../src/engines/chat-tokenizer.js';
import { benchFlags, intFlag } from './stats.js';

const flags = benchFlags(process.argv.slice(2), { port: 'value', tokenizer: 'value' });
const tokenizerPath = flags.get('tokenizer');
const tokenizer = typeof tokenizerPath === 'string' ? ChatTokenizer.load(tokenizerPath) : undefined;
const BURST = 20;

async function readBody(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

let nextId = 1;
function complete(res: ServerResponse, body: Record<string, unknown>, chat: boolean): void {
  const n = typeof body.max_tokens === 'number' && body.max_tokens > 0 ? Math.min(body.max_tokens, 100_000) : 16;
  const id = `${chat ? 'chatcmpl' : 'cmpl'}-stub-${nextId++}`;
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const created = Math.floor(Date.now() / 1000);
  if (body.stream !== true) {
    const text = 'tok '.repeat(n);
    return json(res, 200, {
      id,
      object: chat ? 'chat.completion' : 'text_completion',
      created,
      model: body.model ?? 'stub',
      choices: [
        chat
          ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'length' }
          : { index: 0, text, finish_reason: 'length' },
      ],
    });
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  let sent = 0;
  const burst = () => {
    let out = '';
    for (let k = 0; k < BURST && sent < n; k++, sent++) {
      const choice = chat
        ? {
            index: 0,
            delta: sent === 0 ? { role: 'assistant', content: `tok${sent} ` } : { content: `tok${sent} ` },
            finish_reason: null,
          }
        : { index: 0, text: `tok${sent} `, finish_reason: null };
      out += `data: ${JSON.stringify({ id, object, created, model: body.model ?? 'stub', choices: [choice] })}\n\n`;
    }
    res.write(out);
    if (sent < n) return void setImmediate(burst);
    const last = chat
      ? { index: 0, delta: {}, finish_reason: 'length' }
      : { index: 0, text: '', finish_reason: 'length' };
    res.end(
      `data: ${JSON.stringify({ id, object, created, model: body.model ?? 'stub', choices: [last] })}\n\ndata: [DONE]\n\n`,
    );
  };
  burst();
}

const server = createServer((req, res) => {
  const path = (req.url ?? '/').split('?')[0];
  if (req.method === 'GET') {
    if (path === '/health') return void res.writeHead(200).end();
    if (path === '/v1/models') return json(res, 200, { object: 'list', data: [{ id: 'stub', object: 'model' }] });
    if (path === '/metrics') return void res.writeHead(200, { 'content-type': 'text/plain' }).end('');
    return json(res, 404, { error: { message: 'not found' } });
  }
  readBody(req).then(
    (body) => {
      if (path === '/v1/chat/completions') return complete(res, body, true);
      if (path === '/v1/completions') return complete(res, body, false);
      if (path === '/tokenize' && tokenizer) {
        const tokens = body.messages
          ? tokenizer.tokenize({ messages: body.messages as [] })
          : tokenizer.tokenize({ text: String(body.prompt ?? '') });
        return json(res, 200, { tokens, count: tokens.length, max_model_len: 131_072 });
      }
      json(res, 404, { error: { message: `no route ${path}` } });
    },
    (err: Error) => json(res, 400, { error: { message: err.message } }),
  );
});
server.keepAliveTimeout = 60_000;
server.listen(intFlag(flags, 'port', 0), '127.0.0.1', () => {
  const a = server.address() as { port: number };
  process.stderr.write(`stub engine on http://127.0.0.1:${a.port}\n`);
});
process.once('SIGTERM', () => server.close(() => process.exit(0)));
