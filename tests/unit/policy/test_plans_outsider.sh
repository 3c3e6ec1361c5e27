#!/usr/bin/env bash
# The planners' plans pass an outsider's check: for every bundled trace and
# the budgets 80 60 50 40 30 %, capuchin-sim --emit-plan writes capuchin's
# plan (retried with --evict-persistent when nothing fits; when even that
# does not fit, capuchin-sim must name the smallest feasible peak, and the
# plan it still wrote is checked all the same), and at 50 % each other
# planner's plan; tests/tools/check_plan.py, a second implementation of
# docs/plan-semantics.md that shares no code with policy/, must find every
# action valid. Prints the matrix (trace x budget/policy).
#
# Environment (set by ctest): CAP_BIN_DIR (capuchin-sim), CAP_SOURCE_DIR;
# CAP_OUTSIDER_BUDGETS (default "80 60 50 40 30"; deploy/test.sh may plan
# fewer in its sanitized pass).
set -u
SRC=${CAP_SOURCE_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)}
BIN=${CAP_BIN_DIR:-$SRC/build/bin}
SIM=$BIN/capuchin-sim
CHECK=$SRC/tests/tools/check_plan.py
if [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3
elif command -v python3 >/dev/null 2>&1; then PY=python3
else echo "SKIP: no python3"; exit 77; fi
[ -x "$SIM" ] || { echo "FAIL: $SIM not built"; exit 1; }

BUDGETS=${CAP_OUTSIDER_BUDGETS:-80 60 50 40 30}
POLICIES="swap-all vdnn checkpoint-sqrt dtr passive-lru"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cap_outsider.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
fails=0
declare -A CELL
LOG=$TMP/failures.txt
: >"$LOG"

# check TRACE PLAN LABEL -> sets RES ("N/M": invalid/actions) ; logs faults
check() {
  local out rc last
  out=$("$PY" "$CHECK" "$1" "$2" 2>&1)
  rc=$?
  last=$(tail -n1 <<<"$out")
  if [[ $last =~ ^([0-9]+)\ actions,\ ([0-9]+)\ invalid$ ]]; then
    RES="${BASH_REMATCH[2]}/${BASH_REMATCH[1]}"
  else
    RES="error"
  fi
  if [ $rc -ne 0 ] || [ "$RES" = error ]; then
    fails=$((fails + 1))
    { echo "== $3: check_plan.py exit $rc"; grep -v '^info:' <<<"$out"; } >>"$LOG"
  fi
}

# sim ARGS... -> SIMRC, SIMERR
sim() {
  "$SIM" "$@" >"$TMP/sim.out" 2>"$TMP/sim.err"
  SIMRC=$?
  SIMERR=$(cat "$TMP/sim.err")
}

traces=("$SRC"/tests/data/traces/*.trace)
[ -e "${traces[0]}" ] || { echo "FAIL: no traces"; exit 1; }
for t in "${traces[@]}"; do
  name=$(basename "$t" .trace)
  for b in $BUDGETS; do
    f=$TMP/$name-$b.json
    rm -f "$f"
    tag=""
    sim --trace "$t" --budget "$b%" --emit-plan "$f"
    if [ $SIMRC -eq 2 ]; then
      rm -f "$f"
      tag="EP "
      sim --trace "$t" --budget "$b%" \
        --evict-persistent --emit-plan "$f"
      if [ $SIMRC -eq 2 ]; then
        tag="inf "
        if ! grep -Eq 'smallest feasible peak found is [0-9]+ bytes' <<<"$SIMERR"; then
          fails=$((fails + 1))
          echo "== $name $b%: exit 2 without the smallest feasible peak: $SIMERR" >>"$LOG"
        fi
      fi
    fi
    if [ $SIMRC -ne 0 ] && [ $SIMRC -ne 2 ]; then
      CELL[$name,$b]="sim-rc$SIMRC"
      fails=$((fails + 1))
      echo "== $name $b%: capuchin-sim exit $SIMRC: $SIMERR" >>"$LOG"
      continue
    fi
    if [ ! -s "$f" ]; then
      CELL[$name,$b]="${tag}no-plan"
      [ "$tag" = "inf " ] && continue
      fails=$((fails + 1))
      echo "== $name $b%: capuchin-sim wrote no plan" >>"$LOG"
      continue
    fi
    check "$t" "$f" "$name $b% capuchin${tag:+ ($tag)}"
    CELL[$name,$b]="$tag$RES"
  done
  for p in $POLICIES; do
    f=$TMP/$name-$p.json
    rm -f "$f"
    sim --trace "$t" --budget 50% --policy "$p" --emit-plan "$f"
    if { [ $SIMRC -ne 0 ] && [ $SIMRC -ne 2 ]; } || [ ! -s "$f" ]; then
      CELL[$name,$p]="sim-rc$SIMRC"
      fails=$((fails + 1))
      echo "== $name 50% $p: capuchin-sim exit $SIMRC, plan written: $([ -s "$f" ] && echo yes || echo no): $SIMERR" >>"$LOG"
      continue
    fi
    if ! grep -q "\"policy\":\"$p\"" "$f"; then
      CELL[$name,$p]="wrong-plan"
      fails=$((fails + 1))
      echo "== $name 50% $p: the emitted plan is not $p's" >>"$LOG"
      continue
    fi
    check "$t" "$f" "$name 50% $p"
    CELL[$name,$p]="$RES"
  done
done

echo "outsider plan check: invalid/actions per plan (capuchin at each budget;"
echo "EP = planned with --evict-persistent, inf = no plan fits even then;"
echo "the other planners at 50 %)"
printf '%-13s' trace
for b in $BUDGETS; do printf ' %10s' "$b%"; done
for p in $POLICIES; do printf ' %15s' "$p"; done
echo
for t in "${traces[@]}"; do
  name=$(basename "$t" .trace)
  printf '%-13s' "$name"
  for b in $BUDGETS; do printf ' %10s' "${CELL[$name,$b]:-?}"; done
  for p in $POLICIES; do printf ' %15s' "${CELL[$name,$p]:-?}"; done
  echo
done

if [ $fails -ne 0 ]; then
  echo
  echo "$fails failure(s):"
  cat "$LOG"
  exit 1
fi
echo "every plan valid"
