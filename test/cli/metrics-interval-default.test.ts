import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_METRICS_INTERVAL_MS } from '../../src/engines/metrics/scraper.js';
import { DEFAULT_SCRAPE_INTERVAL_MS } from '../../src/sim/simulator.js';
import { resolveEpp } from '../helpers/epp-config.js';
import { resolveServe } from '../helpers/serve-config.js';

// the routing figures the project reports are simulated with load read every
// DEFAULT_SCRAPE_INTERVAL_MS: the gateway and the endpoint picker read it as often unless told
test('serve and epp scrape engine metrics as often as the simulator their figures come from does', () => {
  assert.equal(DEFAULT_METRICS_INTERVAL_MS, DEFAULT_SCRAPE_INTERVAL_MS);
  assert.equal(resolveServe([]).config.metricsIntervalMs, DEFAULT_SCRAPE_INTERVAL_MS);
  assert.equal(resolveEpp([]).config.metricsIntervalMs, DEFAULT_SCRAPE_INTERVAL_MS);
  assert.equal(resolveServe(['--metrics-interval-ms', '1000']).config.metricsIntervalMs, 1000);
});
