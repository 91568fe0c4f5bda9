import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseWorkerSpec } from '../../src/cli/commands/serve.js';
import { shortenCommanderMessage } from '../../src/cli/options.js';
import { quotedText, shownText } from '../../src/core/shown-text.js';
import { KVAwareRouter } from '../../src/index.js';
import { loadTrace } from '../../src/sim/load-trace.js';
import { ChatTokenizer } from '../../src/engines/chat-tokenizer.js';
import { MIN_ADMIN_TOKEN_LENGTH, resolveAdminToken } from '../../src/server/admin-auth.js';
import { ApiKeys, loadApiKeysFile } from '../../src/server/api-keys.js';
import { parseWorkerRecord } from '../../src/server/worker-input.js';
import { createStateStore } from '../../src/state/create-state-store.js';
import { parseRedisUrl } from '../../src/state/redis-state-store.js';
import { resolveServe } from '../helpers/serve-config.js';
import { CLI } from '../helpers/cli-entry.js';

/** Runs the CLI; resolves with its exit status and what it wrote to stderr. */
function cli(args: string[], env: Record<string, string> = {}): Promise<{ status: number | null; stderr: string }> {
  const child = spawn(process.execPath, [...CLI, ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, ...env },
  });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.once('close', (status) => resolve({ status, stderr })));
}

/** The message of what `fn` throws. */
function messageOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    return (err as Error).message;
  }
  throw new Error('nothing was thrown');
}

function write(text: string): string {
  const file = join(mkdtempSync(join(tmpdir(), 'cf-echo-')), 'router.yaml');
  writeFileSync(file, text);
  return file;
}

test('a value a message repeats is cut with an ellipsis and its length, and shows no password', () => {
  assert.equal(shownText('short'), 'short');
  assert.equal(quotedText('short'), "'short'");
  assert.equal(quotedText('x'.repeat(100_000)), `'${'x'.repeat(80)}…' (100000 characters)`);
  assert.equal(shownText('redis://user:secret@host:6379/1'), 'redis://***@host:6379/1');
  // the host comes after the last @, as a URL parser reads it
  assert.equal(shownText('redis://user:se@cret@host:6379/1'), 'redis://***@host:6379/1');
  assert.equal(
    shownText('id=a,url=http://h:1,events=tcp://u:p@h:5557,metrics=http://u:p@h:2/m'),
    'id=a,url=http://h:1,events=tcp://***@h:5557,metrics=http://***@h:2/m',
  );
  assert.equal(quotedText('id=a,url=http://u:secret@h:1'), "'id=a,url=http://***@h:1'");
  // a password past the part shown is not shown either
  assert.doesNotMatch(shownText(`${'y'.repeat(70)} http://u:secret@h`), /secret/);
  assert.equal(
    shortenCommanderMessage(`error: unknown option '--${'p'.repeat(200)}'\n`),
    `error: unknown option '--${'p'.repeat(78)}…' (202 characters)\n`,
  );
});

test('a password in a worker spec is never repeated in the message refusing the spec', () => {
  const secret = /secret/;
  for (const spec of [
    'id=a,url=http://u:secret@h:99999',
    'id=a,url=http://u:secret@h:1,bogus=1',
    'id=a b,url=http://u:secret@h:1',
    'id=a,url=http://u:secret@h:1,url=http://u:secret@h:2',
    'url=http://u:secret@h:1,replay=tcp://h:1',
  ]) {
    const message = messageOf(() => parseWorkerSpec(spec));
    assert.doesNotMatch(message, secret, message);
    assert.match(message, /^--worker '.*\*\*\*@/, message);
  }
  const fromEnv = messageOf(() => resolveServe([], { CONTEXTFORGE_WORKERS: 'id=a,url=http://u:secret@h:99999' }));
  assert.match(fromEnv, /^CONTEXTFORGE_WORKERS 'id=a,url=http:\/\/\*\*\*@h:99999': url must have a port/);
  const file = write('workers:\n  - id=a,url=http://u:secret@h:99999\n');
  assert.doesNotMatch(
    messageOf(() => resolveServe(['--config', file])),
    secret,
  );
});

test('a KV-event endpoint with credentials is refused (ZeroMQ takes none), without showing them', () => {
  for (const field of ['events', 'replay'] as const) {
    const record = { id: 'a', url: 'http://h:1', events: 'tcp://h:5557', [field]: 'tcp://u:secret@h:5558' };
    const message = messageOf(() => parseWorkerRecord(record, 'worker'));
    assert.match(message, new RegExp(`^worker: ${field} must not hold a user name or password`), message);
    assert.doesNotMatch(message, /secret/);
  }
  const message = messageOf(() => resolveServe(['--worker', 'id=a,url=http://h:1,events=tcp://u:secret@h:5557']));
  assert.match(message, /events must not hold a user name or password/);
  assert.doesNotMatch(message, /secret/);
});

test('long values given to the CLI are echoed cut short, with their length', async () => {
  const long = 'x'.repeat(100_000);
  const refused = await Promise.all([
    cli(['serve', '--port', long]),
    cli(['serve', `--${long}`]),
    cli(['serve', '--worker', long]),
    cli(['serve', '--discover', long]),
    cli(['serve', '--objectives', long]),
    cli(['serve', '--config', long]),
    cli(['serve'], { CONTEXTFORGE_WORKERS: long }),
    cli(['serve'], { CONTEXTFORGE_PORT: long }),
  ]);
  refused.push(
    ...(await Promise.all([
      cli(['mock-engine', '--events', long]),
      cli(['mock-engine', '--block-hash', long]),
      cli(['simulate', '--trace', long]),
      cli(['simulate', '--trace', 'workflows:1', '--policies', long]),
      cli(['simulate', '--trace', 'workflows:1', '--format', long]),
      cli(['simulate', '--trace', 'workflows:1', '--fail', long]),
      cli(['simulate', '--trace', 'workflows:1', '--worker-kv-tokens', long]),
      cli(['simulate', '--trace', 'workflows:1', '--policy-options', long]),
    ])),
  );
  refused.push(
    ...(await Promise.all([
      cli(['tune', '--trace', 'workflows:1', '--format', long]),
      cli(['demo', '--policies', long]),
      cli(['serve', '--config', write(`workers:\n  - ${long}\n`)]),
    ])),
  );
  for (const { status, stderr } of refused) {
    assert.equal(status, 2, stderr.slice(0, 300));
    assert.ok(stderr.length < 1000, `${stderr.length} characters: ${stderr.slice(0, 300)}`);
    assert.match(stderr, /…'? \(\d+ characters\)/, stderr);
  }
});

test('a password in a URL given to the CLI is not repeated by its messages', async () => {
  const url = 'http://user:secret@host:1';
  for (const { stderr } of await Promise.all([
    cli(['serve', '--port', url]),
    cli(['serve', '--policy', url]),
    cli(['serve'], { CONTEXTFORGE_PORT: url }),
    cli(['serve', '--worker', `id=a,url=${url},events=tcp://user:secret@host:5557`]),
    cli(['mock-engine', '--events', 'tcp://user:secret@host:1']),
  ])) {
    assert.match(stderr, /^error: /, stderr);
    assert.doesNotMatch(stderr, /secret/, stderr);
  }
});

test('a Redis URL the state store cannot read is refused without its password', () => {
  for (const url of [
    'redis://user:secret@host:6379/x',
    'redis://user:secret@host:99999',
    'rediss://user:secret@host',
  ]) {
    const message = messageOf(() => parseRedisUrl(url));
    assert.match(message, /^state: /, message);
    assert.doesNotMatch(message, /secret/, message);
  }
  assert.doesNotMatch(
    messageOf(() => createStateStore('mem://user:secret@host')),
    /secret/,
  );
});

test('a long file path is named cut short by the files serve reads at start', () => {
  const path = `${tmpdir()}/${'d'.repeat(3000)}`;
  const short = (fn: () => unknown, what: RegExp) => {
    const message = messageOf(fn);
    assert.match(message, what, message.slice(0, 200));
    assert.ok(message.length < 600, `${message.length} characters: ${message.slice(0, 200)}`);
    assert.match(message, /…'? \(\d+ characters\)/);
  };
  short(() => ChatTokenizer.load(path), /^tokenizer: /);
  short(() => loadApiKeysFile(path), /^--api-keys-file /);
  short(() => resolveAdminToken({ tokenFile: `${path}/admin-token` }), /^--admin-token-file /);
});

test('a secret setting of the wrong type or form is refused without its value', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-secret-'));
  const file = (text: string) => {
    const f = join(dir, `${Math.random().toString(36).slice(2)}.yaml`);
    writeFileSync(f, text);
    return f;
  };
  for (const [args, env, named] of [
    [['--config', file('admin-token: 12345\n')], {}, /admin-token must be a string$/],
    [['--config', file('admin-token: [12345, 67]\n')], {}, /admin-token must be a string$/],
    [['--config', file('state: 12345\n')], {}, /state must be a string$/],
    [[], { CONTEXTFORGE_STATE: '12345' }, /^CONTEXTFORGE_STATE must be memory or redis:/],
  ] as const) {
    const message = messageOf(() => resolveServe([...args], { ...env }));
    assert.match(message, named, message);
    assert.doesNotMatch(message, /12345/, message);
  }
});

test('an admin token shorter than the gateway takes is refused by the setting, naming it', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cf-token-'));
  const f = join(dir, 'router.yaml');
  writeFileSync(f, 'admin-token: abc123\n');
  for (const [args, env, named] of [
    [['--admin-token', 'abc123'], {}, '--admin-token'],
    [[], { CONTEXTFORGE_ADMIN_TOKEN: 'abc123' }, 'CONTEXTFORGE_ADMIN_TOKEN'],
    [['--config', f], {}, `--config ${f}: admin-token`],
  ] as const) {
    assert.equal(
      messageOf(() => resolveServe([...args], { ...env })),
      `${named} must have at least ${MIN_ADMIN_TOKEN_LENGTH} characters`,
    );
  }
  assert.equal(
    messageOf(() => resolveServe(['--admin-token', ' padded-token'])),
    '--admin-token must not begin or end with whitespace',
  );
  assert.equal(resolveServe(['--admin-token', 'abcd1234']).config.adminToken, 'abcd1234');
  // --print-config checks it as serve does: the same one line, exit 2
  const printed = await cli(['serve', '--admin-token', 'abc123', '--print-config', 'json']);
  assert.equal(printed.status, 2, printed.stderr);
  assert.equal(printed.stderr, `error: --admin-token must have at least ${MIN_ADMIN_TOKEN_LENGTH} characters\n`);
});

/** ESC (a title set, a line erased), BEL, CR (a forged line), NUL and U+2028, as a downloaded file may hold them. */
const CONTROLS = '\x1b]0;pwned\x07\x1b[2K\rerror: x\x00y\u2028z';
const CONTROLS_SHOWN = '\\x1b]0;pwned\\x07\\x1b[2K\\x0derror: x\\x00y\\u2028z';
// eslint-disable-next-line no-control-regex -- what no message may hold raw
const RAW = /[\x00\x07\x1b\r\u2028]/;

/** The message of what `fn` rejects with. */
async function rejectionOf(fn: () => Promise<unknown>): Promise<string> {
  try {
    await fn();
  } catch (err) {
    return (err as Error).message;
  }
  throw new Error('nothing was thrown');
}

test('control characters in a value a message repeats are shown escaped, on its line', async () => {
  assert.equal(quotedText(CONTROLS), `'${CONTROLS_SHOWN}'`);
  assert.equal(shownText(`a\n${CONTROLS}`), `a\\x0a${CONTROLS_SHOWN}`);
  // the cut still counts the value's own characters (80), not those of its escapes
  assert.equal(quotedText('\x1b'.repeat(100)), `'${'\\x1b'.repeat(80)}…' (100 characters)`);
  assert.equal(shownText(`http://u:secret@h/${CONTROLS}`), `http://***@h/${CONTROLS_SHOWN}`);
  const messages: [string, string, string][] = [
    // a config key, at the top, under router:, in a mapping and in a worker record
    [
      messageOf(() => resolveServe(['--config', write(`${JSON.stringify(CONTROLS)}: 1\n`)])),
      'config key',
      `unknown key '${CONTROLS_SHOWN}'`,
    ],
    [
      messageOf(() => resolveServe(['--config', write(`router:\n  ${JSON.stringify(CONTROLS)}: 1\n`)])),
      'router key',
      `router.${CONTROLS_SHOWN} is not a router option`,
    ],
    [
      messageOf(() => resolveServe(['--config', write(`costWeights:\n  ${JSON.stringify(CONTROLS)}: 1\n`)])),
      'cost weight',
      `costWeights.${CONTROLS_SHOWN} is not a cost weight`,
    ],
    [
      messageOf(() =>
        resolveServe([
          '--config',
          write(`workers:\n  - id: w1\n    url: http://h:1\n    ${JSON.stringify(CONTROLS)}: 1\n`),
        ]),
      ),
      'worker record key',
      `workers[0]: ${CONTROLS_SHOWN} is not a known key`,
    ],
    [
      messageOf(() =>
        resolveServe(['--config', write(`${JSON.stringify(CONTROLS)}: 1\n${JSON.stringify(CONTROLS)}: 2\n`)]),
      ),
      'repeated key',
      `'${CONTROLS_SHOWN}' appears twice`,
    ],
    // a config value (from a flag and the environment: below, as the CLI prints them)
    [
      messageOf(() => resolveServe(['--config', write(`policy: ${JSON.stringify(CONTROLS)}\n`)])),
      'config value',
      `(got '${CONTROLS_SHOWN}')`,
    ],
    // a worker spec: its key, a field's value, and the spec as the message names it
    [
      messageOf(() => parseWorkerSpec(`id=w1,url=http://h:1,${CONTROLS}=1`)),
      'worker spec key',
      `unknown key '${CONTROLS_SHOWN}'`,
    ],
    [
      messageOf(() => parseWorkerSpec(`id=w1,url=http://h:1,dp-size=${CONTROLS}`)),
      'worker spec value',
      `dpSize must be an integer (got '${CONTROLS_SHOWN}')`,
    ],
    [messageOf(() => parseWorkerSpec(CONTROLS)), 'worker spec', `'${CONTROLS_SHOWN}' is not key=value`],
  ];
  // a trace field: a RAGPulse hash_ids key, and a file name a malformed line's message names
  const rag = mkdtempSync(join(tmpdir(), 'cf-echo-'));
  cpSync(new URL('../fixtures/ragpulse-sample', import.meta.url), rag, { recursive: true });
  const [first, ...rest] = readFileSync(join(rag, '0_trace.jsonl'), 'utf8').split('\n');
  const line = JSON.parse(first) as { hash_ids: Record<string, number[]> };
  line.hash_ids[CONTROLS] = [1];
  writeFileSync(join(rag, '0_trace.jsonl'), [JSON.stringify(line), ...rest].join('\n'));
  messages.push([await rejectionOf(() => loadTrace(rag)), 'trace field', `"hash_ids" has the key '${CONTROLS_SHOWN}'`]);
  const named = join(mkdtempSync(join(tmpdir(), 'cf-echo-')), `t${CONTROLS.replace('\x00', '')}.jsonl`);
  writeFileSync(named, '{"timestamp": 0}\n');
  messages.push([
    await rejectionOf(() => loadTrace(named)),
    'trace file name',
    `t${CONTROLS_SHOWN.replace('\\x00', '')}.jsonl line 1: missing`,
  ]);
  for (const [message, what, shown] of messages) {
    assert.doesNotMatch(message, RAW, `${what}: ${JSON.stringify(message)}`);
    assert.ok(message.includes(shown), `${what}: ${JSON.stringify(message)}`);
  }
  // what the CLI prints: one line, nothing a terminal acts on (an argument or a variable holds no NUL)
  const text = CONTROLS.replace('\x00', '');
  for (const { status, stderr } of await Promise.all([
    cli(['serve', '--config', write(`${JSON.stringify(CONTROLS)}: 1\n`)]),
    cli(['serve', '--port', text]),
    cli(['serve'], { CONTEXTFORGE_POLICY: text }),
    cli(['serve', '--worker', `id=w1,url=http://h:1,${text}=1`]),
    cli(['simulate', '--trace', rag]),
  ])) {
    assert.equal(status, 2, stderr);
    assert.doesNotMatch(stderr, RAW, JSON.stringify(stderr));
    assert.equal(stderr.split('\n').length, 2, JSON.stringify(stderr));
    assert.ok(stderr.includes(CONTROLS_SHOWN.split('\\x00')[0]), JSON.stringify(stderr));
  }
});

test("the library's messages show an unknown option key and a tenant name escaped", () => {
  for (const [message, shown] of [
    [messageOf(() => new KVAwareRouter({ [CONTROLS]: 1 } as never)), `${CONTROLS_SHOWN} is not a known key`],
    [
      messageOf(() => new KVAwareRouter().route({ tokens: [1], [CONTROLS]: 1 } as never)),
      `request.${CONTROLS_SHOWN} is not a known key`,
    ],
    [messageOf(() => new ApiKeys({ 'sk-cccccccccccccccc': CONTROLS })), `tenant '${CONTROLS_SHOWN}' must match`],
  ]) {
    assert.doesNotMatch(message, RAW, JSON.stringify(message));
    assert.ok(message.includes(shown), JSON.stringify(message));
  }
});
