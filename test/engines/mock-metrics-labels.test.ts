import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parsePrometheusText, readEngineLoad } from '../../src/engines/metrics/prometheus.js';
import { MockEngine } from '../../src/engines/mock-engine.js';

test("mock-engine's /metrics escapes a model name's backslash, quote and line break (Prometheus text format)", async () => {
  const model = 'a"b\\c\nd';
  const e = await new MockEngine({ model }).start();
  try {
    const page = await (await fetch(`http://127.0.0.1:${e.port}/metrics`)).text();
    assert.ok(
      page.includes('vllm:num_requests_running{model_name="a\\"b\\\\c\\nd",engine="0"} 0'),
      page.split('\n').slice(0, 4).join('\n'),
    );
    // every line is a comment or a whole sample
    for (const line of page.split('\n'))
      assert.match(line, /^(#.*|[a-z_:]+\{model_name="(?:[^"\\\n]|\\[\\"n])*",engine="\d+"\} [\d.e+-]+|)$/, line);
    const running = parsePrometheusText(page).get('vllm:num_requests_running');
    assert.equal(running?.[0].labels.get('model_name'), model);
    assert.equal(readEngineLoad(page).running, 0);
  } finally {
    await e.close();
  }
});
