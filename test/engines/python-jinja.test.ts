import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Template } from '@huggingface/jinja';
import { parseLosslessJson } from '../../src/core/lossless-json.js';
import { MAX_TEMPLATE_RANGE, renderWithPythonNumbers } from '../../src/engines/python-jinja.js';

const render = (source: string, x: unknown): string => renderWithPythonNumbers(new Template(source).parsed, { x });
const data = () =>
  parseLosslessJson('{"a": 1.0, "b": [1e-7, 2], "i": 12345678901234567890, "o": 1E400, "s": "1.0"}', 8);

test('numbers read from JSON render as Python renders them (expected texts from jinja2 + json.dumps)', () => {
  assert.equal(
    render('{{ x | tojson }}', data()),
    '{"a": 1.0, "b": [1e-07, 2], "i": 12345678901234567890, "o": Infinity, "s": "1.0"}',
  );
  assert.equal(render('{{ x.b | tojson(indent=2) }}', data()), '[\n  1e-07,\n  2\n]');
  assert.equal(render('{{ x.a }} {{ x.b[0] }} {{ x.i }} {{ x.o }}', data()), '1.0 1e-07 12345678901234567890 inf');
});

test('they stay numbers to a template: comparisons, arithmetic, tests', () => {
  assert.equal(render('{% if x.a > 0.5 and x.b[0] < 1 %}yes{% endif %}', data()), 'yes');
  assert.equal(render('{{ x.a + 1 }} {{ x.b[1] * 3 }}', data()), '2.0 6');
  assert.equal(
    render(
      "{{ 'y' if x.a is number else 'n' }}{{ 'y' if x.a is integer else 'n' }}{{ 'y' if x.i is integer else 'n' }}",
      data(),
    ),
    'yny',
  );
  assert.equal(render("{{ 'y' if x.a == 1 else 'n' }}", data()), 'y');
});

test('everything else renders as Template.render renders it', () => {
  const source =
    '{{ x | tojson }}|{{ x.n | tojson(sort_keys=true, indent=1) }}|{% for i in range(3) %}{{ i }}{% endfor %}|{{ x.s }}';
  const plain = { n: { b: 1.5, a: [1, 'é'] }, s: 'pyjson-marker' };
  assert.equal(
    renderWithPythonNumbers(new Template(source).parsed, { x: plain }),
    new Template(source).render({ x: plain }),
  );
  assert.throws(() => render('{{ raise_exception("no") }}', null), /no/);
  // but None, True, a dict and a list print as Python's str() writes them, where the library
  // writes nothing, `true` and JSON (jinja-parity.test.ts checks more against jinja2)
  assert.equal(
    render('{{ none }}|{{ true }}|{{ x }}|{{ x.n.a }}', plain),
    "None|True|{'n': {'b': 1.5, 'a': [1, 'é']}, 's': 'pyjson-marker'}|[1, 'é']",
  );
});

test("a template's range() past MAX_TEMPLATE_RANGE items is refused, not built", () => {
  // built whole, a list of some hundred million items stops the process (V8's invalid size error)
  assert.throws(
    () => render(`{% for i in range(${MAX_TEMPLATE_RANGE + 1}) %}{% endfor %}ok`, 0),
    (err: Error) =>
      err instanceof RangeError && /range\(\) would make 100001 items, more than 100000/.test(err.message),
  );
  assert.throws(() => render('{% for i in range(5, 300005, 2) %}{% endfor %}', 0), /range\(\) would make 150000 items/);
  assert.throws(() => render('{% for i in range(0, -300000, -1) %}{% endfor %}', 0), /range\(\)/);
  // what templates use it for still works
  assert.equal(render('{% for i in range(3) %}{{ i }}{% endfor %}', 0), '012');
  assert.equal(render('{% for i in range(1, 10, 4) %}{{ i }}{% endfor %}', 0), '159');
  assert.equal(render('{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}', 0), '321');
  assert.equal(render(`{{ range(${MAX_TEMPLATE_RANGE}) | length }}`, 0), String(MAX_TEMPLATE_RANGE));
});

test("strip, lstrip, rstrip and the trim filter are Python's: their chars argument, Python's whitespace (expected texts from jinja2)", () => {
  // with an argument: those characters, from the ends they name
  assert.equal(render("{{ x.strip('ab') }}|{{ x.lstrip('ab') }}|{{ x.rstrip('ab') }}", 'abxaba'), 'x|xaba|abx');
  assert.equal(render("{{ x.strip('\n') }}", '\n  hi  \n'), '  hi  ');
  assert.equal(render("{{ x | trim('-') }}", '--a--'), 'a');
  // code points, not UTF-16 units: an astral character is stripped whole
  assert.equal(render("{{ x.strip('🚀') }}", '🚀a🚀'), 'a');
  // no argument or None: Python's whitespace, which keeps U+FEFF and takes U+001C-U+001F and U+0085
  assert.equal(JSON.stringify(render('{{ x.strip() }}', '\ufeff a \ufeff')), JSON.stringify('\ufeff a \ufeff'));
  assert.equal(JSON.stringify(render('{{ x.strip(none) }}', '\u001f\u0085 a\u2028\t')), JSON.stringify('a'));
  assert.equal(JSON.stringify(render('{{ x | trim }}', '\ufeffa\u001c')), JSON.stringify('\ufeffa'));
  assert.equal(render("{{ x.strip('') }}", ' a '), ' a ');
  assert.throws(() => render('{{ x.strip(1) }}', 'a'), /arg must be None or str/);
});

test('join by an attribute fails the rendering (the request is routed on its text), never writes the items whole', () => {
  const render = (source: string) =>
    renderWithPythonNumbers(new Template(source).parsed, { l: [{ n: 'x' }, { n: 'y' }] });
  // Jinja2 writes "xy"; the library would write each item's own text
  assert.throws(() => render('{{ l | join(attribute="n") }}'), /join by an attribute/);
  assert.throws(() => render('{{ l | join(d=",") }}'), /join by an attribute/);
  assert.throws(() => render('{{ l | join(",", "n") }}'), /join by an attribute/);
  assert.equal(render('{{ l | map(attribute="n") | join(",") }}'), 'x,y');
});
