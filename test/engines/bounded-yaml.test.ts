import assert from 'node:assert/strict';
import { test } from 'node:test';
import { checkYamlValueCount, parseBoundedYaml } from '../../src/engines/bounded-yaml.js';

test('a YAML text is refused past its bound of values before it is parsed', () => {
  // a few hundred bytes of values at a bound of 100: refused without composing them
  assert.throws(() => checkYamlValueCount(`[${Array(101).fill('[]').join(',')}]`, 100), /holds more than 100 values/);
  assert.throws(() => parseBoundedYaml(`k: [${Array(200).fill('1').join(', ')}]`, 100), /holds more than 100 values/);
  const items = `${Array(50).fill('- a').join('\n')}\n`;
  assert.throws(() => parseBoundedYaml(`k:\n${items}${items}${items}`, 100), /holds more than 100 values/);
  // comments and blank lines are no values
  assert.deepEqual(parseBoundedYaml(`# ${'c'.repeat(1000)}\n\n\na: 1\nb: [x, {c: d}]\n`, 10), {
    a: 1,
    b: ['x', { c: 'd' }],
  });
  assert.equal(parseBoundedYaml('', 10), null);
});

test('duplicate keys are refused at any depth, naming the line; a large mapping of distinct keys is read', () => {
  assert.throws(
    () => parseBoundedYaml('port: 1\nport: 2\n', 100),
    /Map keys must be unique at line 2, column 1: 'port'/,
  );
  assert.throws(() => parseBoundedYaml('a:\n  x: 1\n  y: 2\n  x: 3\n', 100), /Map keys must be unique at line 4/);
  assert.throws(
    () => parseBoundedYaml('{1: a, "1": b}', 100),
    /Map keys must be unique/,
    'one key as a JavaScript object',
  );
  assert.deepEqual(parseBoundedYaml('a: {x: 1}\nb: {x: 2}\n', 100), { a: { x: 1 }, b: { x: 2 } });
  // the parser's own check compares every key with every key before it (minutes at 100,000)
  const n = 50_000;
  const text = Array.from({ length: n }, (_, i) => `sk-live-${String(i).padStart(16, '0')}: team-${i % 7}`).join('\n');
  const keys = parseBoundedYaml(text, 250_000) as Record<string, string>;
  assert.equal(Object.keys(keys).length, n);
  assert.equal(keys['sk-live-0000000000049999'], 'team-5');
  assert.throws(
    () => parseBoundedYaml(`${text}\nsk-live-0000000000000007: team-x\n`, 250_000),
    /'sk-live-0000000000000007' appears twice/,
  );
});

test('the parser problems of a document are errors', () => {
  assert.throws(() => parseBoundedYaml('port: 1\n---\nport: 2\n', 100), /holds 2 YAML documents/);
  assert.throws(() => parseBoundedYaml(`w: ${'['.repeat(5000)}${']'.repeat(5000)}\n`, 100_000), /nested too deeply/);
  assert.throws(() => parseBoundedYaml('host: !bogus 0.0.0.0\n', 100), /Unresolved tag/);
  // an alias bomb stops at the parser's alias bound
  const bomb = [
    'a: &a [x, x, x, x, x, x, x, x, x, x]',
    ...Array.from(
      { length: 8 },
      (_, i) =>
        `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [${Array(10)
          .fill(`*${String.fromCharCode(97 + i)}`)
          .join(', ')}]`,
    ),
  ].join('\n');
  assert.throws(() => parseBoundedYaml(bomb, 100_000), /alias/i);
});
