import { startPicker } from '../../epp/run-picker.js';
import { stderrLog } from '../log-line.js';
import { eppTls } from './epp-tls-run.js';
import type { EppConfig } from './serve.js';
import { listening, startGateway } from './serve-run.js';

/** `epp` with its settings resolved: the gateway and its endpoint picker, until SIGINT or SIGTERM. */
export async function runEpp(c: EppConfig): Promise<void> {
  const log = stderrLog();
  // before anything runs: a bad certificate stops epp with nothing left running
  const tls = eppTls(c);
  if (c.workers.length === 0 && !c.discover)
    log(
      'warning: no workers (--worker, CONTEXTFORGE_WORKERS, the config file, --discover); add them with POST /admin/workers',
    );
  // the HTTP side serves metrics, health and admin only: clients reach the engines through the gateway
  const { gateway, describe, close } = await startGateway(c, log, { openAiRoutes: false });
  const picker = await listening(
    `--host ${c.host} --port ${c.port} --health-port ${c.healthPort}`,
    () => startPicker(gateway, c, { host: c.host, port: c.port, log, tls: tls.tls, healthPort: c.healthPort }),
    close,
  );
  const address = await listening(
    `--host ${c.host} --metrics-port ${c.metricsPort}`,
    () => gateway.app.listen({ host: c.host, port: c.metricsPort }),
    async () => {
      await picker.close();
      await close();
    },
  );
  // the stop signals are taken before the start is announced (serve-run.ts says why)
  const stopped = new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  log(
    `contextforge-router endpoint picker (ext_proc gRPC, ${tls.describe}) on ${c.host}:${String(picker.eppPort)}, gRPC health (plaintext) on ${c.host}:${String(picker.healthPort)}, metrics and admin on ${address} (${describe})`,
  );
  await stopped;
  await picker.close();
  await close();
}
