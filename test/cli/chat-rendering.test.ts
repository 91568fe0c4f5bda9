import assert from 'node:assert/strict';
import { test } from 'node:test';
import { resolveEpp } from '../helpers/epp-config.js';
import { resolveServe } from '../helpers/serve-config.js';

test('--chat-rendering: vllm by default, sglang by flag, environment or for epp; anything else refused', () => {
  assert.equal(resolveServe([]).config.chatRendering, 'vllm');
  assert.equal(
    resolveServe(['--tokenize', 'tokenizer', '--tokenizer', '/t', '--chat-rendering', 'sglang']).config.chatRendering,
    'sglang',
  );
  assert.equal(resolveServe([], { CONTEXTFORGE_CHAT_RENDERING: 'sglang' }).config.chatRendering, 'sglang');
  assert.equal(resolveEpp(['--chat-rendering', 'sglang']).config.chatRendering, 'sglang');
  assert.throws(() => resolveServe(['--chat-rendering', 'trtllm']), /chat-rendering/);
});

test('--chat-rendering is named as doing nothing without --tokenize tokenizer', () => {
  assert.deepEqual(resolveServe(['--tokenize', 'engine', '--chat-rendering', 'sglang']).resolved.warnings, [
    '--chat-rendering has no effect without --tokenize tokenizer (the mode is engine)',
  ]);
  assert.deepEqual(resolveServe(['--tokenize', 'engine']).resolved.warnings, []);
  assert.deepEqual(
    resolveServe(['--tokenize', 'tokenizer', '--tokenizer', '/t', '--chat-rendering', 'sglang']).resolved.warnings,
    [],
  );
});
