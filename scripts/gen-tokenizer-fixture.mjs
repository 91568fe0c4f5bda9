// Writes test/fixtures/tokenizer/{tokenizer.json,tokenizer_config.json}: a small byte-level BPE
// tokenizer in the Hugging Face format (GPT-2/Qwen style: ByteLevel pre-tokenizer, BPE merges,
// ChatML special tokens and chat template), trained here on the project's own docs so the
// fixture is small, deterministic and free of third-party vocabularies.
// Run: node scripts/gen-tokenizer-fixture.mjs
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';

const MERGES = 400;
const root = new URL('../', import.meta.url);
const corpus = ['README.md', 'docs/routing.md', 'docs/server.md', 'docs/engines.md', 'docs/simulator.md']
  .map((f) => readFileSync(new URL(f, root), 'utf8'))
  .join('\n');

// GPT-2's byte → printable-unicode table
const bs = [];
for (let b = 33; b <= 126; b++) bs.push(b);
for (let b = 161; b <= 172; b++) bs.push(b);
for (let b = 174; b <= 255; b++) bs.push(b);
const cs = [...bs];
let n = 0;
for (let b = 0; b < 256; b++)
  if (!bs.includes(b)) {
    bs.push(b);
    cs.push(256 + n++);
  }
const byteChar = new Map(bs.map((b, i) => [b, String.fromCodePoint(cs[i])]));

const split = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const words = new Map();
for (const m of corpus.matchAll(split)) {
  const w = [...Buffer.from(m[0], 'utf8')].map((b) => byteChar.get(b)).join('');
  words.set(w, (words.get(w) ?? 0) + 1);
}
const seqs = [...words].map(([w, c]) => ({ parts: [...w], c }));

const vocab = {};
for (let b = 0; b < 256; b++) vocab[byteChar.get(b)] = Object.keys(vocab).length;
const merges = [];
for (let k = 0; k < MERGES; k++) {
  const pairs = new Map();
  for (const s of seqs)
    for (let i = 0; i + 1 < s.parts.length; i++) {
      const key = `${s.parts[i]} ${s.parts[i + 1]}`;
      pairs.set(key, (pairs.get(key) ?? 0) + s.c);
    }
  let best,
    bestCount = 0;
  for (const [p, c] of pairs)
    if (c > bestCount || (c === bestCount && p < best)) {
      best = p;
      bestCount = c;
    }
  if (!best || bestCount < 2) break;
  const [a, b] = best.split(' ');
  merges.push(best);
  vocab[a + b] = Object.keys(vocab).length;
  for (const s of seqs) {
    const out = [];
    for (let i = 0; i < s.parts.length; i++) {
      if (i + 1 < s.parts.length && s.parts[i] === a && s.parts[i + 1] === b) {
        out.push(a + b);
        i++;
      } else out.push(s.parts[i]);
    }
    s.parts = out;
  }
}

const special = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
const base = Object.keys(vocab).length;
const addedTokens = special.map((content, i) => ({
  id: base + i,
  content,
  single_word: false,
  lstrip: false,
  rstrip: false,
  normalized: false,
  special: true,
}));
for (const t of addedTokens) vocab[t.content] = t.id;
const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: addedTokens,
  normalizer: null,
  pre_tokenizer: byteLevel,
  post_processor: byteLevel,
  decoder: byteLevel,
  model: {
    type: 'BPE',
    dropout: null,
    unk_token: null,
    continuing_subword_prefix: '',
    end_of_word_suffix: '',
    fuse_unk: false,
    byte_fallback: false,
    ignore_merges: false,
    vocab,
    merges,
  },
};
const chatTemplate =
  "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
const config = {
  add_bos_token: false,
  bos_token: null,
  eos_token: '<|im_end|>',
  pad_token: '<|endoftext|>',
  model_max_length: 32768,
  tokenizer_class: 'Qwen2Tokenizer',
  chat_template: chatTemplate,
};
const dir = new URL('test/fixtures/tokenizer/', root);
mkdirSync(dir, { recursive: true });
writeFileSync(new URL('tokenizer.json', dir), `${JSON.stringify(tokenizer)}\n`);
writeFileSync(new URL('tokenizer_config.json', dir), `${JSON.stringify(config, null, 2)}\n`);
console.log(`vocab ${Object.keys(vocab).length}, merges ${merges.length}`);
