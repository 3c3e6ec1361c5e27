#!/usr/bin/env bash
# Placement end to end (sim backend): capuchin-sim plans with placement
# (--placement) and the client replays that plan (--plan): every guided
# iteration puts its tensors at their planned addresses with no block found
# taken, zero integrity mismatches (two tensors sharing bytes would corrupt
# one of them), zero op errors, the peak within the budget, and no
# synchronous eviction for want of a hole. resnet50 at 50 %, and bert_large
# at 50 % with persistent eviction (weights whose two stays are tied across
# the iteration's boundary).
set -uo pipefail
. "$(dirname "$0")/daemon.bash"

placed_replay() { # model extra-sim-flags...
  local model=$1
  shift
  local plan="$tmp/$model.plan.json" out="$tmp/$model.json"
  "$bin/capuchin-sim" --trace "$src/tests/data/traces/$model.trace" --budget 50% \
    --placement "$@" --emit-plan "$plan" >"$tmp/$model.sim" 2>&1
  check "$model: capuchin-sim plans with placement" $?
  grep -q '"placement"' "$plan"; check "$model: the plan carries its blocks" $?
  "$bin/capuchin-sim" --trace "$src/tests/data/traces/$model.trace" \
    --check-plan "$plan" >/dev/null 2>"$tmp/$model.check"
  check "$model: --check-plan accepts it" $?
  "$bin/capuchin-replay" --trace "$src/tests/data/traces/$model.trace" \
    --budget 50% --no-daemon --plan "$plan" --iterations 4 \
    --time-scale "${CAP_TEST_TIME_SCALE:-20}" --json >"$out" 2>"$tmp/$model.err"
  check "$model: replay exits 0" $?
  local lines l guided=0 placed=0 bad=0
  mapfile -t lines < <(grep '"iteration"' "$out")
  for l in "${lines[@]}"; do
    bad=$((bad + $(field "$l" mismatches) + $(field "$l" errors)))
    [ "$(field "$l" mode)" = guided ] || continue
    guided=$((guided + 1))
    placed=$((placed + $(field "$l" placed_allocs)))
    local it peak budget misses lru
    it=$(field "$l" iteration); peak=$(field "$l" peak_bytes)
    budget=$(field "$l" budget_bytes); misses=$(field "$l" placement_misses)
    lru=$(field "$l" lru_evictions)
    [ "$misses" -eq 0 ]; check "$model: iteration $it: no block found taken ($misses)" $?
    [ "$peak" -le "$budget" ]; check "$model: iteration $it: peak $peak <= budget $budget" $?
    # The first guided iteration brings back what was moved to make the
    # region; from the next on nothing is evicted for want of a hole.
    [ "$it" -le 2 ] || [ "$lru" -eq 0 ]
    check "$model: iteration $it: no eviction on demand ($lru)" $?
  done
  [ "$guided" -ge 3 ]; check "$model: guided from iteration 2 ($guided of ${#lines[@]})" $?
  [ "$placed" -gt 0 ]; check "$model: tensors placed at their addresses ($placed)" $?
  [ "$bad" -eq 0 ]; check "$model: zero integrity mismatches and op errors" $?
  grep -q "placement refused" "$out"; [ $? -ne 0 ]
  check "$model: the placement was not refused" $?
}

placed_replay resnet50
placed_replay bert_large --evict-persistent
exit $fail
