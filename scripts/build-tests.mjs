#!/usr/bin/env node
// npm test's compile step (scripts/test.sh runs it): every .ts file of src/, test/, bench/,
// scripts/ and examples/ compiled once by esbuild to plain ESM JavaScript in .test-build/, same
// layout, each with an inline source map (node --enable-source-maps: a stack names the .ts file
// and line). The test files then run on node alone: without it, each test file's process loads
// tsx and compiles its TypeScript again on the fly. A fresh compile every run, nothing reused.
//
// Where the compiled files look for things relative to themselves:
//   - a test file's import.meta.url (filename, dirname) is its source file's: the fixtures, the
//     repository's files and the .ts sources it spawns are found where they are, as when the
//     test file runs on its own (node --import tsx --test FILE);
//   - the code's own is the compiled file's (a worker thread is started from the compiled file
//     next to it), and every other top-level entry of the repository (package.json, proto/,
//     dist/, docs/, ...) is linked into .test-build/, so a path such as '../../proto/' from
//     src/epp/ finds what it finds from the source.
import { mkdirSync, readdirSync, rmSync, symlinkSync, writeFileSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { transform } from 'esbuild';

const root = fileURLToPath(new URL('..', import.meta.url));
const OUT = '.test-build';
const COMPILED = ['src', 'test', 'bench', 'scripts', 'examples'];
/** Top-level entries not linked into the build folder: the compiled folders, installed or git's own. */
const NOT_LINKED = new Set([...COMPILED, OUT, '.git', 'node_modules']);

const started = performance.now();
const out = join(root, OUT);
rmSync(out, { recursive: true, force: true });
mkdirSync(out);

const tsconfigRaw = readFileSync(join(root, 'tsconfig.json'), 'utf8');
const sources = COMPILED.flatMap((dir) =>
  readdirSync(join(root, dir), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => join(dir, f)),
);

await Promise.all(
  sources.map(async (file) => {
    const source = join(root, file);
    const target = join(out, file.replace(/\.ts$/, '.js'));
    const define = file.startsWith('test/')
      ? {
          'import.meta.url': JSON.stringify(pathToFileURL(source).href),
          'import.meta.filename': JSON.stringify(source),
          'import.meta.dirname': JSON.stringify(dirname(source)),
        }
      : {};
    const { code } = await transform(readFileSync(source, 'utf8'), {
      loader: 'ts',
      format: 'esm',
      platform: 'node',
      target: 'node20',
      tsconfigRaw,
      define,
      sourcemap: 'inline',
      sourcefile: relative(dirname(target), source),
    });
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, code);
  }),
);

for (const entry of readdirSync(root)) {
  if (!NOT_LINKED.has(entry)) symlinkSync(join('..', entry), join(out, entry));
}

const ms = Math.round(performance.now() - started);
console.log(`# ${OUT}/: ${sources.length} files compiled in ${ms} ms`);
