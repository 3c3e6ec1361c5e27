#!/usr/bin/env bash
# Capuchin on a real NVIDIA GPU, in one command:
#   1. build the project with the cuda backend;
#   2. run the `gpu`-labelled tests (ctest -L gpu); on a GPU none may skip;
#   3. replay resnet50 at 50 % on the cuda backend through a real capuchind
#      and compare each guided iteration's measured time with the plan's
#      predicted time (the daemon's simulation of that plan), and with
#      capuchin-sim run on the trace at the bandwidths the client measured,
#      and where a guided iteration's host time went against the measured
#      one's, per op (capuchin-replay --op-times: op begin, body, op end);
#   4. train torchvision ResNet-50 (batch 128) and Hugging Face GPT-2 small
#      under the PyTorch adapter at 100/50/30 % against
#      torch.autograd.graph.save_on_cpu and torch.utils.checkpoint at the same
#      memory (tests/gpu/train_compare.py), printing throughput and peak
#      memory (torch.cuda.max_memory_allocated); CAPUCHIN_DEBUG=1 prints
#      each op that leaves a plan's op sequence, against the plan's; two
#      more steps of each run profiled (--profile: traces in OUT/profiles)
#      and the memory Python still reaches at its end (--census);
#   5. train an MLP under Manager(placement=True) at 100/50 %, the plan's
#      blocks at their planned addresses through capuchin's CUDA allocator
#      (tests/gpu/placement_check.py): bitwise the unmanaged run's losses and
#      gradients, allocations placed in guided iterations.
#
#   ./deploy/gpu-check.sh [--cpu-smoke] [--build DIR] [--out DIR] [--debs DIR]
#                         [--use-debs | --system-deps] [--skip-build] [--build-only]
#                         [--archive FILE]
#
#   --cpu-smoke, --dry-run  everything but the GPU: build (cuda backend only if
#                a toolkit is found), run the gpu tests (they skip), replay on
#                the sim backend, train tiny models on the CPU. Without this
#                option the script fails at once where no GPU is seen.
#   --build DIR  build folder (default build-gpu; build-gpu-smoke with --cpu-smoke)
#   --out DIR    where logs and result files go (default DIR/gpu-check)
#   --debs DIR   the .deb folder (default deploy/gpu-debs)
#   --use-debs   build against the .debs even if the system has the packages
#   --system-deps  never use the .debs (fail if the system lacks a package)
#   --skip-build reuse the build folder as it is
#   --build-only stop after the build and the gpu tests (needs no PyTorch)
#   --archive FILE  at the end, whatever happened, FILE.tar.gz of the out
#                folder: the logs, the daemon's database (capuchind.db: the
#                profiles and plans, for capuchin-query and capuchin-sim
#                afterwards) and every op the adapter reported (ops.PID, see
#                CAPUCHIN_DEBUG_OPS in README) in one file, for a machine one
#                gets a few files back from
# Environment: PYTHON (default python3: the interpreter that has PyTorch),
# CAP_JOBS (build jobs, default nproc), CAP_GPU_TOLERANCE (allowed deviation
# of the best guided iteration from its prediction, default 0.10),
# CAP_GPU_ITERATIONS (replay iterations, default 8), TRAIN_ARGS (extra
# arguments for train_compare.py, e.g. "--models resnet50 --iterations 10").
#
# Build dependencies. A machine without a package registry (the lent GPU
# machine has PyTorch, CUDA, CMake and a compiler, but none of libuv,
# protobuf-c or SQLite's development files and no protoc-c) builds against
# Debian 12 .debs fetched beforehand on a machine with apt:
#     ./deploy/fetch-gpu-debs.sh           # fills deploy/gpu-debs/ (git-ignored)
# and sent along with the checkout; with the device tool of this workplace:
#     run(command="./deploy/gpu-check.sh --archive $OUT/gpu-check.tar.gz", carry=["deploy/gpu-debs"])
# (that tool sends the checkout of the session that calls it, and stops a
# command after 10 minutes: if the whole check does not fit, split it, e.g.
# TRAIN_ARGS="--models resnet50" first, then TRAIN_ARGS="--models gpt2"
# with --skip-build on the same warm machine).
# They are unpacked with `dpkg -x` (or ar+tar where dpkg is missing) into
# BUILD/gpu-deps, never into /. CMake finds them through PKG_CONFIG_PATH,
# CMAKE_PREFIX_PATH and PROTOC_C_EXECUTABLE; the programs built find the
# libraries through the build tree's RPATH, protoc-c and pkg-config through
# small wrappers that set LD_LIBRARY_PATH for themselves alone (a global
# LD_LIBRARY_PATH would also hand Debian's older SQLite to Python's sqlite3).
#
# Exit status: 0 when every step passed, 1 when one failed (each is named),
# 64 for bad arguments.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"

smoke=0 build='' out='' debs=$src/deploy/gpu-debs deps_mode=auto skip_build=0 build_only=0
archive=''
while [ $# -gt 0 ]; do
  case $1 in
    --cpu-smoke | --dry-run) smoke=1 ;;
    --build) build=$(realpath -m "${2:?--build needs a folder}"); shift ;;
    --out) out=$(realpath -m "${2:?--out needs a folder}"); shift ;;
    --debs) debs=$(realpath -m "${2:?--debs needs a folder}"); shift ;;
    --use-debs) deps_mode=debs ;;
    --system-deps) deps_mode=system ;;
    --skip-build) skip_build=1 ;;
    --build-only) build_only=1 ;;
    --archive) archive=$(realpath -m "${2:?--archive needs a file}"); shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
  shift
done
if [ -z "$build" ]; then
  build=$src/build-gpu
  [ $smoke -eq 1 ] && build=$src/build-gpu-smoke
fi
out=${out:-$build/gpu-check}
mkdir -p "$build" "$out"
jobs=${CAP_JOBS:-$(nproc)}
tolerance=${CAP_GPU_TOLERANCE:-0.10}
iterations=${CAP_GPU_ITERATIONS:-8}

# At exit, whatever happened: the daemon stopped, its log and database kept,
# the out folder archived (--archive).
tmp='' dpid=''
cleanup() {
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
  if [ -n "$tmp" ]; then
    cp "$tmp/d.log" "$out/capuchind.log" 2>/dev/null || true
    cp "$tmp/d.db" "$out/capuchind.db" 2>/dev/null || true
    rm -rf "$tmp"
  fi
  if [ -n "$archive" ]; then
    tar czf "$archive" -C "$(dirname "$out")" "$(basename "$out")" 2>/dev/null &&
      echo "gpu-check: logs archived in $archive"
  fi
  return 0
}
trap cleanup EXIT

say() { printf '\n== gpu-check: %s\n' "$*"; }
die() { echo "gpu-check: $*" >&2; exit 1; }
results=()   # "ok|FAIL|skip  step: detail", printed at the end
failed=0
record() { # status message
  results+=("$(printf '%-4s %s' "$1" "$2")")
  [ "$1" = FAIL ] && failed=1
  return 0
}

# --- 0. The GPU, and the interpreter that has PyTorch -------------------
if [ $smoke -eq 0 ]; then
  command -v nvidia-smi >/dev/null || die "no nvidia-smi: this is not a machine with an NVIDIA GPU (use --cpu-smoke to check everything but the GPU)"
  gpus=$(nvidia-smi -L 2>&1) || die "nvidia-smi sees no GPU: $gpus (use --cpu-smoke to check everything but the GPU)"
  echo "gpu-check: $gpus"
  device_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
else
  device_name="CPU (--cpu-smoke: no GPU step ran)"
fi
PYTHON=${PYTHON:-python3}
if [ $build_only -eq 0 ]; then
  if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    # Debian's own python3 carries python3-torch where a pyenv/venv python3
    # earlier on PATH does not.
    if [ $smoke -eq 1 ] && [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
      PYTHON=/usr/bin/python3
    else
      die "$PYTHON cannot import torch: set PYTHON to the interpreter that has PyTorch"
    fi
  fi
  echo "gpu-check: python $("$PYTHON" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__)')"
  if [ $smoke -eq 0 ]; then
    "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
      die "torch.cuda.is_available() is False: PyTorch cannot use the GPU (use --cpu-smoke to check everything but the GPU)"
  fi
fi

# --- 1. Build dependencies: the system's, or the unpacked .debs ---------
modules=(libuv libprotobuf-c sqlite3)
system_has_deps() {
  command -v pkg-config >/dev/null && pkg-config --exists "${modules[@]}" &&
    command -v protoc-c >/dev/null
}
cmake_dep_args=()
if [ $skip_build -eq 0 ]; then
  use_debs=0
  case $deps_mode in
    debs) use_debs=1 ;;
    system) system_has_deps || die "--system-deps, but pkg-config/${modules[*]}/protoc-c are not all installed" ;;
    auto) system_has_deps || use_debs=1 ;;
  esac
  if [ $use_debs -eq 1 ]; then
    say "build dependencies from the .debs in $debs"
    [ -f "$debs/MANIFEST" ] ||
      die "the system lacks libuv/protobuf-c/SQLite development files, protoc-c or pkg-config, and $debs has no .debs: run ./deploy/fetch-gpu-debs.sh on a Debian 12 machine with apt and bring $debs along (device tool: carry [\"deploy/gpu-debs\"])"
    while read -r f; do
      [ -f "$debs/$f" ] || die "$debs/$f (named in its MANIFEST) is missing: run ./deploy/fetch-gpu-debs.sh again"
    done <"$debs/MANIFEST"
    prefix=$build/gpu-deps
    # Unpack again only when the set of .debs changed.
    if ! cmp -s "$debs/MANIFEST" "$prefix/MANIFEST" 2>/dev/null; then
      rm -rf "$prefix"
      mkdir -p "$prefix"
      while read -r f; do
        if command -v dpkg >/dev/null; then
          dpkg -x "$debs/$f" "$prefix"
        else # a .deb is an ar archive holding data.tar.{xz,zst,gz}
          member=$(ar t "$debs/$f" | grep '^data\.tar')
          case $member in
            *.xz) ar p "$debs/$f" "$member" | tar -xJ -C "$prefix" ;;
            *.zst) ar p "$debs/$f" "$member" | tar --zstd -x -C "$prefix" ;;
            *.gz) ar p "$debs/$f" "$member" | tar -xz -C "$prefix" ;;
            *) die "$f: unknown data member '$member'" ;;
          esac
        fi
      done <"$debs/MANIFEST"
      # The .pc files name /usr (prefix=/usr, and libuv's libdir and
      # includedir spelled out in full): make every such path point into
      # the prefix.
      find "$prefix" -name '*.pc' -exec sed -i -E "s#^([A-Za-z_]+)=/usr(/|\$)#\1=$prefix/usr\2#" {} +
      # protoc-c and pkgconf link libraries that are in the prefix only.
      mkdir -p "$prefix/wrap"
      for t in protoc-c pkgconf; do
        # shellcheck disable=SC2016 # $LD_LIBRARY_PATH and $@ expand in the wrapper
        printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
          "$prefix/usr/lib/x86_64-linux-gnu" "$prefix/usr/bin/$t" >"$prefix/wrap/$t"
        chmod +x "$prefix/wrap/$t"
      done
      ln -sf pkgconf "$prefix/wrap/pkg-config"
      cp "$debs/MANIFEST" "$prefix/MANIFEST"
    fi
    "$prefix/wrap/protoc-c" --version >/dev/null 2>&1 ||
      die "the unpacked protoc-c does not run here: $("$prefix/wrap/protoc-c" --version 2>&1 | head -n 2) (Debian 12's libraries need glibc >= 2.36)"
    export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    command -v pkg-config >/dev/null || export PKG_CONFIG=$prefix/wrap/pkg-config
    for m in "${modules[@]}"; do
      for v in libdir includedir; do
        d=$("${PKG_CONFIG:-pkg-config}" --variable=$v "$m") || die "pkg-config does not find $m in $prefix"
        case $d in "$prefix"/*) ;; *) die "pkg-config's $m $v is $d, not in $prefix" ;; esac
      done
    done
    cmake_dep_args=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DPROTOC_C_EXECUTABLE="$prefix/wrap/protoc-c"
                    -DPKG_CONFIG_EXECUTABLE="${PKG_CONFIG:-$(command -v pkg-config)}")
    echo "gpu-check: unpacked $(wc -l <"$debs/MANIFEST") .debs into $prefix"
  else
    echo "gpu-check: build dependencies from the system"
  fi
fi

# --- 2. Build -----------------------------------------------------------
command -v cmake >/dev/null || die "no cmake (3.25 or newer) on PATH"
if [ $skip_build -eq 0 ]; then
  say "build ($build, $jobs jobs)"
  cuda_arg=()
  [ $smoke -eq 0 ] && cuda_arg=(-DCAP_WITH_CUDA=ON) # fail, not skip, without a toolkit
  # The project looks in /usr/local/cuda; without it, the nvcc on PATH names
  # the toolkit.
  if [ ! -e /usr/local/cuda ] && nvcc=$(command -v nvcc); then
    cuda_arg+=(-DCUDAToolkit_ROOT="$(dirname "$(dirname "$(realpath "$nvcc")")")")
  fi
  # Python_EXECUTABLE/Python3_EXECUTABLE: the adapter's extension must be
  # built for the interpreter that has PyTorch (unused variables are harmless).
  py_args=()
  if py=$(command -v "$PYTHON"); then
    py_args=(-DPython_EXECUTABLE="$py" -DPython3_EXECUTABLE="$py")
  fi
  if ! cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda_arg[@]}" \
       "${cmake_dep_args[@]}" "${py_args[@]}" >"$out/cmake.log" 2>&1; then
    tail -n 30 "$out/cmake.log" >&2
    die "cmake configure failed (log: $out/cmake.log)"
  fi
  grep 'capuchin: CUDA backend' "$out/cmake.log" || true
  if ! cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1; then
    grep -E 'error|Error' "$out/build.log" | head -n 30 >&2
    die "build failed (log: $out/build.log)"
  fi
  record ok "build: $(grep -o 'CUDA backend [A-Z]*' "$out/cmake.log")"
fi
bin=$build/bin
for t in capuchind capuchin-replay capuchin-sim; do
  [ -x "$bin/$t" ] || die "$bin/$t is missing: build first (without --skip-build)"
done
# Every library the programs need must resolve (RPATH into gpu-deps).
if missing=$(ldd "$bin/capuchind" "$bin/capuchin-replay" 2>&1 | grep 'not found'); then
  die "libraries not found by the built programs: $missing"
fi

# --- 3. The gpu-labelled tests -------------------------------------------
say "ctest -L gpu"
n_gpu=$(ctest --test-dir "$build" -N -L gpu | sed -n 's/^Total Tests: //p')
if [ "${n_gpu:-0}" -eq 0 ]; then
  record FAIL "gpu tests: ctest -L gpu lists no test"
else
  set +e
  ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$out/ctest-gpu.log"
  rc=${PIPESTATUS[0]}
  set -e
  skipped=$(grep -c '\*\*\*Skipped\|Not Run' "$out/ctest-gpu.log" || true)
  if [ "$rc" -ne 0 ]; then
    record FAIL "gpu tests: ctest -L gpu failed (log: $out/ctest-gpu.log)"
  elif [ $smoke -eq 0 ] && [ "$skipped" -gt 0 ]; then
    record FAIL "gpu tests: $skipped of $n_gpu skipped on a GPU machine (the cuda backend is not compiled in or sees no device)"
  elif [ $smoke -eq 1 ]; then
    record skip "gpu tests: $n_gpu listed, $skipped skipped (no GPU in --cpu-smoke)"
  else
    record ok "gpu tests: $n_gpu passed"
  fi
fi

if [ $build_only -eq 1 ]; then
  say "summary ($device_name, --build-only)"
  printf '  %s\n' "${results[@]}"
  exit $failed
fi

# --- A daemon for the replay and the training ---------------------------
tmp=$(mktemp -d)
"$bin/capuchind" --socket "$tmp/d.sock" --db "$tmp/d.db" --log-level info 2>>"$tmp/d.log" &
dpid=$!
for _ in $(seq 100); do [ -S "$tmp/d.sock" ] && break; sleep 0.1; done
[ -S "$tmp/d.sock" ] || { cat "$tmp/d.log" >&2; die "capuchind did not start"; }

# --- 4. Replay resnet50 at 50 % against the simulator --------------------
trace=$src/tests/data/traces/resnet50.trace
if [ $smoke -eq 0 ]; then
  say "replay resnet50 at 50 % on the cuda backend ($iterations iterations)"
  replay_args=(--backend cuda)
else
  # The sim backend's clock, slowed as test_client_replay.sh does so that
  # the copy-engine threads keep up on a small machine.
  say "replay resnet50 at 50 % on the sim backend ($iterations iterations, --cpu-smoke)"
  replay_args=(--backend sim --time-scale 20)
fi
set +e
"$bin/capuchin-replay" --trace "$trace" --budget 50% --iterations "$iterations" \
  --socket "$tmp/d.sock" --json --job gpu-check-resnet50 "${replay_args[@]}" \
  --op-times "$out/op-times.tsv" \
  >"$out/replay.json" 2>"$out/replay.err"
rc=$?
set -e
# The bandwidths the client measured (cuda: its probe; sim: its model), as
# the daemon logged them from the client's hello.
bw=$(sed -n 's/.*bandwidth \([0-9.]*\)\/\([0-9.]*\)\/\([0-9.]*\) GB\/s.*/\1 \2 \3/p' "$tmp/d.log" | tail -n 1)
sim_ms=
if [ -n "$bw" ]; then
  read -r h2d d2h duplex <<<"$bw"
  "$bin/capuchin-sim" --trace "$trace" --budget 50% --policy capuchin --h2d-gbps "$h2d" \
    --d2h-gbps "$d2h" --duplex-gbps "$duplex" >"$out/sim.txt" 2>&1 || true
  # policy fits peak iter_ms ...: the capuchin row's 4th column
  sim_ms=$(awk '$1 == "capuchin" && $2 == "yes" { print $4 }' "$out/sim.txt")
  echo "gpu-check: bandwidths measured by the client: H2D $h2d, D2H $d2h, duplex $duplex GB/s"
  echo "gpu-check: capuchin-sim on the trace at these bandwidths: ${sim_ms:-no plan} ms per iteration"
fi
if [ $rc -ne 0 ]; then
  tail -n 5 "$out/replay.err" >&2
  record FAIL "replay: capuchin-replay exited $rc (log: $out/replay.err)"
else
  # Per-iteration table and the verdict (python: the JSON is parsed, not grepped).
  set +e
  verdict=$("$PYTHON" - "$out/replay.json" "$tolerance" "${sim_ms:-0}" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
tol, sim_ms = float(sys.argv[2]), float(sys.argv[3])
print(f"{'iter':>4} {'mode':>8} {'time ms':>9} {'plan pred ms':>12} {'diff %':>7} "
      f"{'peak MiB':>9} {'budget MiB':>10} {'mismatch':>8} {'errors':>6}", file=sys.stderr)
best, problems = None, []
for r in rows:
    t, p = r["time_ns"] / 1e6, r["predicted_ns"] / 1e6
    d = (t - p) / p * 100 if p > 0 else float("nan")
    print(f"{r['iteration']:>4} {r['mode']:>8} {t:>9.2f} {p:>12.2f} {d:>7.1f} "
          f"{r['peak_bytes'] / 2**20:>9.1f} {r['budget_bytes'] / 2**20:>10.1f} "
          f"{r['mismatches']:>8} {r['errors']:>6}", file=sys.stderr)
    if r["mismatches"] or r["errors"]:
        problems.append(f"iteration {r['iteration']}: {r['mismatches']} mismatches, {r['errors']} errors")
    if r["mode"] != "guided":
        continue
    if r["peak_bytes"] > r["budget_bytes"]:
        problems.append(f"iteration {r['iteration']} peak over the budget")
    if p > 0 and (best is None or abs(d) < abs(best[1])):
        best = (t, d, p)
if best is None:
    problems.append("no guided iteration with a prediction")
if problems:
    print("FAIL " + "; ".join(problems))
    sys.exit(1)
t, d, p = best
note = f"best guided {t:.2f} ms vs plan prediction {p:.2f} ms ({d:+.1f} %)"
if sim_ms > 0:
    note += f", capuchin-sim on the trace {sim_ms:.2f} ms"
if abs(d) > tol * 100:
    print(f"TIME {note}: over the {tol * 100:.0f} % tolerance")
    sys.exit(2)
print(f"ok {note}")
EOF
)
  vrc=$?
  set -e
  echo "gpu-check: $verdict"
  case $vrc in
    0) record ok "replay: ${verdict#ok }" ;;
    2) if [ $smoke -eq 1 ]; then
         # The sim backend on a busy small machine: timing is not the point here.
         record skip "replay: ${verdict#TIME } (timing not judged in --cpu-smoke)"
       else
         record FAIL "replay: ${verdict#TIME }"
       fi ;;
    *) record FAIL "replay: ${verdict#FAIL }" ;;
  esac
fi

# Where a guided iteration's host time went against the measured one's
# (capuchin-replay --op-times): in op begin (restores, waits for memory), in
# the ops' bodies (on cuda the integrity checks wait for the device, so a late
# copy shows there), in op end (evictions), between ops; and the ops that
# grew most.
if [ -s "$out/op-times.tsv" ]; then
  "$PYTHON" - "$out/op-times.tsv" <<'EOF' 2>&1 | tee "$out/op-times.txt" || true
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
iters = {}
for r in rows:
    iters.setdefault((int(r["iteration"]), r["mode"]), []).append(r)
measured = [k for k in iters if k[1] == "measured"]
guided = [k for k in iters if k[1] == "guided"]
if not measured or not guided:
    print("op times: no measured and guided iteration to compare")
    sys.exit(0)
PARTS = ("begin", "body", "end")
def parts(ops):
    t = dict.fromkeys(PARTS + ("between",), 0)
    for a, b in zip(ops, ops[1:] + [None]):
        for k in PARTS:
            t[k] += int(a[k + "_ns"])
        if b is not None:
            t["between"] += int(b["start_ns"]) - int(a["start_ns"]) - sum(int(a[k + "_ns"]) for k in PARTS)
    return t
m, g = iters[measured[0]], iters[guided[-1]]
pm, pg = parts(m), parts(g)
print(f"op times (ms)  {'':8} {'measured ' + str(measured[0][0]):>12} {'guided ' + str(guided[-1][0]):>12} {'diff':>8}")
for k in PARTS + ("between",):
    print(f"op times (ms)  {k:8} {pm[k] / 1e6:12.2f} {pg[k] / 1e6:12.2f} {(pg[k] - pm[k]) / 1e6:8.2f}")
by_op = {int(r["op"]): r for r in m}
grew = []
for r in g:
    a = by_op.get(int(r["op"]))
    if a:
        d = {k: int(r[k + "_ns"]) - int(a[k + "_ns"]) for k in PARTS}
        grew.append((sum(d.values()), int(r["op"]), r["name"], d))
grew.sort(reverse=True)
for tot, op, name, d in grew[:8]:
    print(f"op times: op {op:5} {name:40} {tot / 1e3:+9.1f} us (begin {d['begin'] / 1e3:+.1f},"
          f" body {d['body'] / 1e3:+.1f}, end {d['end'] / 1e3:+.1f})")
EOF
fi

# --- 5. Training under the adapter against save_on_cpu and checkpoint ----
# import capuchin from the build tree: python/CMakeLists.txt puts the package
# and its C extension (capuchin._client) in BUILD/python/capuchin. The source
# tree's python/ lacks the extension, so it is no fallback.
# CAPUCHIN_PYTHONPATH overrides this.
pypath=${CAPUCHIN_PYTHONPATH:-}
if [ -z "$pypath" ] && [ -f "$build/python/capuchin/__init__.py" ]; then
  pypath=$build/python
fi
echo "gpu-check: capuchin package from ${pypath:-nowhere (not built: see $out/cmake.log)}"
# The adapter's C extension needs Python's headers at build time.
"$PYTHON" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
  echo "gpu-check: note: $PYTHON has no Python.h: the adapter's extension (capuchin._client) cannot be built"
# Each run's last two steps profiled (a Chrome trace per run in
# $out/profiles, and where the device's time went) and what memory Python
# still reaches at its end: what a session with one GPU run needs to see.
train_args=(--device cuda --profile "$out/profiles" --census)
[ $smoke -eq 1 ] && train_args=(--device cpu --smoke --profile "$out/profiles" --census)
say "train_compare.py ${train_args[*]} ${TRAIN_ARGS:-}"
set +e
# shellcheck disable=SC2086 # TRAIN_ARGS is a list of words
CAPUCHIN_DEBUG=1 CAPUCHIN_DEBUG_OPS=${CAPUCHIN_DEBUG_OPS:-$out/ops} CAPUCHIN_SOCKET=$tmp/d.sock PYTHONPATH=${pypath}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 \
  "$PYTHON" "$src/tests/gpu/train_compare.py" "${train_args[@]}" ${TRAIN_ARGS:-} \
  --json "$out/train.json" 2>&1 | tee "$out/train.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  record FAIL "training comparison: train_compare.py exited $rc (log: $out/train.log)"
elif grep -q 'capuchin adapter not importable' "$out/train.log"; then
  record FAIL "training comparison: baselines ran, but the capuchin adapter is not importable (see $out/train.log)"
else
  # Every capuchin row must have trained; whether it kept to the target is
  # a result the table shows, counted here.
  set +e
  verdict=$("$PYTHON" - "$out/train.json" <<'EOF'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["method"] == "capuchin"]
bad = [f"{r['model']} at {r['budget']}%: {r['note']}" for r in rows if r["samples_per_s"] is None]
fit = sum(1 for r in rows if r["fits"])
if not rows or bad:
    print("; ".join(bad) or "no capuchin row")
    sys.exit(1)
print(f"{len(rows)} capuchin runs, {fit} within their target memory")
EOF
)
  vrc=$?
  set -e
  if [ $vrc -eq 0 ]; then
    record ok "training comparison: $verdict (table in $out/train.log)"
  else
    record FAIL "training comparison: $verdict"
  fi
fi

# --- 6. Placement under PyTorch ------------------------------------------
# In --cpu-smoke the check is that Manager(placement=True) refuses clearly.
placement_args=(--device cuda)
[ $smoke -eq 1 ] && placement_args=(--device cpu)
say "placement_check.py ${placement_args[*]}"
set +e
CAPUCHIN_DEBUG=1 CAPUCHIN_DEBUG_OPS=${CAPUCHIN_DEBUG_OPS:-$out/ops} CAPUCHIN_SOCKET=$tmp/d.sock PYTHONPATH=${pypath}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 \
  "$PYTHON" "$src/tests/gpu/placement_check.py" "${placement_args[@]}" \
  --json "$out/placement.json" 2>&1 | tee "$out/placement.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  record FAIL "placement: $(grep -m 1 'placement-check: FAIL' "$out/placement.log" || echo "placement_check.py exited $rc") (log: $out/placement.log)"
elif [ $smoke -eq 1 ]; then
  record skip "placement: Manager(placement=True) refused on the CPU with a clear error (no GPU in --cpu-smoke)"
else
  record ok "placement: bitwise equal to the unmanaged run, guided iterations placed (table in $out/placement.log)"
fi

say "summary ($device_name)"
printf '  %s\n' "${results[@]}"
echo "  logs: $out"
exit $failed
