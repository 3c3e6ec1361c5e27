#!/usr/bin/env bash
# The README's quick start on a machine that has never seen Capuchin: build a
# minimal Debian 12 root with debootstrap, copy a clean clone of this
# repository's HEAD into a new user's home, and run `./deploy/demo.sh` and
# `./deploy/test.sh` there as that user (who, like a new user, has sudo and
# nothing else installed). Prints how long each command took.
#
#   sudo ./deploy/fresh-check.sh [--quick] [--keep] [--cache DIR] [ROOT]
#
#   --quick      run test.sh with CAP_TEST_QUICK=1 (gcc pass only)
#   --keep       leave the root folder in place afterwards (default: removed)
#   --cache DIR  keep debootstrap's and apt's downloads in DIR between runs
#   ROOT         where to build the root (default: a new /var/tmp folder)
#
# Needs root (debootstrap, chroot, mounts) and the network (Debian's mirror:
# $CAP_FRESH_MIRROR, default http://deb.debian.org/debian). Not part of
# ./deploy/test.sh: it takes many minutes and downloads ~1 GB of packages.
# Only committed work is checked: the clone is of HEAD.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
mirror=${CAP_FRESH_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
user=newuser

quick=0 keep=0 cache= root=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --keep) keep=1 ;;
    --cache) cache=$(realpath -m "${2:?--cache needs a folder}"); shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fresh-check: unknown option $1" >&2; exit 64 ;;
    *) root=$(realpath -m "$1") ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "fresh-check: run as root (debootstrap, chroot, mount)" >&2; exit 1; }
if ! command -v debootstrap >/dev/null; then
  echo "fresh-check: installing debootstrap" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
fi
case $root in
  / | /bin | /boot | /dev | /etc | /home | /lib* | /proc | /root | /run | /sbin | /sys | /usr | /var)
    echo "fresh-check: refusing $root as the root folder" >&2
    exit 64
    ;;
esac
if [ -z "$root" ]; then
  root=$(mktemp -d /var/tmp/capuchin-fresh.XXXXXX)
elif [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
  echo "fresh-check: $root exists and is not empty" >&2
  exit 1
fi
mkdir -p "$root"
chmod 0755 "$root" # it becomes "/": mktemp's 0700 would lock the user out
if [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
  echo "fresh-check: note: uncommitted changes in $src are not part of the check" >&2
fi

say() { printf '\n== fresh-check: %s\n' "$*"; }

# Everything mounted under the root, in mount order; unmounted in reverse
# on any exit. The root is removed only once nothing is mounted in it: a
# recursive delete through a bind of /dev would empty the host's /dev.
mounted=()
mnt() { # mount arguments..., target last
  mount "$@"
  mounted+=("${*: -1}")
}
cleanup() {
  local rc=$? i pid
  # Processes a failed run left inside the root (a daemon a test started)
  # keep its mounts busy: stop them, by pid.
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ] && kill -KILL "$pid" 2>/dev/null
  done
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" || true
  done
  if grep -q " $root/" /proc/mounts; then
    echo "fresh-check: something is still mounted under $root; not removing it" >&2
  elif [ $keep -eq 0 ]; then
    rm -rf "$root"
  else
    echo "fresh-check: root kept in $root" >&2
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$(date +%s)
say "debootstrap $suite (minbase) into $root"
args=(--variant=minbase --include=sudo,ca-certificates)
if [ -n "$cache" ]; then
  mkdir -p "$cache/debootstrap" "$cache/apt"
  args+=(--cache-dir="$cache/debootstrap")
fi
debootstrap "${args[@]}" "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -n 30 "$root.debootstrap.log" >&2; exit 1; }
rm -f "$root.debootstrap.log"
t_boot=$(($(date +%s) - t0))

# What a freshly installed Debian 12 has: its release, updates and security.
cat >"$root/etc/apt/sources.list" <<EOT
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://security.debian.org/debian-security $suite-security main
EOT
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The chroot shares the host's hostname: name it, or sudo warns on each use.
printf '127.0.0.1 localhost %s\n' "$(hostname)" >"$root/etc/hosts"
chroot "$root" useradd --create-home --shell /bin/bash "$user"
echo "$user ALL=(ALL) NOPASSWD: ALL" >"$root/etc/sudoers.d/$user"
chmod 0440 "$root/etc/sudoers.d/$user"

# A clean clone of HEAD, as `git clone` would give the new user.
head=$(git -C "$src" rev-parse HEAD)
git clone -q --no-hardlinks "$src" "$root/home/$user/capuchin"
git -C "$root/home/$user/capuchin" checkout -q --detach "$head"
chroot "$root" chown -R "$user:$user" "/home/$user/capuchin"
say "clone of $(git -C "$src" log -1 --format='%h %s' "$head" | cut -c1-70)"

mnt -t proc proc "$root/proc"
mnt -t sysfs sysfs "$root/sys"
mnt --bind /dev "$root/dev"
mnt --bind /dev/pts "$root/dev/pts"
mnt -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
[ -n "$cache" ] && mnt --bind "$cache/apt" "$root/var/cache/apt/archives"

as_user() { # command line, run by the new user in their clone
  chroot "$root" /usr/bin/env -i HOME="/home/$user" USER="$user" LOGNAME="$user" \
    PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM=dumb \
    /usr/sbin/runuser -u "$user" -- bash -c "cd ~/capuchin && $1"
}

say "./deploy/demo.sh"
t=$(date +%s)
demo_status=0
as_user ./deploy/demo.sh || demo_status=$?
t_demo=$(($(date +%s) - t))
echo "fresh-check: demo.sh exited $demo_status after ${t_demo} s"

test_cmd=./deploy/test.sh
[ $quick -eq 1 ] && test_cmd="CAP_TEST_QUICK=1 ./deploy/test.sh"
say "$test_cmd"
t=$(date +%s)
test_status=0
as_user "$test_cmd" || test_status=$?
t_test=$(($(date +%s) - t))
echo "fresh-check: test.sh exited $test_status after ${t_test} s"

say "summary"
printf '  %-44s %5s s\n' "debootstrap (minbase)" "$t_boot" \
  "./deploy/demo.sh (exit $demo_status)" "$t_demo" \
  "$test_cmd (exit $test_status)" "$t_test" \
  "total" "$(($(date +%s) - t0))"
[ $demo_status -eq 0 ] && [ $test_status -eq 0 ]
