import { InvalidArgumentError } from 'commander';

/** A commander parser for an integer flag with a lower bound; bad values exit with a message naming the flag. */
export function intOption(flag: string, min: number): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (!/^-?\d+$/.test(value.trim()) || !Number.isSafeInteger(n)) {
      throw new InvalidArgumentError(`${flag} must be an integer, got '${value}'`);
    }
    if (n < min) throw new InvalidArgumentError(`${flag} must be >= ${min}, got ${n}`);
    return n;
  };
}

/** A commander parser for a positive number flag. */
export function positiveNumberOption(flag: string): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || n <= 0)
      throw new InvalidArgumentError(`${flag} must be a positive number, got '${value}'`);
    return n;
  };
}

/** A commander parser for a number flag in [0, 1]. */
export function fractionOption(flag: string): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n) || n < 0 || n > 1)
      throw new InvalidArgumentError(`${flag} must be a number from 0 to 1, got '${value}'`);
    return n;
  };
}

/**
 * The fields of a `key=value,key=value` spec (the value of --worker or --discover): a part
 * without `=`, an unknown key or a key given twice is refused with a message naming the flag and the key.
 */
export function specFields(flag: string, spec: string, keys: readonly string[]): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const part of spec.split(',')) {
    const eq = part.indexOf('=');
    if (eq <= 0) throw new RangeError(`${flag} '${spec}': '${part}' is not key=value`);
    const key = part.slice(0, eq).trim();
    if (!keys.includes(key))
      throw new RangeError(`${flag} '${spec}': unknown key '${key}' (known: ${keys.join(', ')})`);
    if (Object.hasOwn(fields, key)) throw new RangeError(`${flag} '${spec}': '${key}' is given twice`);
    fields[key] = part.slice(eq + 1).trim();
  }
  return fields;
}
