import assert from 'node:assert/strict';
import { test } from 'node:test';
import { checkYamlValueCount, parseBoundedYaml, YamlBoundError } from '../../src/engines/bounded-yaml.js';

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
  assert.throws(
    () => parseBoundedYaml(`w: ${'['.repeat(5000)}${']'.repeat(5000)}\n`, 100_000),
    /^RangeError: nested more than 64 levels deep \(line 1, column 67\)$/,
  );
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

test('lists and mappings nested more than the depth bound are refused before the parser recurses, naming where', () => {
  const deep = (n: number) => `${'['.repeat(n)}${']'.repeat(n)}`;
  // far past what the parser's recursion follows (its stack overflowed at a few thousand)
  for (const text of [deep(200_000), `{"a":`.repeat(100_000) + '1' + '}'.repeat(100_000), `${'- '.repeat(100_000)}x\n`])
    assert.throws(
      () => parseBoundedYaml(text, 1_000_000),
      (err: Error) =>
        err instanceof YamlBoundError && /^nested more than 64 levels deep \(line 1, column \d+\)$/.test(err.message),
    );
  // 64 levels are taken, the 65th is not; a mapping's level counts too
  assert.deepEqual(parseBoundedYaml(deep(64), 1000), JSON.parse(deep(64)));
  assert.throws(() => parseBoundedYaml(deep(65), 1000), /nested more than 64 levels deep \(line 1, column 65\)/);
  assert.throws(() => parseBoundedYaml(`a: 1\nb: ${deep(64)}\n`, 1000), /\(line 2, column 67\)/);
  const block = Array.from({ length: 70 }, (_, i) => `${' '.repeat(i)}k:`).join('\n');
  assert.throws(() => parseBoundedYaml(`${block} 1\n`, 1000), /nested more than 64 levels deep \(line 65,/);
  assert.throws(() => parseBoundedYaml(deep(3), 1000, 2), /nested more than 2 levels deep/);
  // problems other than a bound keep the parser's message, with its position
  assert.throws(
    () => parseBoundedYaml('a: [1, 2\n', 1000),
    (err: Error) => !(err instanceof YamlBoundError) && / at line \d+, column \d+/.test(err.message),
  );
});

test('quoted scalars count as values: a JSON text of empty strings is refused by its count', () => {
  // 4 MiB of `"",` is 1.4 million strings: uncounted, they took 1.4 GB and 15 s to parse
  for (const text of [`[${Array(101).fill('""').join(',')}]`, `[${Array(101).fill("''").join(',')}]`])
    assert.throws(() => checkYamlValueCount(text, 100), /holds more than 100 values/);
  const keys = Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`k${i}`, `v${i}`]));
  assert.throws(() => parseBoundedYaml(JSON.stringify(keys), 100), /holds more than 100 values/);
  assert.deepEqual(parseBoundedYaml(JSON.stringify(keys), 121), keys);
});
