# Sourced by the integration scripts (test_*.sh): a temporary folder, a real
# capuchind on a socket and database in it, and what every script checks
# with. Expects CAP_BIN_DIR and CAP_SOURCE_DIR; sets bin, src, tmp.
#   start_daemon [capuchind options...]  start it ($tmp/d.sock, $tmp/d.db,
#                                         log appended to $tmp/d.log)
#   check MESSAGE STATUS                  print ok/FAIL, remember a failure
#   field JSON_LINE NAME                  a field of a replay's --json line
#   stop_also PID                         kill PID too when the script exits
bin=${CAP_BIN_DIR:?}
src=${CAP_SOURCE_DIR:?}
for t in capuchind capuchin-replay capuchin-query; do
  [ -x "$bin/$t" ] || { echo "FAIL: $bin/$t is missing (it is part of the build)"; exit 1; }
done
tmp=$(mktemp -d)
dpid=
also=
fail=0
cleanup() {
  local p
  for p in $also; do kill "$p" 2>/dev/null; done
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
stop_also() { also="$also $1"; }
check() {
  if [ "$2" -ne 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok   $1"; fi
}
start_daemon() {
  rm -f "$tmp/d.sock"
  "$bin/capuchind" --socket "$tmp/d.sock" --db "$tmp/d.db" --log-level info \
    "$@" 2>>"$tmp/d.log" &
  dpid=$!
  local _
  for _ in $(seq 100); do [ -S "$tmp/d.sock" ] && return 0; sleep 0.1; done
  echo "capuchind did not start"; cat "$tmp/d.log"; exit 1
}
field() {
  printf '%s\n' "$1" | sed -n "s/.*\"$2\":\\(\"[^\"]*\"\\|[-0-9.]*\\).*/\\1/p" | tr -d '"'
}
