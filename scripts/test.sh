#!/usr/bin/env bash
# npm test: every test/**/*.test.ts. Two files run at a time, but the files that measure how
# replicas share state over Redis in real time (test/state, the Redis fault tests, the endpoint
# picker's replicas) run one at a time after the rest: what they check is how far the replicas'
# views lag, and a second file's CPU on this machine's cores would be part of that lag.
set -euo pipefail
cd "$(dirname "$0")/.."
shared_state() { find test/state -name '*.test.ts'; find test/faults -name 'redis-*.test.ts'; echo test/epp/replicas.test.ts; }
mapfile -t serial < <(shared_state | sort)
mapfile -t rest < <(find test -name '*.test.ts' | sort | grep -vxF -f <(printf '%s\n' "${serial[@]}"))
# both passes run whatever the first one's outcome; either failing fails the run
status=0
node --import tsx --test --test-concurrency=2 --test-timeout=240000 "${rest[@]}" || status=$?
node --import tsx --test --test-concurrency=1 --test-timeout=240000 "${serial[@]}" || status=$?
exit "$status"
