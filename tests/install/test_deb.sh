#!/usr/bin/env bash
# cpack -G DEB builds the three packages of deploy/package.cmake; each
# holds what it should and nothing of the others (dpkg-deb -c), with the
# control fields and maintainer scripts a Debian system needs.
set -euo pipefail
build=${CAP_BINARY_DIR:?}
cpack=${CAP_CPACK:-cpack}
command -v dpkg-deb >/dev/null || { echo "dpkg-deb missing (not a Debian system?)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # message, command...
  local msg=$1
  shift
  if "$@"; then echo "ok   $msg"; else echo "FAIL: $msg"; fail=1; fi
}

(cd "$tmp" && "$cpack" --config "$build/CPackConfig.cmake" -G DEB -B "$tmp/out") \
  >"$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log"; exit 1; }
ls "$tmp/out"/*.deb

deb() { # package name -> its file
  local f
  f=$(ls "$tmp/out/$1"_*.deb 2>/dev/null | head -n 1)
  [ -n "$f" ] || { echo "FAIL: no $1 package" >&2; return 1; }
  echo "$f"
}
daemon=$(deb capuchind) && lib=$(deb libcapuchin-client1) && dev=$(deb libcapuchin-client-dev) ||
  exit 1

files() { dpkg-deb -c "$1" | awk '{ print $6 }' | sed 's|^\./|/|; s|/$||' | grep -v '^/*$'; }
has() { # deb, path regex
  files "$1" | grep -Eq "^$2\$"
}
field() { dpkg-deb -f "$1" "$2"; }

for p in capuchind capuchin-query capuchin-sim capuchin-replay; do
  check "capuchind: /usr/bin/$p" has "$daemon" "/usr/bin/$p"
done
check "capuchind: man pages" has "$daemon" "/usr/share/man/man8/capuchind\.8(\.gz)?"
for p in capuchin-query capuchin-sim capuchin-replay; do
  check "capuchind: man page of $p" has "$daemon" "/usr/share/man/man1/$p\.1(\.gz)?"
done
check "capuchind: units" has "$daemon" "/usr/lib/systemd/system/capuchind\.service"
check "capuchind: socket unit" has "$daemon" "/usr/lib/systemd/system/capuchind\.socket"
check "capuchind: config in /etc" has "$daemon" "/etc/capuchin/capuchind\.conf"
check "capuchind: the config is a conffile" \
  bash -c 'dpkg-deb -I "$0" conffiles | grep -qx /etc/capuchin/capuchind.conf' "$daemon"
check "capuchind: postinst creates the capuchin user" \
  bash -c 'dpkg-deb -I "$0" postinst | grep -q "adduser --system"' "$daemon"
dpkg-deb --fsys-tarfile "$daemon" | tar -xO ./usr/lib/systemd/system/capuchind.service >"$tmp/unit"
check "capuchind: the unit runs /usr/bin/capuchind with /etc's config" \
  grep -q '^ExecStart=/usr/bin/capuchind --config /etc/capuchin/capuchind.conf ' "$tmp/unit"
check "capuchind: no library or header" \
  bash -c '! dpkg-deb -c "$0" | grep -Eq "libcapuchin|/include/"' "$daemon"
check "capuchind depends on libuv1, libsqlite3-0, libprotobuf-c1" \
  bash -c 'd=$(dpkg-deb -f "$0" Depends); [[ $d == *libuv1* && $d == *libsqlite3-0* && $d == *libprotobuf-c1* ]]' "$daemon"

lib_files=$(files "$lib" | grep -v '/$' | grep -v '^/usr$\|^/usr/lib$\|^/usr/share' || true)
check "libcapuchin-client1: the versioned library and its SONAME link only" \
  test "$(echo "$lib_files" | sed 's|.*/||' | sort | tr '\n' ' ')" = \
  "libcapuchin-client.so.1 libcapuchin-client.so.1.1.0 "
check "libcapuchin-client1: ldconfig trigger" \
  bash -c 'dpkg-deb -I "$0" triggers | grep -q ldconfig' "$lib"
check "libcapuchin-client1: section libs" test "$(field "$lib" Section)" = libs

for h in client.h error.h extern.h framework.h framework_alloc.h types.h; do
  check "libcapuchin-client-dev: $h" has "$dev" "/usr/include/capuchin/$h"
done
check "libcapuchin-client-dev: only the public headers" \
  test "$(files "$dev" | grep -c '^/usr/include/capuchin/.*\.h$')" = 6
check "libcapuchin-client-dev: the .so link" has "$dev" "/usr/lib/(.*/)?libcapuchin-client\.so"
check "libcapuchin-client-dev: pkg-config" has "$dev" "/usr/lib/(.*/)?pkgconfig/capuchin-client\.pc"
check "libcapuchin-client-dev: CMake package" \
  has "$dev" "/usr/lib/(.*/)?cmake/Capuchin/CapuchinConfig\.cmake"
check "libcapuchin-client-dev: CMake targets" \
  has "$dev" "/usr/lib/(.*/)?cmake/Capuchin/CapuchinTargets\.cmake"
check "libcapuchin-client-dev depends on the library of its version" \
  bash -c '[[ $(dpkg-deb -f "$0" Depends) == "libcapuchin-client1 (= $(dpkg-deb -f "$1" Version))" ]]' \
  "$dev" "$lib"
exit $fail
