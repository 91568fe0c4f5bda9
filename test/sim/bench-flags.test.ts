import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { checkedFlags, type FlagSpec } from '../../bench/stats.js';
import { benchScript as script, inTempDir as inTemp } from '../helpers/bench-script.js';

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

  test('takes --name=value as --name value, the value split at the first =', () => {
    assert.deepEqual(checkedFlags(['--out=a.json', '--json'], SPEC), checkedFlags(['--out', 'a.json', '--json'], SPEC));
    assert.equal(checkedFlags(['--out=a=b.json'], SPEC).get('out'), 'a=b.json');
    // a value that starts with -- can be given after =
    assert.equal(checkedFlags(['--out=--a.json'], SPEC).get('out'), '--a.json');
    assert.equal(checkedFlags(['--profile=p.cpuprofile'], SPEC).get('profile'), 'p.cpuprofile');
    assert.deepEqual(
      checkedFlags(['--profile', '--out=a.json'], SPEC),
      new Map<string, string | true>([
        ['profile', true],
        ['out', 'a.json'],
      ]),
    );
  });

  test('refuses a switch given a value after =, naming it', () => {
    assert.throws(() => checkedFlags(['--json=x'], SPEC), { message: '--json takes no value' });
    assert.throws(() => checkedFlags(['--json=true', '--out', 'a.json'], SPEC), { message: '--json takes no value' });
    assert.throws(() => checkedFlags(['--json='], SPEC), { message: '--json takes no value' });
  });

  test('refuses a flag given = and nothing after it', () => {
    assert.throws(() => checkedFlags(['--out='], SPEC), { message: '--out needs a value' });
    assert.throws(() => checkedFlags(['--out=', 'a.json'], SPEC), { message: "unexpected argument 'a.json'" });
    assert.throws(() => checkedFlags(['--profile='], SPEC), {
      message: '--profile= needs a value (or give --profile alone)',
    });
  });

  test('refuses an unknown flag given with =, naming it without its value', () => {
    assert.throws(() => checkedFlags(['--ouy=a.json'], SPEC), {
      message: 'unknown flag --ouy (--out, --json, --profile)',
    });
  });

  test('refuses a flag given twice, in either form, naming it', () => {
    for (const argv of [
      ['--json', '--json'],
      ['--out', 'a.json', '--out', 'b.json'],
      ['--out', 'a.json', '--out', 'a.json'],
      ['--out=a.json', '--json', '--out', 'b.json'],
      ['--out', 'a.json', '--out=b.json'],
      ['--profile', '--profile', 'p.cpuprofile'],
    ]) {
      const name = argv[0].slice(2).split('=')[0];
      assert.throws(() => checkedFlags(argv, SPEC), { message: `--${name} given twice` }, argv.join(' '));
    }
  });
});

/** Exit status 2 and one `error: message` line, no stack trace, nothing run. */
function assertRefused(r: ReturnType<typeof script>, message: string): void {
  assert.equal(r.status, 2, `status ${r.status} (signal ${r.signal}): ${r.stderr}`);
  assert.equal(r.stderr, `error: ${message}\n`);
  assert.equal(r.stdout, '');
}

/** Runs `check` with a new temporary directory, removed after. */
const inTempDir = (check: (dir: string) => void) => inTemp('bench-flags-', check);

describe('a bench script given --name=value or a flag twice (benchFlags)', () => {
  test('takes each value given after =, as it would the next argument', () =>
    inTempDir((dir) => {
      // --policies other than the defaults and --only both need --out: the shape check is reached
      // only with all three taken, and it stops the script before any run
      const r = script(
        'bench/held-out.ts',
        `--out=${join(dir, 'held-out.json')}`,
        '--policies=cost,smg',
        '--only=nope',
      );
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, /^error: --only: no shape 'nope' \(/);
      // and the file it names is the one checked
      const bad = join(dir, 'no-such-dir', 'held-out.json');
      const w = script('bench/held-out.ts', `--out=${bad}`, '--only=tenants');
      assert.equal(w.status, 2, w.stderr);
      assert.ok(w.stderr.startsWith(`error: --out ${bad}: cannot write: `), w.stderr);
    }));

  test('refuses a value flag given = and nothing after it', () =>
    inTempDir((dir) =>
      assertRefused(script('bench/held-out.ts', `--out=${join(dir, 'a.json')}`, '--only='), '--only needs a value'),
    ));

  test('refuses a switch given a value after =', () =>
    assertRefused(script('bench/summary.ts', '--json=yes'), '--json takes no value'));

  test('refuses a flag given twice, rather than keep the last', () => {
    assertRefused(script('bench/summary.ts', '--json', '--json'), '--json given twice');
    inTempDir((dir) =>
      assertRefused(
        script('bench/held-out.ts', '--out', join(dir, 'a.json'), '--only', 'tenants', `--out=${join(dir, 'b.json')}`),
        '--out given twice',
      ),
    );
  });
});

describe('--help of a benchmark program', () => {
  test('prints the comment that opens its file and its flags, and exits 0 without running', () => {
    const r = script('bench/cost-moves.ts', '--help');
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^bench:cost-moves — where the hit rate goes/);
    assert.match(r.stdout, /npm run bench:cost-moves \[-- --split train\|evaluation\]/);
    assert.match(r.stdout, /\nflags: --split VALUE, --speeds VALUE, .*--json\n$/);
    assert.doesNotMatch(r.stdout, /^ \*/m, 'the comment without its asterisks');
    assert.equal(script('bench/cost-moves.ts', '-h').stdout, r.stdout);
    // given with other flags it is one more unknown flag, not a request for help
    assert.equal(script('bench/cost-moves.ts', '--json', '--help').status, 2);
  });
});
