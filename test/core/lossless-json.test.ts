import assert from 'node:assert/strict';
import { test } from 'node:test';
import { jsonEntries, JsonNumber, memberSourceText, parseLosslessJson } from '../../src/core/lossless-json.js';

// Python: json.dumps(json.loads(literal)), the text vLLM's templates render for a JSON number
const PYTHON_JSON: ReadonlyArray<[string, string]> = [
  ['0.0', '0.0'],
  ['1.0', '1.0'],
  ['1e-7', '1e-07'],
  ['100000000000000000000.0', '1e+20'],
  ['12345678901234567890', '12345678901234567890'],
  ['1E400', 'Infinity'],
  ['-1e400', '-Infinity'],
  ['-0.0', '-0.0'],
  ['-0', '0'],
  ['0.1', '0.1'],
  ['1e16', '1e+16'],
  ['1e15', '1000000000000000.0'],
  ['123456789.123', '123456789.123'],
  ['5e-324', '5e-324'],
  ['1.7976931348623157e308', '1.7976931348623157e+308'],
  ['0.0001', '0.0001'],
  ['0.00001', '1e-05'],
  ['2.5E-5', '2.5e-05'],
  ['1e22', '1e+22'],
  ['-12.5e3', '-12500.0'],
  ['3.141592653589793', '3.141592653589793'],
];

test('a JSON number keeps the text Python json.dumps writes for it', () => {
  for (const [literal, python] of PYTHON_JSON) {
    const n = parseLosslessJson(literal, 8);
    assert.ok(n instanceof JsonNumber, literal);
    assert.equal(n.jsonText, python, literal);
    assert.equal(n.value, Number(literal), literal);
  }
  assert.equal((parseLosslessJson('1E400', 8) as JsonNumber).strText, 'inf');
});

test('lossless JSON reads as JSON.parse does, numbers aside; refuses what is not JSON or too deep', () => {
  const text = '{"a": [1, "x\\u00e9\\n", true, null, {"__proto__": {"b": 2.0}}], "a2": {}, "c": []}';
  const value = parseLosslessJson(text, 8);
  assert.equal(
    JSON.stringify(value),
    JSON.stringify(JSON.parse(text)).replace('"b":2', '"b":"2.0"').replace('[1,', '["1",'),
  );
  const inner = (value as { a: Array<Record<string, unknown>> }).a[4];
  assert.ok(Object.hasOwn(inner, '__proto__'));
  assert.equal(Object.getPrototypeOf(inner), Object.prototype);
  for (const bad of ['{', '[1,]', '{"a" 1}', '01', '1.', 'tru', '"\u0001"', '[1] x', ''])
    assert.throws(() => parseLosslessJson(bad, 8), SyntaxError, bad);
  assert.throws(() => parseLosslessJson('[[[1]]]', 2), /deeper than 2/);
  assert.ok(parseLosslessJson('[[1]]', 2));
});

test('memberSourceText gives a top-level member as written, the last of a repeated name', () => {
  const text =
    ' { "model": "m", "tools": [{"x": 1.0, "s": "a]},\\"b"}] , "n": 2, "tools" : [ 0.0 ]\n, "z": {"tools": 1} } ';
  assert.equal(memberSourceText(text, 'tools'), '[ 0.0 ]');
  assert.equal(memberSourceText(text, 'n'), '2');
  assert.equal(memberSourceText(text, 'model'), '"m"');
  assert.equal(memberSourceText(text, 'z'), '{"tools": 1}');
  assert.equal(memberSourceText(text, 'missing'), undefined);
  assert.equal(memberSourceText('[1]', 'tools'), undefined);
  assert.equal(memberSourceText('{"tools": [{"a": 1e-7}]}', 'tools'), '[{"a": 1e-7}]');
});

test("an object's kept key order leaves out a key deleted since, and puts one added since after the rest", () => {
  const o = parseLosslessJson('{"b": 1, "2": 2, "a": 3}', 10) as Record<string, unknown>;
  delete o.b;
  o.added = 4;
  assert.deepEqual(
    jsonEntries(o).map(([k]) => k),
    ['2', 'a', 'added'],
  );
});
