#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then use that prefix as a new
# user would: every public header compiles on its own (C11, and C++ when a
# compiler is there), the consumer program (consumer/consumer.c) builds
# with pkg-config and with find_package(Capuchin), and both builds run
# against the prefix's own capuchind; capuchin-query then finds the job.
set -euo pipefail
src=${CAP_SOURCE_DIR:?}
build=${CAP_BINARY_DIR:?}
cc=${CAP_C_COMPILER:-cc}
cmake=${CAP_CMAKE:-cmake}
tmp=$(mktemp -d)
dpid=
cleanup() {
  if [ -n "$dpid" ] && kill "$dpid" 2>/dev/null; then wait "$dpid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
check() { # message, command...
  local msg=$1
  shift
  if "$@"; then echo "ok   $msg"; else echo "FAIL: $msg"; fail=1; fi
}

# An instrumented build's library needs the same runtime in the program.
flags=(-std=c11 -Wall -Wextra -Werror -pedantic)
[ -n "${CAP_SANITIZE:-}" ] && flags+=("-fsanitize=$CAP_SANITIZE")

prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log"; exit 1; }
libdir=$(dirname "$(find "$prefix" -name 'libcapuchin-client.so.1' | head -n 1)")
echo "installed into $prefix (library in ${libdir#"$prefix"/})"

for p in capuchind capuchin-query capuchin-sim capuchin-replay; do
  check "bin/$p" test -x "$prefix/bin/$p"
done
check "man pages" test -f "$prefix/share/man/man8/capuchind.8" -a \
  -f "$prefix/share/man/man1/capuchin-query.1" -a -f "$prefix/share/man/man1/capuchin-sim.1" -a \
  -f "$prefix/share/man/man1/capuchin-replay.1"
check "systemd units run the installed daemon" \
  grep -q "^ExecStart=$prefix/bin/capuchind --config $prefix/etc/capuchin/capuchind.conf" \
  "$prefix/lib/systemd/system/capuchind.service"
check "socket unit" test -f "$prefix/lib/systemd/system/capuchind.socket"
check "config" test -f "$prefix/etc/capuchin/capuchind.conf"
check "library is libcapuchin-client.so.1 with its link" \
  test -L "$libdir/libcapuchin-client.so" -a -L "$libdir/libcapuchin-client.so.1"
check "no static or internal library installed" \
  test -z "$(find "$prefix" -name '*.a' -o -name 'libcap_*')"

# The public headers: exactly these, each self-contained.
headers=$(cd "$prefix/include/capuchin" && ls)
check "headers: $(echo $headers)" test "$(echo $headers)" = "client.h error.h extern.h framework.h framework_alloc.h types.h"
for h in $headers; do
  check "<capuchin/$h> compiles alone (C11)" \
    "$cc" "${flags[@]}" -fsyntax-only -I"$prefix/include" -x c - \
    <<<"#include <capuchin/$h>"$'\n'"typedef int not_empty;"
  if command -v c++ >/dev/null; then
    check "<capuchin/$h> compiles alone (C++)" \
      c++ -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" -x c++ - <<<"#include <capuchin/$h>"
  fi
done

# With pkg-config: the .pc finds the prefix from where it lies.
export PKG_CONFIG_PATH=$libdir/pkgconfig
check "pkg-config knows capuchin-client $(pkg-config --modversion capuchin-client)" \
  pkg-config --exists capuchin-client
pc_libdir=$(pkg-config --variable=libdir capuchin-client)
check "pkg-config libdir is the prefix's" test "$(realpath "$pc_libdir")" = "$(realpath "$libdir")"
# shellcheck disable=SC2046
check "consumer builds with pkg-config" \
  "$cc" "${flags[@]}" -o "$tmp/consumer-pc" "$src/tests/install/consumer/consumer.c" \
  $(pkg-config --cflags --libs capuchin-client) -Wl,-rpath,"$pc_libdir"

# With CMake: find_package(Capuchin) -> Capuchin::client.
cflags=""
[ -n "${CAP_SANITIZE:-}" ] && cflags="-fsanitize=$CAP_SANITIZE"
check "consumer builds with find_package(Capuchin)" \
  bash -c '"$0" -S "$1" -B "$2" -DCMAKE_PREFIX_PATH="$3" -DCMAKE_C_COMPILER="$4" \
             -DCMAKE_C_FLAGS="$5" >"$2.log" 2>&1 && "$0" --build "$2" >>"$2.log" 2>&1 ||
           { cat "$2.log"; exit 1; }' \
  "$cmake" "$src/tests/install/consumer" "$tmp/consumer-cmake" "$prefix" "$cc" "$cflags"
for b in "$tmp/consumer-pc" "$tmp/consumer-cmake/consumer"; do
  [ -x "$b" ] || continue
  check "${b#"$tmp"/} loads the installed library" \
    bash -c 'ldd "$0" | grep -q "libcapuchin-client.so.1 => $1/"' "$b" "$libdir"
done
[ $fail -eq 0 ] || exit 1

"$prefix/bin/capuchind" --socket "$tmp/d.sock" --db "$tmp/d.db" --log-level info \
  2>"$tmp/d.log" &
dpid=$!
for _ in $(seq 100); do [ -S "$tmp/d.sock" ] && break; sleep 0.1; done
[ -S "$tmp/d.sock" ] || { echo "FAIL: installed capuchind did not start"; cat "$tmp/d.log"; exit 1; }
check "consumer (pkg-config) against the installed capuchind" "$tmp/consumer-pc" "$tmp/d.sock"
check "consumer (CMake) against the installed capuchind" "$tmp/consumer-cmake/consumer" "$tmp/d.sock"
check "capuchin-query lists the consumer's job" \
  bash -c '"$0" --db "$1" jobs | grep -q install-consumer' "$prefix/bin/capuchin-query" "$tmp/d.db"

# The PyTorch adapter, where the build has it (Python 3 headers found): the
# installed package imports from the prefix and its extension loads the
# prefix's library.
if [ -n "${CAP_PYTHON:-}" ]; then
  pkg=$(find "$prefix" -type d -name capuchin -path '*-packages/*' | head -n 1)
  check "python package installed (${pkg#"$prefix"/})" test -n "$pkg" -a -f "$pkg/__init__.py"
  if [ -n "$pkg" ]; then
    check "import capuchin._client from the prefix loads the prefix's library" \
      bash -c 'ldd "$(ls "$1"/_client*.so)" | grep -q "libcapuchin-client.so.1 => $2/" &&
               PYTHONPATH="$(dirname "$1")" "$0" -c "import capuchin._client as c; print(c.socket_path(\"/x\"))" |
               grep -qx /x' "$CAP_PYTHON" "$pkg" "$libdir"
    if "$CAP_PYTHON" -c "import torch" 2>/dev/null; then
      check "import capuchin (with torch) from the prefix" \
        env PYTHONPATH="$(dirname "$pkg")" "$CAP_PYTHON" -c "import capuchin; capuchin.Manager(budget='50%')"
    fi
  fi
fi
[ $fail -eq 0 ] || { echo "capuchind log:"; tail -n 20 "$tmp/d.log"; }
exit $fail
