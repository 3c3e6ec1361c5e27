#!/usr/bin/env bash
# Conformance matrix: every bundled trace at every budget, replayed end to
# end through a real capuchind on the sim backend. A plan the daemon sends
# must execute: each cell exits 0 with every guided iteration within the
# budget, zero op errors and zero integrity mismatches, or exits 2 naming
# the smallest feasible budget (nothing can fit). Timing is not checked
# here (test_client_replay.sh does): the clock runs fast and the work is
# the copies and the integrity checks.
#   CAP_CONFORMANCE_BUDGETS  budgets in % (default "80 60 50 40 30")
#   CAP_CONFORMANCE_TRACES   trace names (default: every bundled trace)
#   CAP_CONFORMANCE_SCALE    replay clock scale (default 0.1)
set -uo pipefail
. "$(dirname "$0")/daemon.bash"
budgets=${CAP_CONFORMANCE_BUDGETS:-80 60 50 40 30}
scale=${CAP_CONFORMANCE_SCALE:-0.1}
if [ -n "${CAP_CONFORMANCE_TRACES:-}" ]; then
  traces=$CAP_CONFORMANCE_TRACES
else
  traces=$(cd "$src/tests/data/traces" && ls *.trace | sed 's/\.trace$//')
fi
start_daemon

table="trace"
for b in $budgets; do table="$table | $b %"; done
table="$table"$'\n'
for t in $traces; do
  row="$t"
  for b in $budgets; do
    out="$tmp/$t-$b.json" err="$tmp/$t-$b.err"
    "$bin/capuchin-replay" --trace "$src/tests/data/traces/$t.trace" \
      --budget "$b%" --iterations 3 --socket "$tmp/d.sock" \
      --time-scale "$scale" --json --job "conf-$t-$b" >"$out" 2>"$err"
    rc=$?
    cell=ok why=
    if [ $rc -eq 2 ]; then
      if grep -qi "smallest feasible" "$out" "$err"; then
        cell=infeasible
      else
        cell=FAIL why="exit 2 without the smallest feasible budget"
      fi
    elif [ $rc -ne 0 ]; then
      cell=FAIL why="exit $rc"
    fi
    if [ $rc -eq 0 ] || [ "$cell" = FAIL ]; then
      mapfile -t lines < <(grep '"iteration"' "$out")
      [ ${#lines[@]} -eq 3 ] || { cell=FAIL; why="${why:+$why; }${#lines[@]} of 3 iterations"; }
      guided=0
      for l in "${lines[@]}"; do
        e=$(field "$l" errors) m=$(field "$l" mismatches)
        if [ "${e:-1}" -ne 0 ] || [ "${m:-1}" -ne 0 ]; then
          cell=FAIL
          why="${why:+$why; }iteration $(field "$l" iteration): $e op errors, $m mismatches: $(field "$l" first_error)"
        fi
        [ "$(field "$l" mode)" = guided ] || continue
        guided=$((guided + 1))
        peak=$(field "$l" peak_bytes) budget=$(field "$l" budget_bytes)
        if [ "$peak" -gt "$budget" ]; then
          cell=FAIL why="${why:+$why; }guided peak $peak over the budget $budget"
        fi
      done
      if [ "$cell" = ok ] && [ $guided -eq 0 ]; then
        cell=FAIL why="no guided iteration"
      fi
    fi
    if [ "$cell" = FAIL ]; then
      fail=1
      echo "FAIL: $t at $b %: $why"
      tail -n 3 "$err" | sed 's/^/    /'
    fi
    row="$row | $cell"
  done
  table="$table$row"$'\n'
done
printf '%s' "$table"
[ $fail -eq 0 ] || { echo "--- daemon log"; tail -n 20 "$tmp/d.log"; }
exit $fail
