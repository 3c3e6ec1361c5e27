#!/usr/bin/env bash
# End to end, placement against the allocator's headroom: a real capuchind
# and capuchin-replay (sim backend) on resnet50 and bert_large at 50 %, RUNS
# runs each way, every run measuring its own first iteration. Prints per
# model and way: the median and 90th percentile of the guided iterations,
# the median prediction, the median of each iteration's time over its own
# plan's prediction, guided iterations within the budget, iterations
# with a synchronous eviction for want of a hole (lru_evictions > 0),
# placement misses, and integrity mismatches + op errors.
#
#   tests/bench/bench_placement_e2e.sh [BUILD_DIR]   (RUNS=5 SCALE=40 MODELS=...
#                                                    WAYS="placement headroom"
#                                                    ROWS_DIR=D keeps every
#                                                    iteration's JSON line and
#                                                    the replays' stderr)
# Time scale 40 by default: the sim backend moves every swapped byte with
# memcpy, and at 10 the copies of resnet50 or bert_base at 50 % ask more of a
# 2-core machine than it keeps pace with (README, Placement).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$src/build}/bin
runs=${RUNS:-5}
scale=${SCALE:-40}
models=${MODELS:-resnet50 bert_large}
ways=${WAYS:-placement headroom}
tmp=$(mktemp -d)
trap 'kill $dpid 2>/dev/null; rm -rf "$tmp"' EXIT
dpid=

start_daemon() { # capuchind options
  kill $dpid 2>/dev/null
  wait $dpid 2>/dev/null
  rm -f "$tmp/d.sock" "$tmp/d.db"*
  "$bin/capuchind" --socket "$tmp/d.sock" --db "$tmp/d.db" "$@" 2>>"$tmp/d.log" &
  dpid=$!
  for _ in $(seq 100); do [ -S "$tmp/d.sock" ] && return; sleep 0.1; done
  echo "capuchind did not start"; cat "$tmp/d.log"; exit 1
}

printf '%-11s %-14s %5s %9s %9s %9s %8s %12s %10s %7s %6s\n' model way runs \
  "median ms" "p90 ms" "pred ms" "vs pred" "in budget" "sync-evict" misses bad
# The two ways alternate run by run, so that a machine whose load changes
# while the bench runs weighs on both alike.
for model in $models; do
  for way in $ways; do
    : >"$tmp/rows-$way"
    : >"$tmp/err-$way"
  done
  for r in $(seq "$runs"); do
    for way in $ways; do
      if [ $way = placement ]; then
        start_daemon --placement yes --alloc-headroom 0
      else
        start_daemon --placement no --alloc-headroom 6
      fi
      "$bin/capuchin-replay" --trace "$src/tests/data/traces/$model.trace" \
        --budget 50% --iterations 6 --socket "$tmp/d.sock" --time-scale "$scale" \
        --json --job "bench-$model-$r" 2>>"$tmp/err-$way" | grep '"iteration"' >>"$tmp/rows-$way"
    done
  done
  [ -n "${ROWS_DIR:-}" ] && for way in $ways; do
    cp "$tmp/rows-$way" "$ROWS_DIR/$model-$way.jsonl"
    cp "$tmp/err-$way" "$ROWS_DIR/$model-$way.err"
  done
  for way in $ways; do
    /usr/bin/python3 - "$tmp/rows-$way" "$model" "$way" "$runs" <<'EOF2'
import json, sys, statistics
rows = [json.loads(l.strip().lstrip('[,').rstrip(',]')) for l in open(sys.argv[1]) if l.strip()]
g = [r for r in rows if r["mode"] == "guided"]
bad = sum(r["mismatches"] + r["errors"] for r in rows)
if not g:
    print(f"{sys.argv[2]:<11} {sys.argv[3]:<14} {sys.argv[4]:>5} no guided iteration; bad {bad}")
    sys.exit(0)
t = sorted(r["time_ns"] / 1e6 for r in g)
p90 = t[min(len(t) - 1, int(0.9 * len(t)))]
pred = statistics.median(r["predicted_ns"] / 1e6 for r in g)
inb = sum(r["peak_bytes"] <= r["budget_bytes"] for r in g)
sync = sum(r["lru_evictions"] > 0 for r in g)
miss = sum(r.get("placement_misses", 0) for r in g)
# Each run plans from its own measured iteration: compare each iteration
# with its own plan's prediction.
vs = statistics.median(r["time_ns"] / r["predicted_ns"] for r in g if r["predicted_ns"])
print(f"{sys.argv[2]:<11} {sys.argv[3]:<14} {sys.argv[4]:>5} {statistics.median(t):9.2f} "
      f"{p90:9.2f} {pred:9.2f} {vs:8.3f} {inb:>5}/{len(g):<6} {sync:>10} {miss:>7} {bad:>6}")
EOF2
  done
done
