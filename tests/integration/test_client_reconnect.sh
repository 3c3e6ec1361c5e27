#!/usr/bin/env bash
# The daemon killed (SIGKILL) mid-replay: the replay finishes every iteration
# with its last plan and zero integrity mismatches, and reconnects when the
# daemon is back (on the same socket and database), where its model signature
# gets it the stored plan without measuring again.
set -uo pipefail
. "$(dirname "$0")/daemon.bash"

wait_lines() { # pattern count timeout_s
  for _ in $(seq $(($3 * 10))); do
    [ "$(grep -c "$1" "$tmp/out" 2>/dev/null)" -ge "$2" ] && return 0
    kill -0 "$rpid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

start_daemon
n=12
"$bin/capuchin-replay" --trace "$src/tests/data/traces/resnet50.trace" \
  --budget 50% --iterations $n --socket "$tmp/d.sock" --time-scale 10 \
  >"$tmp/out" 2>"$tmp/err" &
rpid=$!
stop_also "$rpid"
wait_lines ' guided ' 1 300; check "guided before the kill" $?
kill -9 "$dpid"; wait "$dpid" 2>/dev/null; dpid=
guided_before=$(grep -c ' guided ' "$tmp/out")
wait_lines ' guided ' $((guided_before + 2)) 300
check "guided iterations go on without the daemon" $?
start_daemon
wait "$rpid"; rc=$?; rpid=
check "replay exits 0" $rc
cat "$tmp/out" "$tmp/err"
[ "$(grep -cE '^ +[0-9]+ (measured|guided|passive) ' "$tmp/out")" -eq $n ]
check "all $n iterations ran" $?
! awk '$1 ~ /^[0-9]+$/ && $10 != 0 { bad = 1 } END { exit !bad }' "$tmp/out"
check "zero integrity mismatches" $?
# After the kill every iteration stays guided (last plan kept).
last_mode=$(awk '$1 ~ /^[0-9]+$/ { m = $2 } END { print m }' "$tmp/out")
[ "$last_mode" = guided ]; check "last iteration guided ($last_mode)" $?
grep -qE '[1-9][0-9]* reconnects' "$tmp/err"; check "reconnected to the restarted daemon" $?
# The Hello after the restart carries the model signature: the daemon
# recognises the job and hands back its stored plan without a measurement.
grep -q 'stored plan reused' "$tmp/d.log"; check "restarted daemon reused the stored plan" $?
[ $fail -eq 0 ] || tail -n 30 "$tmp/d.log"
exit $fail
