#!/usr/bin/env bash
# npm test: every test/**/*.test.ts, compiled first to plain JavaScript in .test-build/
# (scripts/build-tests.mjs), so each test file's process runs on node alone rather than loading
# tsx and compiling its TypeScript again; a failure's stack still names the .ts file and line
# (inline source maps, --enable-source-maps). Three files run at a time (a test file spends most
# of its time waiting on sockets, timers and child processes, not on the two cores), but the files
# that measure how replicas share state over Redis in real time (test/state, the Redis fault
# tests, the endpoint picker's replicas) run one at a time after the rest: what they check is how
# far the replicas' views lag, and another file's CPU on this machine's cores would be part of it.
set -euo pipefail
cd "$(dirname "$0")/.."
shared_state() { find test/state -name '*.test.ts'; find test/faults -name 'redis-*.test.ts'; echo test/epp/replicas.test.ts; }
mapfile -t serial < <(shared_state | sort)
mapfile -t rest < <(find test -name '*.test.ts' | sort | grep -vxF -f <(printf '%s\n' "${serial[@]}"))

# TAP goes to standard output as before; each pass also writes the spec reporter's text to a file,
# whose closing "failing tests" section is printed again at the very end: a long run's log is
# often read from its tail, and a failure in the first pass would otherwise be far above it
# `npm test` has just built the package (its pretest script): the tests spawn the built CLI, which
# starts in under half the time of the sources compiled on the fly (test/helpers/cli-entry.ts)
if [ "${npm_lifecycle_event:-}" = test ]; then export CFR_TEST_BUILT_CLI=1; fi

reports=$(mktemp -d)
redis_pid=
trap 'rm -rf "$reports"; if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi' EXIT

# The scale-out tests need a Redis: the one CONTEXTFORGE_TEST_REDIS names, else the machine's on
# 127.0.0.1:6379, else one started here for this run on a free port (redis-server installed)
redis_answers() { # host port
  (exec 3<>"/dev/tcp/$1/$2" && printf 'PING\r\n' >&3 && IFS= read -r -t 2 reply <&3 && [[ $reply == +PONG* ]]) 2>/dev/null
}
if [ -z "${CONTEXTFORGE_TEST_REDIS:-}" ] && ! redis_answers 127.0.0.1 6379; then
  if ! command -v redis-server >/dev/null; then
    echo "npm test: the scale-out tests need Redis: nothing answers on 127.0.0.1:6379 and redis-server is not installed (apt-get install redis-server, or set CONTEXTFORGE_TEST_REDIS=redis://host:port)" >&2
    exit 1
  fi
  port=$(node -e "const s=require('node:net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$reports/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 100); do redis_answers 127.0.0.1 "$port" && break; sleep 0.1; done
  redis_answers 127.0.0.1 "$port" || { echo "npm test: redis-server did not start on 127.0.0.1:$port:" >&2; cat "$reports/redis.log" >&2; exit 1; }
  export CONTEXTFORGE_TEST_REDIS="redis://127.0.0.1:$port"
  echo "# npm test: Redis for the scale-out tests started on 127.0.0.1:$port"
fi
node scripts/build-tests.mjs
# a pass runs the compiled test files: test/a/b.test.ts is .test-build/test/a/b.test.js
pass() {
  local name=$1 concurrency=$2
  shift 2
  local files=("${@/%.ts/.js}")
  node --enable-source-maps --test --test-concurrency="$concurrency" --test-timeout=240000 \
    --test-reporter=tap --test-reporter-destination=stdout \
    --test-reporter=spec --test-reporter-destination="$reports/$name.txt" "${files[@]/#/.test-build/}"
}

# both passes run whatever the first one's outcome; either failing fails the run
status=0
pass rest 3 "${rest[@]}" || status=$?
pass shared-state 1 "${serial[@]}" || status=$?
if [ "$status" -ne 0 ]; then
  for name in rest shared-state; do
    [ -f "$reports/$name.txt" ] || continue
    grep -q 'failing tests:' "$reports/$name.txt" || continue
    printf '\n# npm test: what failed in the %s pass\n' "$name"
    sed -n '/failing tests:/,$p' "$reports/$name.txt"
  done
fi
exit "$status"
