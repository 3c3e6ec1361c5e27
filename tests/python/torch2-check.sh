#!/usr/bin/env bash
# The PyTorch adapter under PyTorch 2 on the CPU: CI and the development
# machine have Debian 12's torch 1.13 (Python 3.11); the lent GPU machines
# run torch 2.11 on Python 3.12. This builds the working tree in a Debian 13
# (trixie) root with trixie's python3-torch (2.6, Python 3.13, CPU) and runs
# there:
#   ctest -L torch                                 (the adapter's tests)
#   tests/gpu/train_compare.py --device cpu --smoke (against a capuchind)
# It found what the first GPU run could not tell apart from a GPU problem:
# libcap's cap_mode_name bound in place of the client's, and the C storage
# cache off on Python >= 3.12.
#
#   sudo tests/python/torch2-check.sh [--root DIR]
#
#   --root DIR  the trixie root (default /var/tmp/capuchin-torch2): made with
#               debootstrap the first time (about 0.6 GB downloaded, 4 GB on
#               disk, a few minutes), reused after that
# Each run copies the working tree afresh (tracked and untracked files that
# git does not ignore: uncommitted changes included) into DIR/src.
# Environment: JOBS (build jobs, default 2), CTEST_ARGS (more ctest
# arguments, e.g. "-R torch_mlp"), SKIP_TRAIN=1 (no train_compare),
# EXTRA_ENV (VAR=value words for every command run in the root).
# Logs: DIR/logs. Exit status 0 when every step passed, 1 otherwise. Needs
# root, debootstrap, rsync and the network; not part of ./deploy/test.sh.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
R=/var/tmp/capuchin-torch2
while [ $# -gt 0 ]; do
  case $1 in
    --root) R=$(realpath -m "${2:?--root needs a folder}"); shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "torch2-check: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
  shift
done
LOGS=$R/logs
[ "$(id -u)" -eq 0 ] || { echo "torch2-check: run as root (debootstrap, chroot, mount)"; exit 1; }
for t in debootstrap rsync; do
  command -v $t >/dev/null || apt-get install -y $t >/dev/null ||
    { echo "torch2-check: needs $t"; exit 1; }
done
if [ ! -x "$R/usr/bin/python3" ] || ! chroot "$R" /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "torch2-check: making the trixie root in $R (once)"
  mkdir -p "$R"
  [ -x "$R/bin/sh" ] || debootstrap --variant=minbase trixie "$R" http://deb.debian.org/debian ||
    { echo "torch2-check: debootstrap failed"; exit 1; }
  cp -L /etc/resolv.conf "$R/etc/resolv.conf"
  chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update && apt-get install -y python3 python3-dev python3-torch python3-numpy \
           build-essential cmake pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler \
           libsqlite3-dev procps' || { echo "torch2-check: apt-get in the root failed"; exit 1; }
fi

# --- mounts (only those this run makes are undone at exit) -------------------
mounted=()
mnt() { # type source target
  mountpoint -q "$R/$3" && return 0
  mkdir -p "$R/$3"
  if [ "$1" = bind ]; then mount --bind "$2" "$R/$3"; else mount -t "$1" "$2" "$R/$3"; fi &&
    mounted=("$R/$3" "${mounted[@]}")
}
cleanup() {
  local m
  for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
}
trap cleanup EXIT
mnt proc proc proc
mnt sysfs sys sys
mnt bind /dev dev
mnt bind /dev/pts dev/pts
cp -L /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true

mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.json
results=()
failed=0
record() { results+=("$(printf '%-4s %s' "$1" "$2")"); [ "$1" = FAIL ] && failed=1; return 0; }
say() { printf '\n===== torch2-check: %s\n' "$*"; }
summary() {
  say "summary (torch $(chroot "$R" /usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null))"
  printf '  %s\n' "${results[@]}"
  echo "  logs: $LOGS"
  [ $failed -eq 0 ] && echo "RESULT: all steps passed" || echo "RESULT: FAILED"
  exit $failed
}
in_chroot() { # command line, run by bash inside the chroot with a clean env
  chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb ${EXTRA_ENV:-} /bin/bash -c "$1"
}

# --- 1. copy the working tree -------------------------------------------------
say "copy $SRC (tracked + untracked, not ignored) -> $R/src"
rm -rf "$R/src"
mkdir -p "$R/src"
if git -C "$SRC" ls-files -z -co --exclude-standard |
   rsync -a --from0 --ignore-missing-args --files-from=- "$SRC/" "$R/src/" >"$LOGS/copy.log" 2>&1; then
  n=$(find "$R/src" -type f | wc -l)
  head=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null)
  dirty=$(git -C "$SRC" status --porcelain 2>/dev/null | wc -l)
  record ok "copy: $n files (HEAD $head, $dirty changed/untracked paths in the working tree)"
  git -C "$SRC" status --short >>"$LOGS/copy.log" 2>&1
else
  cat "$LOGS/copy.log"
  record FAIL "copy failed (log: $LOGS/copy.log)"
  summary
fi

# --- 2./3. configure and build -----------------------------------------------
say "cmake configure"
if in_chroot 'cmake -S /src -B /src/build -DCMAKE_BUILD_TYPE=RelWithDebInfo' >"$LOGS/cmake.log" 2>&1; then
  grep -E 'capuchin:|Python3' "$LOGS/cmake.log"
  record ok "configure"
else
  tail -n 30 "$LOGS/cmake.log"
  record FAIL "configure (log: $LOGS/cmake.log)"
  summary
fi
say "build (-j${JOBS:-2})"
start=$SECONDS
if in_chroot "cmake --build /src/build -j${JOBS:-2}" >"$LOGS/build.log" 2>&1; then
  nw=$(grep -c 'warning:' "$LOGS/build.log")
  grep -A3 'warning:' "$LOGS/build.log" | head -n 40
  record ok "build ($((SECONDS - start)) s, $nw compiler warnings; log: $LOGS/build.log)"
else
  grep -E -B2 -A6 'error|Error' "$LOGS/build.log" | head -n 80
  record FAIL "build (log: $LOGS/build.log)"
  summary
fi
if ! ls "$R"/src/build/python/capuchin/_client*.so >/dev/null 2>&1; then
  record FAIL "build: the adapter's extension build/python/capuchin/_client*.so was not built (python3-dev?)"
fi

# --- 4. ctest -L torch ---------------------------------------------------------
say "ctest -L torch"
in_chroot 'ctest --test-dir /src/build -N -L torch' | tee "$LOGS/ctest-list.log"
in_chroot "ctest --test-dir /src/build -L torch --output-on-failure ${CTEST_ARGS:-}" 2>&1 | tee "$LOGS/ctest-torch.log"
rc=${PIPESTATUS[0]}
npass=$(grep -cE 'Test +#[0-9]+: .* Passed' "$LOGS/ctest-torch.log")
nfail=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run|SEGFAULT|Child aborted)' "$LOGS/ctest-torch.log")
nskip=$(grep -cE 'Test +#[0-9]+: .*\*\*\*Skipped' "$LOGS/ctest-torch.log")
if [ "$rc" -eq 0 ]; then
  record ok "ctest -L torch: $npass passed, $nskip skipped"
else
  record FAIL "ctest -L torch: $npass passed, $nfail failed, $nskip skipped (log: $LOGS/ctest-torch.log)"
  while IFS= read -r l; do results+=("     $l"); done < <(grep -E 'Test +#[0-9]+: ' "$LOGS/ctest-torch.log" | grep -v ' Passed')
fi

# --- 5. train_compare.py --device cpu --smoke against a capuchind ---------------
if [ "${SKIP_TRAIN:-0}" = 1 ]; then
  record skip "train_compare (SKIP_TRAIN=1)"
  summary
fi
say "train_compare.py --device cpu --smoke (capuchind in the chroot)"
in_chroot '
set -u
tmp=$(mktemp -d)
/src/build/bin/capuchind --socket "$tmp/d.sock" --db "$tmp/d.db" --log-level info 2>>"$tmp/d.log" &
dpid=$!
trap "kill $dpid 2>/dev/null; wait $dpid 2>/dev/null; cp $tmp/d.log /src/build/capuchind-train.log; rm -rf $tmp" EXIT
for _ in $(seq 100); do [ -S "$tmp/d.sock" ] && break; sleep 0.1; done
[ -S "$tmp/d.sock" ] || { echo "capuchind did not start:"; cat "$tmp/d.log"; exit 90; }
cd /src
CAPUCHIN_SOCKET=$tmp/d.sock PYTHONPATH=/src/build/python PYTHONUNBUFFERED=1 \
  python3 tests/gpu/train_compare.py --device cpu --smoke --json /src/build/train.json
' 2>&1 | tee "$LOGS/train.log"
rc=${PIPESTATUS[0]}
cp "$R/src/build/train.json" "$LOGS/train.json" 2>/dev/null
cp "$R/src/build/capuchind-train.log" "$LOGS/capuchind-train.log" 2>/dev/null
flag=$(grep -iE 'diverged|failed|not importable' "$LOGS/train.log")
if [ "$rc" -ne 0 ]; then
  record FAIL "train_compare --smoke exited $rc (log: $LOGS/train.log)"
elif [ -n "$flag" ]; then
  record FAIL "train_compare --smoke: $(printf '%s\n' "$flag" | wc -l) line(s) say diverged/failed/not importable (log: $LOGS/train.log)"
elif ! [ -f "$LOGS/train.json" ]; then
  record FAIL "train_compare --smoke wrote no JSON"
else
  v=$(chroot "$R" /usr/bin/python3 - <<'EOF'
import json, sys
rows = [r for r in json.load(open("/src/build/train.json"))["rows"] if r["method"] == "capuchin"]
bad = [f"{r['model']}@{r['budget']}%: {r['note']}" for r in rows if r["samples_per_s"] is None]
print(("BAD " + "; ".join(bad)) if bad or not rows else f"{len(rows)} capuchin runs, {sum(1 for r in rows if r['fits'])} within target")
EOF
)
  case $v in BAD*|'') record FAIL "train_compare --smoke: ${v:-no capuchin rows}" ;;
             *) record ok "train_compare --smoke: $v" ;; esac
fi
[ -n "$flag" ] && while IFS= read -r l; do results+=("     $l"); done <<<"$flag"
summary
