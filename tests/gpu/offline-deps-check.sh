#!/usr/bin/env bash
# Prove that deploy/gpu-check.sh builds Capuchin from the .debs of
# deploy/fetch-gpu-debs.sh alone: debootstrap a root that has a C compiler,
# CMake and Python but none of libuv/protobuf-c/SQLite's development files,
# pkg-config or protoc-c (like the lent GPU machine), put a clean clone of
# HEAD and the .deb folder in it, and run there, with no network use:
#   ./deploy/gpu-check.sh --cpu-smoke --build-only
#   ctest -R 'daemon_test_store|integration_test_daemon_plan|integration_test_client_replay$'
# (the daemon stores in SQLite, replays through libuv and protobuf-c: the
# unpacked libraries are the ones loaded, through the build's RPATH).
#
#   sudo tests/gpu/offline-deps-check.sh [--suite bookworm|noble] [--keep] [ROOT]
#
#   --suite   bookworm (Debian 12, default) or noble (Ubuntu 24.04, the base
#             of the lent GPU machine's image: Python 3.12)
#   --keep    leave ROOT in place (default: removed)
# Needs root, debootstrap and the network for debootstrap; runs
# ./deploy/fetch-gpu-debs.sh first when deploy/gpu-debs/ is empty. Takes a few
# minutes; not part of ./deploy/test.sh.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
suite=bookworm keep=0 root=''
while [ $# -gt 0 ]; do
  case $1 in
    --suite) suite=${2:?--suite needs bookworm or noble}; shift ;;
    --keep) keep=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "offline-deps-check: unknown option $1" >&2; exit 64 ;;
    *) root=$(realpath -m "$1") ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "offline-deps-check: run as root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "offline-deps-check: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
case $suite in
  bookworm) mirror=http://deb.debian.org/debian script=() extra=() ;;
  # debootstrap on Debian has no script named noble, and no Ubuntu keyring.
  noble) mirror=http://archive.ubuntu.com/ubuntu script=(/usr/share/debootstrap/scripts/gutsy)
         # shellcheck disable=SC2054 # one option whose value is a comma list
         extra=(--no-check-gpg --components=main,universe) ;;
  *) echo "offline-deps-check: --suite bookworm or noble" >&2; exit 64 ;;
esac
[ -f "$src/deploy/gpu-debs/MANIFEST" ] || "$src/deploy/fetch-gpu-debs.sh"
if [ -z "$root" ]; then
  root=$(mktemp -d /var/tmp/capuchin-offline.XXXXXX)
elif [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
  echo "offline-deps-check: $root exists and is not empty" >&2
  exit 1
fi
mkdir -p "$root"
chmod 0755 "$root"

# Mounted under the root, unmounted in reverse on any exit; the root is
# removed only once nothing is mounted in it (a recursive delete through a
# bind of /dev would empty the host's /dev).
mounted=()
mnt() { mount "$@"; mounted+=("${*: -1}"); }
cleanup() {
  local rc=$? i pid
  for pid in /proc/[0-9]*; do
    [ "$(readlink "$pid/root" 2>/dev/null)" = "$root" ] && kill -KILL "${pid#/proc/}" 2>/dev/null
  done
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" || true
  done
  if grep -q " $root/" /proc/mounts; then
    echo "offline-deps-check: something is still mounted under $root; not removing it" >&2
  elif [ $keep -eq 0 ]; then
    rm -rf "$root"
  else
    echo "offline-deps-check: root kept in $root" >&2
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== offline-deps-check: debootstrap $suite (minbase + compiler, cmake, python3) into $root"
debootstrap --variant=minbase "${extra[@]}" --include=build-essential,cmake,python3,procps \
  "$suite" "$root" "$mirror" "${script[@]}" >"$root.debootstrap.log" 2>&1 ||
  { tail -n 30 "$root.debootstrap.log" >&2; exit 1; }
rm -f "$root.debootstrap.log"

git clone -q --no-hardlinks "$src" "$root/src/capuchin"
git -C "$root/src/capuchin" checkout -q --detach "$(git -C "$src" rev-parse HEAD)"
cp -r "$src/deploy/gpu-debs" "$root/src/capuchin/deploy/"
mnt -t proc proc "$root/proc"
mnt --bind /dev "$root/dev"

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    CAP_JOBS="${CAP_JOBS:-2}" bash -c "cd /src/capuchin && $1"
}
# What the root must lack, or the check proves nothing.
if in_root 'command -v pkg-config || command -v protoc-c || ls /usr/include/uv.h /usr/include/sqlite3.h /usr/include/protobuf-c 2>/dev/null | grep .'; then
  echo "offline-deps-check: the root already has a build dependency (above); the check would prove nothing" >&2
  exit 1
fi
echo "== offline-deps-check: gpu-check.sh --cpu-smoke --build-only"
in_root './deploy/gpu-check.sh --cpu-smoke --build-only'
echo "== offline-deps-check: the daemon and the replay, on the unpacked libraries"
in_root 'ldd build-gpu-smoke/bin/capuchind | grep -E "libuv|libsqlite3|libprotobuf-c"'
in_root 'ldd build-gpu-smoke/bin/capuchind | grep -qE "libsqlite3.so.0 => /src/capuchin/build-gpu-smoke/gpu-deps/"'
# The replay test also checks timing against the prediction; on a busy
# 2-core machine that alone can miss (it is no dependency problem), so it
# gets a second try.
in_root 'ctest --test-dir build-gpu-smoke -R "daemon_test_store|integration_test_daemon_plan|integration_test_client_replay\$" --output-on-failure ||
         ctest --test-dir build-gpu-smoke --rerun-failed --output-on-failure'
echo "== offline-deps-check: $suite: built and ran on the .debs alone"
