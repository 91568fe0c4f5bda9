/**
 * Preloaded (`--import`) into a CLI process by a test: on exit, writes the packages the process
 * loaded (by their node_modules directory) to the file LOADED_PACKAGES_FILE names, one per line.
 */
import { writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const file = process.env.LOADED_PACKAGES_FILE;
const require = createRequire(import.meta.url);

if (file)
  process.on('exit', () => {
    const packages = new Set<string>();
    for (const path of Object.keys(require.cache)) {
      const name = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(path)?.[1];
      if (name) packages.add(name);
    }
    writeFileSync(file, [...packages].sort().join('\n'));
  });
