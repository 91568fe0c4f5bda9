/**
 * OpenAI chat requests the size coding agents send: one long system prompt shared by every
 * conversation (instructions and tool descriptions), then a growing history of user turns and
 * assistant replies with code in them. Each conversation's next request resends its history
 * plus the previous reply and a new user turn, as agents do; a conversation that grows past
 * 1.25 × the target size starts over, so bodies average about the target (40 KB of this
 * JSON is about 8,000 tokens for Qwen3's tokenizer). Deterministic for a seed.
 */
import { createRng } from '../src/core/rng.js';

const WORDS = (
  'the router sends each request to the engine that already holds its prefix so prefill is skipped and the queue stays short ' +
  'when a worker is busy the request goes elsewhere agent tools read files run tests and edit code in small steps ' +
  'please check the function below and explain why the test fails then propose a fix that keeps the interface stable ' +
  'cache block token worker engine latency throughput memory index event stream policy score load decode prefill ' +
  'return value error handling configuration option default timeout retry circuit breaker health metrics'
).split(' ');
const CODE = [
  'function route(request) {\n  const hashes = hashBlocks(request.tokens, 16);\n  return policy.choose(candidates(hashes));\n}\n',
  'for (let i = 0; i < n; i++) {\n  if (mask[i] === 0) break;\n  depth++;\n}\n',
  'export async function main() {\n  const server = await createGateway(options);\n  await server.listen({ port: 8080 });\n}\n',
  'def score(worker, request):\n    cached = worker.overlap(request.blocks)\n    return cached / max(1, request.tokens)\n',
];

export interface AgentChatOptions {
  seed?: number;
  /** Conversations in flight (default 32). */
  conversations?: number;
  /** Average JSON body size in bytes (default 40,000). */
  targetBytes?: number;
  /** System prompt size in bytes (default 10,000). */
  systemBytes?: number;
  /** Output tokens asked for, streamed (default 200). */
  maxTokens?: number;
  model?: string;
}

export class AgentChats {
  private readonly options: Required<AgentChatOptions>;
  private rng: () => number;
  private system = '';
  private histories: string[][] = [];
  private sizes: number[] = [];
  private counter = 0;

  constructor(options: AgentChatOptions = {}) {
    this.options = {
      seed: 1,
      conversations: 32,
      targetBytes: 40_000,
      systemBytes: 10_000,
      maxTokens: 200,
      model: 'mock',
      ...options,
    };
    this.rng = createRng(this.options.seed);
    this.reset();
  }

  /** Back to the first request: two runs with the same seed send the same bodies. */
  reset(): void {
    this.rng = createRng(this.options.seed);
    this.counter = 0;
    this.system = JSON.stringify({ role: 'system', content: this.text(this.options.systemBytes) });
    this.histories = [];
    this.sizes = [];
    for (let c = 0; c < this.options.conversations; c++) this.restart(c, true);
  }

  /** The next request's JSON body. */
  next(): string {
    const c = this.counter++ % this.options.conversations;
    if (this.sizes[c] > this.options.targetBytes * 1.25) this.restart(c, false);
    this.turn(c);
    return `{"model":${JSON.stringify(this.options.model)},"stream":true,"max_tokens":${this.options.maxTokens},"messages":[${this.system},${this.histories[c].join(',')}]}`;
  }

  /** The next request's messages (for tokenizing samples). */
  nextMessages(): Array<{ role: string; content: string }> {
    return (JSON.parse(this.next()) as { messages: Array<{ role: string; content: string }> }).messages;
  }

  /** A new conversation of about 0.75 × target (0.75..1.25 × when spread), staggered so they do not restart together. */
  private restart(c: number, spread: boolean): void {
    this.histories[c] = [];
    this.sizes[c] = this.system.length + 80;
    const start = this.options.targetBytes * (spread ? 0.75 + 0.5 * this.rng() : 0.75);
    while (this.sizes[c] < start) this.turn(c);
  }

  private turn(c: number): void {
    const n = this.counter;
    for (const m of [
      { role: 'assistant', content: this.text(600 + Math.floor(this.rng() * 1200)) },
      { role: 'user', content: `Step ${n} of conversation ${c}. ${this.text(200 + Math.floor(this.rng() * 600))}` },
    ]) {
      const json = JSON.stringify(m);
      this.histories[c].push(json);
      this.sizes[c] += json.length + 1;
    }
  }

  private text(bytes: number): string {
    let s = '';
    while (s.length < bytes) {
      if (this.rng() < 0.15) s += `\n\`\`\`\n${CODE[Math.floor(this.rng() * CODE.length)]}\`\`\`\n`;
      else {
        const words = 8 + Math.floor(this.rng() * 12);
        const parts: string[] = [];
        for (let i = 0; i < words; i++) parts.push(WORDS[Math.floor(this.rng() * WORDS.length)]);
        s += `${parts.join(' ')}. `;
      }
    }
    return s;
  }
}
