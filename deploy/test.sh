#!/usr/bin/env bash
# Build and run the whole test suite: first with gcc and -Werror, then once
# more with clang under AddressSanitizer + UndefinedBehaviorSanitizer, with the
# libFuzzer drivers each run for a bounded time.
#   CAP_TEST_QUICK=1 skips the sanitizer pass.
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/install-deps.sh

jobs=$(nproc)

echo "== build (gcc, -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAP_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
echo "== tests"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 600)

[ "${CAP_TEST_QUICK:-0}" = 1 ] && exit 0

echo "== build (clang, ASan+UBSan, fuzzers)"
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCAP_WERROR=ON \
  -DCAP_SANITIZE=address,undefined -DCAP_FUZZ=ON >/dev/null
cmake --build build-asan -j"$jobs"
echo "== tests under ASan+UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Sanitized code runs several times slower: slow the replays' clock further
# so that the client's own work still fits inside each op's measured time.
export CAP_TEST_TIME_SCALE=${CAP_TEST_TIME_SCALE_ASAN:-80}
# Planning runs sanitized too: a replay waits longer for its plan
# (inception_v3 at 50 %: about 11 s CPU sanitized, 2.4 s in the gcc build,
# several times that on a loaded machine).
export CAPUCHIN_REPLAY_PLAN_WAIT_MS=${CAPUCHIN_REPLAY_PLAN_WAIT_MS:-180000}
# The conformance matrix under the sanitizers: every trace at 50 % and at
# 30 %, near the floors, where the executor waits and evicts the most
# (about 160 s here).
export CAP_CONFORMANCE_BUDGETS=${CAP_CONFORMANCE_BUDGETS_ASAN:-50 30}
# The planner against the lower bound's verdicts: one budget, both modes,
# a transformer and a CNN (a plan takes 1-5 s CPU sanitized).
export CAP_BOUND_PCTS=${CAP_BOUND_PCTS_ASAN:-50}
export CAP_BOUND_TRACES=${CAP_BOUND_TRACES_ASAN:-bert_base vgg16}
# The outsider's check of every planner's plans: at every budget, as in the
# gcc pass (about 220 s here; 80 s at 50 and 30 % only, before stop 28's
# faster sanitized build).
export CAP_OUTSIDER_BUDGETS=${CAP_OUTSIDER_BUDGETS_ASAN:-80 60 50 40 30}
(cd build-asan && ctest --output-on-failure -j"$jobs" --timeout 900)
