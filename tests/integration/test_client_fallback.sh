#!/usr/bin/env bash
# An action that cannot be carried out (here: the recompute callback fails
# once, --fail-recompute) fails its op (and any later op of that iteration
# that reads the lost tensor) with a message naming the op, the tensor and
# the reason; the replay's table shows it; the client swaps that
# tensor instead for the rest of the job and tells the daemon, which stores
# the error with the iteration (capuchin-query iterations) and pushes a
# plan version that swaps it.
set -uo pipefail
. "$(dirname "$0")/daemon.bash"
start_daemon

"$bin/capuchin-replay" --trace "$src/tests/data/traces/resnet50.trace" \
  --budget 40% --iterations 5 --socket "$tmp/d.sock" \
  --time-scale "${CAP_TEST_TIME_SCALE:-20}" \
  --fail-recompute 3 --job fallback >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[ $rc -eq 1 ]; check "the replay counts the failed op (exit $rc)" $?
grep -Eq '^     first error: op [0-9]+: .*recompute of tensor [0-9]+: the callback failed on op [0-9]+ aten\.' "$tmp/out"
check "the iteration table names the op, the tensor and the reason" $?
[ "$(grep -c '(errors)' "$tmp/out")" -eq 1 ]; check "one iteration had an error" $?
grep -Eq ' [1-9][0-9]* fallbacks' "$tmp/out"; check "the action fell back" $?
# Every op that reads the tensor the failed list lost fails too (one that
# lists it on both sides, as detach does, included); none reads wrong bytes.
grep -q ': 0 integrity mismatches' "$tmp/out"; check "no integrity mismatches" $?

# The daemon was told, kept the error with the iteration, and swapped it.
for _ in $(seq 50); do grep -q 'swapped instead' "$tmp/d.log" && break; sleep 0.1; done
grep -q 'plan actions could not be carried out and are swapped instead' "$tmp/d.log"
check "the daemon heard of the failed action" $?
# The daemon writes iteration rows through its store queue: wait for them.
for _ in $(seq 100); do
  "$bin/capuchin-query" --db "$tmp/d.db" --format json iterations 1 >"$tmp/it.json" 2>/dev/null
  [ "$(grep -c '"iteration"' "$tmp/it.json")" -ge 5 ] && break
  sleep 0.1
done
grep -Eq '"op_errors": [1-9][0-9]*, "error": "op [0-9]+ .*the callback failed' "$tmp/it.json"
check "capuchin-query iterations shows the error" $?
[ "$(grep -Ec '"op_errors": [1-9]' "$tmp/it.json")" -eq 1 ]; check "exactly one iteration stored errors" $?
sed -n '/swapped instead/,$p' "$tmp/d.log" | grep -q 'v[0-9]* pushed'
check "a plan version was pushed after the report" $?
grep -q 'guided' <<<"$(tail -n 4 "$tmp/out")"; check "the job stays guided" $?

[ $fail -eq 0 ] || { echo "--- daemon log"; tail -n 20 "$tmp/d.log"; }
exit $fail
