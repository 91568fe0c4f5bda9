import { startPicker } from '../../epp/run-picker.js';
import type { EppConfig } from './serve.js';
import { listening, startGateway } from './serve-run.js';

/** `epp` with its settings resolved: the gateway and its endpoint picker, until SIGINT or SIGTERM. */
export async function runEpp(c: EppConfig): Promise<void> {
  const log = (m: string) => process.stderr.write(`${m}\n`);
  if (c.workers.length === 0 && !c.discover)
    log(
      'warning: no workers (--worker, CONTEXTFORGE_WORKERS, the config file, --discover); add them with POST /admin/workers',
    );
  // the HTTP side serves metrics, health and admin only: clients reach the engines through the gateway
  const { gateway, describe, close } = await startGateway(c, log, { openAiRoutes: false });
  const picker = await listening(
    `--host ${c.host} --port ${c.port}`,
    () => startPicker(gateway, c, { host: c.host, port: c.port, log }),
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
  log(
    `contextforge-router endpoint picker (ext_proc gRPC) on ${c.host}:${String(picker.eppPort)}, metrics and admin on ${address} (${describe})`,
  );
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  await picker.close();
  await close();
}
