import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { checkedFlags, type FlagSpec } from '../../bench/stats.js';

const SPEC: FlagSpec = { out: 'value', json: 'switch', profile: 'optional' };

describe('checkedFlags (bench/stats.ts)', () => {
  test('takes the flags of the spec, each as its kind is given', () => {
    assert.deepEqual(checkedFlags([], SPEC), new Map());
    assert.deepEqual(
      checkedFlags(['--json', '--out', 'a.json', '--profile'], SPEC),
      new Map<string, string | true>([
        ['json', true],
        ['out', 'a.json'],
        ['profile', true],
      ]),
    );
    assert.deepEqual(checkedFlags(['--profile', 'p.cpuprofile', '--json'], SPEC).get('profile'), 'p.cpuprofile');
  });

  test('refuses a flag the spec does not name, listing those it does', () => {
    assert.throws(() => checkedFlags(['--ouy', 'a.json'], SPEC), {
      message: 'unknown flag --ouy (--out, --json, --profile)',
    });
    // names an object has of its own prototype are not flags
    for (const name of ['constructor', 'toString', '__proto__'])
      assert.throws(() => checkedFlags([`--${name}`], SPEC), { message: new RegExp(`^unknown flag --${name} `) });
  });

  test('refuses a flag that takes a value without one, at the end or before another flag', () => {
    assert.throws(() => checkedFlags(['--json', '--out'], SPEC), { message: '--out needs a value' });
    assert.throws(() => checkedFlags(['--out', '--json'], SPEC), { message: '--out needs a value' });
  });

  test('refuses a stray argument, first or after a switch', () => {
    assert.throws(() => checkedFlags(['stray', '--json'], SPEC), { message: "unexpected argument 'stray'" });
    assert.throws(() => checkedFlags(['--json', 'stray'], SPEC), {
      message: "unexpected argument 'stray' (--json takes no value)",
    });
    assert.throws(() => checkedFlags(['--out', 'a.json', 'stray'], SPEC), { message: "unexpected argument 'stray'" });
  });
});
