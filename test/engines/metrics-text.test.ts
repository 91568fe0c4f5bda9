import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parsePrometheusText, readEngineLoad, readKvCapacityTokens } from '../../src/engines/metrics/prometheus.js';

/** The labels of the one sample of `x` on the page `x{<body>} 1`, undefined when the line was skipped. */
const labelsOf = (body: string) => {
  const samples = parsePrometheusText(`x{${body}} 1\n`).get('x');
  return samples === undefined ? undefined : Object.fromEntries(samples[0].labels);
};

/** The value of the one sample of `x` on the page `x <value>`, undefined when the line was skipped. */
const valueOf = (value: string) => parsePrometheusText(`x ${value}\n`).get('x')?.[0].value;

describe('Prometheus text format: label sets', () => {
  test('a value reads \\\\, \\" and \\n as the text format does; a backslash before any other character stays', () => {
    assert.deepEqual(labelsOf(String.raw`a="q\"b\\s\nn"`), { a: 'q"b\\s\nn' });
    // pairs are read from the left: an escaped backslash, then the letter n
    assert.deepEqual(labelsOf(String.raw`a="\\n"`), { a: '\\n' });
    // Prometheus keeps an escape it does not define as written (its lvalReplacer has the three only)
    assert.deepEqual(labelsOf(String.raw`a="C:\temp\x",b="\t\""`), { a: String.raw`C:\temp\x`, b: '\\t"' });
    // a raw tab in a value is the value's; with escapes beside it, both are read
    assert.deepEqual(labelsOf('a="1\t2",b="\t\\"\\n"'), { a: '1\t2', b: '\t"\n' });
    assert.deepEqual(labelsOf('a="",b="}{,=",c="\\"}"'), { a: '', b: '}{,=', c: '"}' });
    // many escapes beside a raw tab or an escape kept as written
    assert.deepEqual(labelsOf(`a="\t${'\\"'.repeat(20)}\\t\\n"`), { a: `\t${'"'.repeat(20)}\\t\n` });
    // a value of tens of thousands of escapes is read whole
    assert.deepEqual(labelsOf(`a="${'\\"'.repeat(30000)}"`), { a: '"'.repeat(30000) });
  });

  test('label sets that are not name="value" pairs, or of more than 64 labels, are skipped; blanks and a last comma are no fault', () => {
    assert.deepEqual(labelsOf(' a = "1" ,\tb\t=\t"2" , '), { a: '1', b: '2' });
    assert.deepEqual(labelsOf('a="1",'), { a: '1' });
    assert.deepEqual(labelsOf(''), {});
    assert.deepEqual(labelsOf('  '), {});
    for (const body of [
      ',',
      'a="1",,',
      ',a="1"',
      'a="1" b="2"',
      'a=1',
      'a',
      'a=',
      '="1"',
      '1a="1"',
      'a-b="1"',
      'a="1"b',
    ])
      assert.equal(labelsOf(body), undefined, body);
    const labels = (n: number) => Array.from({ length: n }, (_, i) => `a${i}="${i}"`).join(',');
    assert.equal(Object.keys(labelsOf(labels(64)) ?? {}).length, 64);
    assert.equal(labelsOf(labels(65)), undefined);
    // one such series on a load page leaves the others as they were
    const page = `vllm:num_requests_running{${labels(65)}} 9\nvllm:num_requests_running{engine="0"} 2\n`;
    assert.equal(readEngineLoad(page).running, 2);
  });

  test("vLLM's cache_config_info is read on its line only: an unclosed label set borrows nothing of the next", () => {
    const load = 'vllm:num_requests_running 1\n';
    const closed = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n';
    assert.equal(readKvCapacityTokens(`${load}${closed}`), 1600);
    const open = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100",\nother{a="b"} 1\n';
    assert.equal(readKvCapacityTokens(`${load}${open}`), undefined);
    assert.equal(readEngineLoad(`${load}${open}`).kvCapacityTokens, undefined);
    // the labels are found with blanks after their commas, not inside another label's name
    const spaced = 'vllm:cache_config_info{block_size="16", engine="0",\tnum_gpu_blocks="100",xblock_size="2"} 1.0\n';
    assert.equal(readKvCapacityTokens(`${load}${spaced}`), 1600);
  });
});

describe('Prometheus text format: sample values', () => {
  test('a value is a decimal number or Inf, Infinity and NaN as ParseFloat reads them; what else Number() reads is none', () => {
    const read: [string, number][] = [
      ['1', 1],
      ['-2.5', -2.5],
      ['+3', 3],
      ['.5', 0.5],
      ['5.', 5],
      ['007', 7],
      ['1e3', 1000],
      ['1E+2', 100],
      ['2.5e-1', 0.25],
      ['-0', -0],
      ['+Inf', Infinity],
      ['-Inf', -Infinity],
      ['inf', Infinity],
      ['INFINITY', Infinity],
      ['-infinity', -Infinity],
      ['NaN', NaN],
      ['nan', NaN],
      // past the largest double: ParseFloat's ErrRange, read as the infinity it returns with it
      ['1e400', Infinity],
      ['-1e400', -Infinity],
    ];
    for (const [text, value] of read) assert.ok(Object.is(valueOf(text), value), text);
    for (const text of [
      '0x10',
      '0X1F',
      '0b1',
      '0o7',
      '0x1p4',
      '1_000',
      '+NaN',
      '-nan',
      'infin',
      'Infinityy',
      '1e',
      '1e+',
      'e5',
      '.',
      '-',
      '1.2.3',
      '1,5',
      '١',
    ])
      assert.equal(valueOf(text), undefined, text);
    // the line is skipped, as any malformed line is: another series of the name is read
    assert.equal(readEngineLoad('vllm:num_requests_waiting 0x10\nvllm:num_requests_waiting 3\n').waiting, 3);
    // a timestamp after the value is no part of it
    assert.equal(valueOf('4 1700000000000'), 4);
    assert.equal(valueOf('4\t1700000000000'), 4);
  });
});

describe('OpenMetrics # EOF', () => {
  test('nothing after a # EOF line is read', () => {
    const page = 'vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n# EOF\nvllm:num_requests_running 40\n';
    assert.deepEqual(readEngineLoad(page), { running: 1, waiting: 0, kvUsage: 0.5 });
    assert.deepEqual([...parsePrometheusText('x 1\n# EOF\ny 2\n').keys()], ['x']);
    assert.deepEqual([...parsePrometheusText('x 1\r\n# EOF\r\ny 2\r\n').keys()], ['x']);
    assert.deepEqual([...parsePrometheusText('x 1\n# EOF').keys()], ['x']);
    // a page that is nothing but its end has no load metrics
    assert.throws(() => readEngineLoad('# EOF\nvllm:num_requests_running 1\n'), /no vLLM or SGLang load metrics/);
    // cache_config_info after the end is no part of the page either
    const capacity = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n';
    assert.equal(readEngineLoad(`vllm:num_requests_running 1\n# EOF\n${capacity}`).kvCapacityTokens, undefined);
    // a comment that only starts like it does not end the page
    for (const comment of ['# EOFX', '# EOF x', '#EOF', '## EOF', '# eof'])
      assert.deepEqual([...parsePrometheusText(`x 1\n${comment}\ny 2\n`).keys()], ['x', 'y'], comment);
  });
});
