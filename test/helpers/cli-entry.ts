import { fileURLToPath } from 'node:url';

/**
 * How a test starts the CLI. `npm test` builds the package first (its pretest script) and
 * scripts/test.sh sets CFR_TEST_BUILT_CLI=1: the tests then spawn the built CLI, the
 * one the package's users run, which starts in under half the time of the sources compiled on
 * the fly. A test file run on its own spawns the sources through tsx, so it needs no build. (The
 * variable is outside the CONTEXTFORGE_ prefix: serve warns of every CONTEXTFORGE_ variable it
 * does not know.)
 */
const built = process.env.CFR_TEST_BUILT_CLI === '1';

/** The CLI's entry file. */
const CLI_MAIN = fileURLToPath(new URL(built ? '../../dist/cli/main.js' : '../../src/cli/main.ts', import.meta.url));

/** Node's flags the entry file needs. */
const CLI_FLAGS: readonly string[] = built ? [] : ['--import', 'tsx'];

/** Node's arguments that start the CLI; the command and its flags follow. */
export const CLI: readonly string[] = [...CLI_FLAGS, CLI_MAIN];
