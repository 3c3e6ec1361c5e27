#!/usr/bin/env bash
# Fetch, on a Debian 12 machine with apt, the .deb files that
# deploy/gpu-check.sh needs to build Capuchin on a machine that has no
# package registry (the lent GPU machine: PyTorch, CUDA, CMake and a C
# compiler, but no libuv/protobuf-c/SQLite development files, no protoc-c and
# maybe no pkg-config). gpu-check.sh unpacks them with `dpkg -x` into a
# private prefix inside its build folder; nothing is installed system-wide.
#
#   ./deploy/fetch-gpu-debs.sh [DIR]      (default DIR: deploy/gpu-debs)
#
# DIR is git-ignored (deploy/gpu-debs/ is in .gitignore): ~4 MB of binaries
# do not belong in the history. To use them on the lent machine, send the
# folder along with the working tree: the device tool's `run` takes
# `carry: ["deploy/gpu-debs"]`. Any other way of copying the folder next to
# the checkout works as well.
#
# What is fetched: the development packages (headers, .so links, .pc files),
# the runtime libraries they point to, protoc-c with the C++ protobuf
# libraries it links, and pkgconf (which provides pkg-config). What is NOT
# fetched, because every machine with a C compiler and PyTorch has it: libc6
# (and libc6-dev), libstdc++6, libgcc-s1, zlib1g. The script checks that this
# list is closed: every dependency of a fetched package is either fetched or
# in that assumed-present set, and it fails naming any that is neither.
#
# The libraries are Debian 12's: they need glibc >= 2.36 on the target
# (Debian 12, Ubuntu 23.04 or newer). gpu-check.sh checks that they run there.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in
  -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
esac
dir=$(realpath -m "${1:-$src/deploy/gpu-debs}")

# Packages gpu-check.sh unpacks. Keep in step with the build's
# pkg_check_modules()/find_program() calls in CMakeLists.txt.
fetch=(
  libuv1-dev libuv1                       # libuv (the daemon's event loop)
  libprotobuf-c-dev libprotobuf-c1        # protobuf-c runtime
  protobuf-c-compiler libprotoc32 libprotobuf32   # protoc-c and what it links
  libsqlite3-dev libsqlite3-0             # SQLite (the daemon's store)
  pkgconf pkgconf-bin libpkgconf3         # pkg-config
)
# Present on any machine that can compile C and run PyTorch.
assumed=(libc6 libc6-dev libc-dev libstdc++6 libgcc-s1 gcc-12-base zlib1g)

command -v apt-get >/dev/null || { echo "fetch-gpu-debs: needs apt-get (Debian 12)" >&2; exit 1; }
. /etc/os-release
if [ "${ID:-}" != debian ] || [ "${VERSION_ID:-}" != 12 ]; then
  echo "fetch-gpu-debs: note: this is $PRETTY_NAME, not Debian 12; gpu-check.sh was tested with Debian 12's packages" >&2
fi

# The closure check: Depends and Pre-Depends of each fetched package.
bad=()
for p in "${fetch[@]}"; do
  while read -r dep; do
    dep=${dep%%:*} # libfoo:any -> libfoo
    ok=0
    for q in "${fetch[@]}" "${assumed[@]}"; do [ "$dep" = "$q" ] && ok=1 && break; done
    [ $ok -eq 1 ] || bad+=("$p -> $dep")
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$p" |
           sed -n 's/^ *\(Pre\)\{0,1\}Depends: *//p' | tr -d '<>' | sort -u)
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'fetch-gpu-debs: a dependency is neither fetched nor assumed present: %s\n' "${bad[@]}" >&2
  echo "fetch-gpu-debs: add it to fetch=() (or to assumed=() if every target has it)" >&2
  exit 1
fi

mkdir -p "$dir"
rm -f "$dir"/*.deb
# apt-get download writes into the current folder. As root it warns that the
# _apt user cannot write there; the download itself works.
(cd "$dir" && apt-get download "${fetch[@]}" 2>&1 | grep -v "couldn't be accessed by user '_apt'" >&2) || true
n=$(ls "$dir"/*.deb 2>/dev/null | wc -l)
if [ "$n" -ne ${#fetch[@]} ]; then
  echo "fetch-gpu-debs: got $n of ${#fetch[@]} packages in $dir (is apt reachable? try apt-get update)" >&2
  exit 1
fi
# A manifest, so gpu-check.sh can tell a complete folder from a partial one.
(cd "$dir" && ls *.deb >MANIFEST)
echo "fetch-gpu-debs: $n packages, $(du -sh "$dir" | cut -f1) in $dir"
