/**
 * Where each setting's value comes from: a flag, else its environment variable, else the
 * config file, else its default. Every value, whatever its source, is checked by the same
 * schema; a bad one stops `serve` with a message naming the source and the key.
 */
import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import { InvalidArgumentError, Option, type Command } from 'commander';
import { parseBoundedYaml, YamlBoundError } from '../../engines/bounded-yaml.js';
import type { z } from 'zod';
import {
  closestKey,
  describeIssue,
  describeIssueHidingValue,
  firstIssue,
  issueMessage,
} from '../../core/schema-issues.js';
import { fileErrorMessage, quotedText, shownText } from '../../core/shown-text.js';
import { MAX_WORKERS } from '../../core/worker-registry.js';
import { parseWorkerRecord, WORKER_SPEC_KEYS } from '../../server/worker-input.js';
import type { WorkerRecord } from '../../state/state-store.js';
import { DECIMAL, specFields } from '../options.js';
import { parseDiscoverySpec, parseObjectives } from './picker-text.js';
import {
  envName,
  EPP_SCHEMA,
  kebab,
  ROUTER_SETTING_KEYS,
  secretSetting,
  SERVE_SCHEMA,
  unwrapSchema,
  type SettingHelp,
} from './settings.js';

export type Origin = 'default' | 'file' | 'env' | 'flag';

type Shape = Record<string, z.ZodType>;

export interface ResolvedSettings<T> {
  values: T;
  /** Where each setting's value came from (settings without a value are absent). */
  origins: Record<string, Origin>;
  workers: WorkerRecord[];
  workersOrigin: Origin;
  configFile?: string;
  /** What the user may have meant otherwise (an unknown CONTEXTFORGE_ variable), to print. */
  warnings: string[];
}

/**
 * Whether `key` was set (flag, environment, config file) to a value other than its default.
 * What a warning that a setting has no effect asks, rather than only where the value came
 * from: --print-config's output read back as the config file sets every default from the file.
 */
export function setOtherThanDefault(resolved: ResolvedSettings<object>, schema: z.ZodObject, key: string): boolean {
  const origin = resolved.origins[key];
  if (origin === undefined || origin === 'default') return false;
  const fallback = (schema.shape as Shape)[key]?.safeParse(undefined);
  const value = (resolved.values as Record<string, unknown>)[key];
  return !(fallback?.success === true && isDeepStrictEqual(fallback.data, value));
}

/** Settings whose text form (flag, environment) is not YAML: a spec string. */
const TEXT_FORMS: Readonly<Record<string, (text: string) => unknown>> = {
  discover: parseDiscoverySpec,
  objectives: parseObjectives,
  // host names separated by commas or spaces (vLLM's flag takes them separated by spaces); '' is none
  allowedMediaDomains: (text) => text.split(/[\s,]+/).filter((e) => e !== ''),
};

/** The settings' flags (each also read from its environment variable), --config and --worker. */
export function addSettingOptions(cmd: Command, shape: Shape, help: Readonly<Record<string, SettingHelp>>): void {
  cmd.addOption(
    new Option(
      '--config <file>',
      'router.yaml (or .json): any setting below by its flag name or in camelCase (the router options also under router:), and workers',
    ).env(envName('config')),
  );
  for (const [key, schema] of Object.entries(shape)) {
    const h = help[key];
    const flag = kebab(key);
    const fallback = (schema as z.ZodType & { def: { defaultValue?: unknown } }).def.defaultValue;
    const shown = fallback === undefined ? '' : ` (default: ${JSON.stringify(fallback)})`;
    const o = new Option(h.arg === '' ? `--${flag}` : `--${flag} ${h.arg}`, `${h.help}${shown}`).env(envName(flag));
    // commander checks each flag (and variable) as it reads it: bad values stop before anything
    // runs. Not a secret's: commander's message would repeat the value (resolveSettings checks it)
    if (h.arg !== '' && !h.secret) o.argParser((text: string) => checkedText(key, schema, text, `--${flag}`));
    cmd.addOption(o);
  }
  cmd.option(
    '--worker <spec>',
    'id=ID,url=URL[,events=ZMQ][,replay=ZMQ][,metrics=URL][,models=M1;M2][,cla=G1;G2][,dp-size=N][,dp-start-rank=S][,block-size=N][,api-key-env=VAR] (repeatable; env CONTEXTFORGE_WORKERS: specs separated by spaces)',
    (v: string, all: string[]) => [...all, v],
    [] as string[],
  );
}

/**
 * A switch's value as every source gives it, one set of spellings for all: `true` or `1` is on,
 * `false` or `0` is off (letters in any case), as the text of a flag or a variable, or a value
 * in the config file (a YAML boolean, the number 1 or 0, or the same text quoted). Anything else
 * is left as it is, for the schema to refuse it naming the setting.
 */
function switchValue(value: unknown): unknown {
  if (value === true || value === 1 || (typeof value === 'string' && /^(true|1)$/i.test(value))) return true;
  if (value === false || value === 0 || (typeof value === 'string' && /^(false|0)$/i.test(value))) return false;
  return value;
}

/** A flag's or variable's text as the value its schema checks (numbers, switches, YAML mappings and lists). */
function fromText(key: string, schema: z.ZodType, text: string, where: string): unknown {
  const special = TEXT_FORMS[key];
  if (special) {
    try {
      return special(text);
    } catch (err) {
      // the spec's own messages name the flag already
      const message = (err as Error).message;
      throw new RangeError(message.startsWith(`${where}`) ? message : `${where}: ${message}`, { cause: err });
    }
  }
  const type = unwrapSchema(schema).def.type;
  if (type === 'number') return DECIMAL.test(text) ? Number(text) : text;
  if (type === 'boolean') return switchValue(text);
  if (type === 'object' || type === 'record' || type === 'array') {
    let parsed: unknown;
    try {
      // bounded as the config file is: `[[[[…` a few thousand deep would overflow the parser's stack
      parsed = parseBoundedYaml(text, MAX_CONFIG_VALUES);
    } catch (err) {
      const message = (err as Error).message.split('\n')[0];
      if (err instanceof YamlBoundError) throw new RangeError(`${where}: ${message}`, { cause: err });
      const example = type === 'array' ? "'a,b' or '[a, b]'" : `'{"key": 1}'`;
      throw new RangeError(
        `${where} must be ${type === 'array' ? 'a list' : 'a mapping'} such as ${example}: ${message}`,
        { cause: err },
      );
    }
    if (type === 'array' && typeof parsed === 'string') return parsed.split(',').map((s) => s.trim());
    return parsed;
  }
  return text;
}

/** A flag's text as its checked value; InvalidArgumentError (commander's) names the flag. */
function checkedText(key: string, schema: z.ZodType, text: string, flag: string): unknown {
  try {
    const value = fromText(key, schema, text, flag);
    const parsed = schema.safeParse(value, { error: describeIssue });
    if (!parsed.success)
      throw new RangeError(settingMessage(firstIssue(parsed.error.issues), schema, flag, key, false));
    return value;
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
}

/** `--port must be <= 65535 (got 70000)`; nested keys and file values name the key path. */
function settingMessage(issue: z.core.$ZodIssue, schema: z.ZodType, where: string, path: string, inFile: boolean) {
  return issue.path.length === 0 && issue.code !== 'unrecognized_keys' && !inFile
    ? `${where} ${issue.message}`
    : `${where}: ${issueMessage(issue, schema, path)}`;
}

/** A key from the file as a message repeats it: cut after 64 characters. */
const shownKey = (key: string) => shownText(key, 64);

/** Largest config file read: thousands of workers fit well under it; /dev/zero or a stray log does not. */
export const MAX_CONFIG_BYTES = 4 * 1024 * 1024;

/**
 * A regular file's text, refused past `max` bytes without reading further. A pipe or device is
 * refused as --tokenizer refuses one (see readRegularFile): a FIFO with no writer would block
 * the open, or the read, forever. The file is opened non-blocking and checked through its
 * descriptor, so that neither the open nor the read waits.
 */
function readTextFile(file: string, max: number): string {
  const fd = openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    if (!fstatSync(fd).isFile()) throw new RangeError('is not a regular file');
    const chunks: Buffer[] = [];
    let total = 0;
    const buf = Buffer.alloc(64 * 1024);
    for (let n = readSync(fd, buf); n > 0; n = readSync(fd, buf)) {
      total += n;
      if (total > max) throw new RangeError(`larger than ${max} bytes`);
      chunks.push(Buffer.from(buf.subarray(0, n)));
    }
    const bytes = Buffer.concat(chunks);
    if (bytes.includes(0)) throw new RangeError('not a YAML or JSON text file (it holds NUL bytes)');
    return utf8Text(bytes);
  } finally {
    closeSync(fd);
  }
}

/**
 * UTF-8 bytes as text. YAML and JSON files are UTF-8: other bytes (a Latin-1 file) would be
 * read as U+FFFD and reach the settings changed, so they are refused, naming the first line.
 */
function utf8Text(bytes: Buffer): string {
  // the BOM is kept: the YAML parser takes it
  const strict = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
  try {
    return strict.decode(bytes);
  } catch {
    // a line end (0x0a) is never part of a multi-byte character: each line decodes alone
    let line = 1;
    for (let start = 0; start <= bytes.length; line++) {
      const end = bytes.indexOf(0x0a, start);
      const stop = end === -1 ? bytes.length : end;
      try {
        strict.decode(bytes.subarray(start, stop));
      } catch {
        break;
      }
      start = stop + 1;
    }
    throw new RangeError(`not UTF-8 text (line ${line})`);
  }
}

/**
 * Most values a config file holds: MAX_WORKERS (4,096) workers of a dozen settings each fit
 * several times over; past it the parser's objects alone would take hundreds of megabytes.
 */
export const MAX_CONFIG_VALUES = 250_000;

/** A YAML or JSON text's value; an unknown tag or a nesting the parser cannot follow is an error, not a warning. */
function parseConfigText(text: string): unknown {
  return parseBoundedYaml(text, MAX_CONFIG_VALUES);
}

/** How a config file shared by serve and epp is read by one of them. */
export interface SharedConfigOptions {
  /** The command reading it (serve or epp): hints name its --help. */
  command?: string;
  /** Receives the other command's keys found in the file, by the file's spelling: ignored, to be named in a warning. */
  ignored?: string[];
}

/** The other command's settings (serve's for epp, epp's for serve), by flag name and by camelCase name. */
function otherCommandKeys(shape: Shape, command: string): Map<string, string> {
  const other = command === 'epp' ? SERVE_SCHEMA : EPP_SCHEMA;
  const out = new Map<string, string>();
  for (const key of Object.keys(other.shape))
    if (!Object.hasOwn(shape, key)) {
      out.set(kebab(key), key);
      out.set(key, key);
    }
  return out;
}

/**
 * Reads router.yaml (YAML or JSON) into one value per setting, by the key the file used. One
 * file may serve both serve and epp: the other command's own keys are passed over (into `ignored`).
 * `where` names the file in messages (`--config FILE`, or the variable that gave it).
 */
export function readConfigFile(
  file: string,
  shape: Shape,
  where = `--config ${file}`,
  { command = 'serve', ignored = [] }: SharedConfigOptions = {},
): Map<string, { value: unknown; key: string }> {
  let raw: unknown;
  try {
    raw = parseConfigText(readTextFile(file, MAX_CONFIG_BYTES));
  } catch (err) {
    throw new RangeError(`${where}: ${fileErrorMessage(err, file)}`, { cause: err });
  }
  const out = new Map<string, { value: unknown; key: string }>();
  if (raw === null || raw === undefined) return out;
  if (typeof raw !== 'object' || Array.isArray(raw))
    throw new RangeError(`${where}: the top level must be a mapping of settings`);
  const byName = new Map<string, string>();
  for (const key of Object.keys(shape)) {
    byName.set(kebab(key), key);
    byName.set(key, key);
  }
  const routerKeys = new Set<string>(ROUTER_SETTING_KEYS);
  const otherKeys = otherCommandKeys(shape, command);
  const put = (setting: string, fileKey: string, value: unknown) => {
    // `key:` with nothing after it (or ~, null) is most often a value that went missing
    if (value === null) throw new RangeError(`${where}: ${fileKey} has no value (leave the key out for the default)`);
    const before = out.get(setting);
    if (before) throw new RangeError(`${where}: give ${before.key} or ${fileKey}, not both`);
    out.set(setting, { value, key: fileKey });
  };
  for (const [key, value] of Object.entries(raw as Record<string, unknown>)) {
    if (key === 'workers') {
      put('workers', key, value);
      continue;
    }
    if (key === 'router') {
      if (value === null || typeof value !== 'object' || Array.isArray(value))
        throw new RangeError(`${where}: router must be a mapping of KVAwareRouter options`);
      for (const [option, v] of Object.entries(value)) {
        if (!routerKeys.has(option) && option !== 'indexMode') {
          // a router option the command sets as a setting of its own (maxIdBytes, which also
          // bounds the ids of the HTTP API): named where it goes, not refused with a guess
          if (byName.get(option) === option)
            throw new RangeError(
              `${where}: router.${shownKey(option)} is not taken under router: give it as ${kebab(option)}, a setting of ${command}`,
            );
          const guess = closestKey(option, [...routerKeys, 'indexMode']);
          throw new RangeError(
            `${where}: router.${shownKey(option)} is not a router option${guess ? ` (did you mean ${guess}?)` : ''}`,
          );
        }
        put(option, `router.${option}`, v);
      }
      continue;
    }
    const setting = byName.get(key);
    if (setting === undefined) {
      if (otherKeys.has(key)) {
        ignored.push(key);
        continue;
      }
      const guess = closestKey(key, [...byName.keys(), 'workers', 'router']);
      throw new RangeError(
        `${where}: unknown key '${shownKey(key)}'${guess ? ` (did you mean ${guess}?)` : ` (see ${command} --help for the settings)`}`,
      );
    }
    put(setting, key, value);
  }
  return out;
}

/**
 * Resolves every setting of the schema from the parsed command (flags), the environment and
 * the config file, then checks the result as a whole. Workers: --worker flags if any, else
 * CONTEXTFORGE_WORKERS (specs separated by whitespace), else the config's `workers`.
 */
export function resolveSettings<S extends z.ZodObject>(
  cmd: Command,
  env: NodeJS.ProcessEnv,
  schema: S,
): ResolvedSettings<z.output<S>> {
  const shape = schema.shape as Shape;
  const flags = cmd.opts<Record<string, unknown>>();
  const configFile = flags.config as string | undefined;
  const configFlag = cmd.getOptionValueSource('config') === 'env' ? envName('config') : '--config';
  // an empty name (a variable set to nothing) is a file that went missing, not "no file"
  if (configFile === '') throw new RangeError(`${configFlag} must name a file (got '')`);
  const configWhere = `${configFlag} ${configFile === undefined ? '' : shownText(configFile)}`;
  const command = cmd.name();
  const ignored: string[] = [];
  const file = configFile
    ? readConfigFile(configFile, shape, configWhere, { command, ignored })
    : new Map<string, { value: unknown; key: string }>();
  const input: Record<string, unknown> = {};
  const origins: Record<string, Origin> = {};
  for (const [key, setting] of Object.entries(shape)) {
    const flag = kebab(key);
    let where: string;
    let path: string;
    let value: unknown;
    const fromFile = file.get(key);
    const source = cmd.getOptionValueSource(key);
    if (source === 'cli') {
      where = `--${flag}`;
      path = key;
      value = flags[key];
      origins[key] = 'flag';
    } else if (source === 'env') {
      // commander read the variable (a switch's value is its text: see switchValue)
      where = envName(flag);
      path = key;
      const given = flags[key];
      value = given === true ? fromText(key, setting, env[where] ?? process.env[where] ?? '', where) : given;
      origins[key] = 'env';
    } else if (fromFile !== undefined && fromFile.value !== null) {
      where = configWhere;
      path = fromFile.key;
      value =
        typeof fromFile.value === 'string' && TEXT_FORMS[key]
          ? fromText(key, setting, fromFile.value, `${where}: ${path}`)
          : unwrapSchema(setting).def.type === 'boolean'
            ? switchValue(fromFile.value)
            : fromFile.value;
      origins[key] = 'file';
    } else {
      const parsed = setting.safeParse(undefined);
      if (parsed.success && parsed.data !== undefined) origins[key] = 'default';
      continue;
    }
    // a secret's value is never repeated (the message may reach a log)
    const parsed = setting.safeParse(value, { error: secretSetting(key) ? describeIssueHidingValue : describeIssue });
    if (!parsed.success) {
      const issue = firstIssue(parsed.error.issues);
      const message = settingMessage(issue, setting, where, path, origins[key] === 'file');
      throw issue.code === 'invalid_type' ? new TypeError(message) : new RangeError(message);
    }
    input[key] = value;
  }
  const values = schema.parse(input, { error: describeIssue }) as z.output<S>;
  const { workers, origin: workersOrigin } = resolveWorkers(flags.worker as string[], env, file, configWhere);
  const warnings = unknownVariables(env, command);
  if (ignored.length > 0) {
    const other = command === 'epp' ? 'serve' : 'epp';
    const keys = ignored.map((k) => shownKey(k)).join(', ');
    warnings.unshift(
      `${configWhere}: ${keys} ${ignored.length === 1 ? 'is a setting' : 'are settings'} of ${other}, not of ${command}: ignored`,
    );
  }
  return { values, origins, workers, workersOrigin, configFile, warnings };
}

/**
 * CONTEXTFORGE_ variables that are no setting of serve or epp: such a variable is ignored, so
 * the setting it was meant for keeps its value, and that is worth a word, as an unknown flag or
 * config key is refused (a variable is only named: the environment may be shared with other
 * tools). epp's settings are known to serve and the other way round: one environment may serve both.
 */
function unknownVariables(env: NodeJS.ProcessEnv, command: string): string[] {
  const known = new Set(['CONTEXTFORGE_CONFIG', 'CONTEXTFORGE_WORKERS']);
  for (const schema of [SERVE_SCHEMA, EPP_SCHEMA])
    for (const key of Object.keys(schema.shape)) known.add(envName(kebab(key)));
  const out: string[] = [];
  for (const name of Object.keys(env)) {
    if (!name.startsWith('CONTEXTFORGE_') || known.has(name)) continue;
    const guess = closestKey(name, known);
    out.push(
      `${shownText(name, 64)} is not a setting and is ignored (${guess ? `did you mean ${guess}?` : `see ${command} --help for the settings`})`,
    );
  }
  return out;
}

/** A `--worker` SPEC as a worker record. */
export function parseWorkerSpec(spec: string, where = `--worker ${quotedText(spec)}`): WorkerRecord {
  const fields = specFields('--worker', spec, Object.keys(WORKER_SPEC_KEYS), where);
  return parseWorkerRecord(workerFields(fields), where);
}

/** Spec fields (or a config entry by spec names or record names) as record fields; `a;b` lists split. */
function workerFields(fields: Record<string, unknown>): Record<string, unknown> {
  // gathered as entries: assigning out['__proto__'] would set the prototype, and the key would
  // pass the schema's check of unknown keys unseen; as an own key it is refused by name
  const out: Array<[string, unknown]> = [];
  const specKeys: Record<string, string> = WORKER_SPEC_KEYS;
  for (const [key, value] of Object.entries(fields)) {
    const field = Object.hasOwn(specKeys, key) ? specKeys[key] : key;
    if (value === '' || value === undefined || value === null) continue;
    let v = value;
    if ((field === 'models' || field === 'claGroups') && typeof v === 'string') v = v.split(';').map((s) => s.trim());
    if (field === 'models' && typeof v === 'number') v = [String(v)];
    if (field === 'claGroups' && typeof v === 'number') v = [v];
    if (field === 'claGroups' && Array.isArray(v))
      v = v.map((g) => (typeof g === 'string' && /^-?\d+$/.test(g) ? Number(g) : g));
    // a negative number too, so that the message says what its range is, not that it is no integer
    if (
      (field === 'dpSize' || field === 'dpStartRank' || field === 'blockSize') &&
      typeof v === 'string' &&
      /^-?\d+$/.test(v)
    )
      v = Number(v);
    out.push([field, v]);
  }
  return Object.fromEntries(out);
}

function resolveWorkers(
  flagWorkers: string[],
  env: NodeJS.ProcessEnv,
  file: Map<string, { value: unknown; key: string }>,
  configWhere: string,
): { workers: WorkerRecord[]; origin: Origin } {
  let workers: WorkerRecord[];
  let origin: Origin;
  const envWorkers = env.CONTEXTFORGE_WORKERS?.trim();
  if (flagWorkers.length > 0) {
    workers = flagWorkers.map((s) => parseWorkerSpec(s));
    origin = 'flag';
  } else if (envWorkers) {
    workers = envWorkers.split(/\s+/).map((s) => parseWorkerSpec(s, `CONTEXTFORGE_WORKERS ${quotedText(s)}`));
    origin = 'env';
  } else {
    const list = file.get('workers')?.value ?? [];
    if (!Array.isArray(list)) throw new RangeError(`${configWhere}: workers must be a list`);
    origin = list.length > 0 ? 'file' : 'default';
    workers = list.map((w: unknown, i) => {
      const where = `${configWhere}: workers[${i}]`;
      if (typeof w === 'string') return parseWorkerSpec(w, `${where} ${quotedText(w)}`);
      if (w === null || typeof w !== 'object' || Array.isArray(w))
        throw new RangeError(`${where} must be a mapping or a SPEC string`);
      return parseWorkerRecord(workerFields(w as Record<string, unknown>), where);
    });
  }
  const source = { flag: '--worker', env: 'CONTEXTFORGE_WORKERS', file: `${configWhere}: workers`, default: '' }[
    origin
  ];
  const ids = new Set<string>();
  for (const w of workers) {
    if (ids.has(w.id)) throw new RangeError(`${source}: worker id '${w.id}' is given twice`);
    ids.add(w.id);
  }
  const routerWorkers = workers.reduce((n, w) => n + (w.dpSize ?? 1), 0);
  if (routerWorkers > MAX_WORKERS)
    throw new RangeError(
      `${source}: ${routerWorkers} workers (each data-parallel rank is one) are more than the ${MAX_WORKERS} a router holds`,
    );
  return { workers, origin };
}
