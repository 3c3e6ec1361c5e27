#!/usr/bin/env bash
# The main job, end to end on one machine:
#   install what is missing, build, start capuchind on a temporary socket and
#   database, replay the bundled resnet50 trace through libcapuchin-client at
#   50 % of its activation memory for 6 iterations (sim backend; cuda when a
#   GPU is present), print the iteration table, then what the daemon stored:
#   `capuchin-query plans` and the plan's top actions. Everything temporary
#   is removed on exit, whatever happens.
#
# Environment: CAP_DEMO_TRACE (default tests/data/traces/resnet50.trace),
# CAP_DEMO_BUDGET (50%), CAP_DEMO_ITERATIONS (6), CAP_DEMO_TIME_SCALE (sim
# only: wall time per trace time, default 10 so the copy engines' modelled
# bandwidth stays within what memcpy can do), CAP_DEMO_BACKEND (sim|cuda),
# CAP_BUILD_DIR (build-demo).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

trace=${CAP_DEMO_TRACE:-tests/data/traces/resnet50.trace}
budget=${CAP_DEMO_BUDGET:-50%}
iterations=${CAP_DEMO_ITERATIONS:-6}
scale=${CAP_DEMO_TIME_SCALE:-10}
build=${CAP_BUILD_DIR:-build-demo}

say() { printf '\n== %s\n' "$*"; }

say "dependencies"
./deploy/install-deps.sh

say "build ($build)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAP_BUILD_TESTS=OFF >/dev/null
jobs=$(nproc 2>/dev/null || echo 2)
# Build what the demo needs; a failed build stops the demo with its log.
if ! cmake --build "$build" -j"$jobs" \
    --target capuchin-sim capuchind capuchin-query capuchin-replay >"$build/build.log" 2>&1; then
  tail -n 40 "$build/build.log" >&2
  echo "demo: the build failed (all of it in $build/build.log)" >&2
  exit 1
fi
bin="$root/$build/bin"

say "trace"
"$bin/capuchin-sim" --trace "$trace" --info

backend=${CAP_DEMO_BACKEND:-}
if [ -z "$backend" ]; then
  backend=sim
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    backend=cuda
  fi
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/capuchin-demo.XXXXXX")
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

say "capuchind (socket $tmp/capuchind.sock, database $tmp/capuchin.db)"
"$bin/capuchind" --socket "$tmp/capuchind.sock" --db "$tmp/capuchin.db" \
  --log-level info 2>"$tmp/capuchind.log" &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S "$tmp/capuchind.sock" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || break
  sleep 0.1
done
if ! [ -S "$tmp/capuchind.sock" ]; then
  echo "demo: capuchind did not start:" >&2
  cat "$tmp/capuchind.log" >&2
  exit 1
fi

say "replay $trace at $budget for $iterations iterations ($backend backend)"
scale_args=()
[ "$backend" = sim ] && scale_args=(--time-scale "$scale")
status=0
"$bin/capuchin-replay" --trace "$trace" --budget "$budget" \
  --iterations "$iterations" --socket "$tmp/capuchind.sock" \
  --backend "$backend" "${scale_args[@]}" || status=$?
if [ "$backend" = sim ]; then
  echo "(times are trace time on the sim backend's clock: wall time / $scale)"
fi

say "capuchin-query plans"
"$bin/capuchin-query" --db "$tmp/capuchin.db" plans
plan=$("$bin/capuchin-query" --db "$tmp/capuchin.db" --format csv plans |
  awk -F, 'NR > 1 { id = $1 } END { print id }')
if [ -n "$plan" ]; then
  say "plan $plan: its largest actions"
  "$bin/capuchin-query" --db "$tmp/capuchin.db" plan "$plan" >"$tmp/plan.txt"
  # The summary and the action table's header, then its 12 largest rows
  # (awk reads all of sort's output: `head` would leave sort to die of
  # SIGPIPE, which pipefail turns into the demo's exit status).
  awk '{ print } /^action /{ hdr = 1 } /^------/ && hdr { exit }' "$tmp/plan.txt"
  awk 'rows { print } /^action /{ hdr = 1 } /^------/ && hdr { rows = 1 }' "$tmp/plan.txt" |
    sort -k3,3 -g -r | awk 'NR <= 12'
else
  echo "demo: the daemon stored no plan (see its log below)" >&2
  tail -n 20 "$tmp/capuchind.log" >&2
fi

say "capuchind log (last lines)"
tail -n 8 "$tmp/capuchind.log"
exit "$status"
