#!/usr/bin/env bash
# libcapuchin-client.so exports exactly the functions its installed headers
# declare CAP_EXTERN: nothing of the policy library, the protocol, the
# generated protobuf-c code or the client's cap__ internals (a training
# process loads other libraries that could bind to them), and no declared
# function missing.
#   test_symbols.sh LIB HEADER_DIR...
set -euo pipefail
lib=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The name before the '(' on each CAP_EXTERN line of the headers.
for dir in "$@"; do cat "$dir"/*.h; done | sed -n 's/^CAP_EXTERN[^(]*[ *]\([A-Za-z_][A-Za-z0-9_]*\)(.*/\1/p' |
  sort -u >"$tmp/declared"
# Defined dynamic symbols only (undefined ones are what the library imports).
# Names that begin with '_' belong to the C implementation: _init, _fini,
# and the sanitizer runtimes' hooks in an instrumented build.
nm -D --defined-only "$lib" | awk '{ print $NF }' | sed 's/@.*//' | grep -v '^_' |
  sort -u >"$tmp/exported"

n_decl=$(wc -l <"$tmp/declared")
n_exp=$(wc -l <"$tmp/exported")
echo "declared CAP_EXTERN: $n_decl, exported: $n_exp"
fail=0
if [ "$n_decl" -lt 20 ]; then
  echo "FAIL: only $n_decl CAP_EXTERN declarations found in $*"
  fail=1
fi
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
if [ -n "$extra" ]; then
  echo "FAIL: exported but not declared CAP_EXTERN in an installed header:"
  printf '  %s\n' $extra
  fail=1
fi
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
if [ -n "$missing" ]; then
  echo "FAIL: declared CAP_EXTERN but not exported:"
  printf '  %s\n' $missing
  fail=1
fi
bad=$(grep -v '^cap_' "$tmp/exported" || true)
if [ -n "$bad" ]; then
  echo "FAIL: exported names outside the cap_ prefix:"
  printf '  %s\n' $bad
  fail=1
fi
# libcap exports names with the same cap_ prefix, and a training process
# often has it loaded globally (PyTorch: libtorch_global_deps -> libmpi ->
# hwloc -> libudev -> libcap): a name both define binds the adapter's calls
# to libcap's. Checked against the system's libcap where there is one.
libcap=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | awk '/libcap\.so\.2 / && !found { print $NF; found = 1 }')
if [ -n "$libcap" ] && [ -e "$libcap" ]; then
  nm -D --defined-only "$libcap" | awk '{ print $NF }' | sed 's/@.*//' | sort -u >"$tmp/libcap"
  clash=$(comm -12 "$tmp/exported" "$tmp/libcap")
  if [ -n "$clash" ]; then
    echo "FAIL: exported names that libcap ($libcap) defines too:"
    printf '  %s\n' $clash
    fail=1
  fi
else
  echo "note: no libcap.so.2 found: the clash check against it did not run"
fi
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" != libcapuchin-client.so.1 ]; then
  echo "FAIL: SONAME '$soname', want libcapuchin-client.so.1"
  fail=1
fi
[ $fail -eq 0 ] && echo "ok: $n_exp symbols, all declared; SONAME $soname"
exit $fail
