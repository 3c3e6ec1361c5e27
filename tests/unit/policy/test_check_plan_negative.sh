#!/usr/bin/env bash
# The outsider plan checker (tests/tools/check_plan.py) can fail: tiny
# hand-made traces and plans where a recompute list reads (a) a source the
# plan dropped and the list does not recompute, (b) a swapped-out source
# whose prefetch comes with or after the back-access (a prefetch is issued
# as its trigger op starts, after that op's lists) or on demand at its own
# later back-access, (c) a source the framework freed, (d) an in-trigger after the
# back-access (static), (e) a source written in place since the listed op
# ran, or a list missing an in-place write of its tensor -- each must exit 1 naming the reason -- and the
# same plans made right (the list replays the dropped source's op, the
# prefetch is triggered by the op before the back-access) must exit 0.
set -u
SRC=${CAP_SOURCE_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)}
CHECK=$SRC/tests/tools/check_plan.py
if [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3
elif command -v python3 >/dev/null 2>&1; then PY=python3
else echo "SKIP: no python3"; exit 77; fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/cap_checkneg.XXXXXX") || exit 1
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT
fails=0

# A chain: 2 = conv(0,1), 3 = relu(2), 4 = mul(3), 5 = sum(4), then the
# backward reads 5,4 / 6,3 / 7,2. Accesses: 3 at ops 1,2,5; 4 at 2,3,4;
# 5 at 3,4; 6 at 4,5.
cat >"$TMP/chain.trace" <<'EOF'
capuchin-trace 1
meta model=tiny resident_bytes=0
tensor 0 100 input
tensor 1 10 param
tensor 2 100 activation
tensor 3 100 activation
tensor 4 100 activation
tensor 5 100 activation
tensor 6 100 activation
tensor 7 100 activation
tensor 8 10 activation
op 0 0 10 aten.convolution.default 0,1 2
op 1 20 30 aten.relu.default 2 3
op 2 40 50 aten.mul.Tensor 3 4
op 3 60 70 aten.sum.default 4 5
op 4 80 90 aten.mul_backward.default 5,4 6
op 5 100 110 aten.threshold_backward.default 6,3 7
op 6 120 130 aten.convolution_backward.default 7,2,0 8
free 95 4
free 95 5
free 115 3
free 115 6
free 135 2
free 135 7
EOF

# The same, but op 1 also makes a mask 9 that op 2 reads and the framework
# frees right after op 2.
sed -e 's/^tensor 8 10 activation$/tensor 8 10 activation\ntensor 9 100 activation/' \
    -e 's/^op 1 20 30 aten.relu.default 2 3$/op 1 20 30 aten.native_dropout.default 2 3,9/' \
    -e 's/^op 2 40 50 aten.mul.Tensor 3 4$/op 2 40 50 aten.mul.Tensor 3,9 4/' \
    -e 's/^free 95 4$/free 55 9\nfree 95 4/' "$TMP/chain.trace" >"$TMP/mask.trace"

# The chain with an in-place op 3 (3 += 1) after op 2 read tensor 3; the
# ops after it shift by one.
awk '/^op 3 /{print "op 3 52 54 aten.add_.Tensor 3,1 3"}
     /^op [3-6] /{$2 = $2 + 1} {print}' "$TMP/chain.trace" >"$TMP/inplace.trace"

plan() { # name, actions JSON
  printf '{"trace":"tiny","budget_bytes":1000,"policy":"hand","version":1,"actions":[%s]}\n' \
    "$2" >"$TMP/$1.json"
}
REC4='{"tensor":4,"evict_after_access":2,"method":"recompute","recompute_ops":[2]}'
plan a_dropped "{\"tensor\":3,\"evict_after_access\":2,\"method\":\"recompute\",\"recompute_ops\":[1]},$REC4"
plan a_valid "{\"tensor\":3,\"evict_after_access\":2,\"method\":\"recompute\",\"recompute_ops\":[1]},{\"tensor\":4,\"evict_after_access\":2,\"method\":\"recompute\",\"recompute_ops\":[1,2]}"
plan b_late "{\"tensor\":3,\"evict_after_access\":2,\"method\":\"swap\",\"prefetch_at\":{\"tensor\":6,\"access\":2}},$REC4"
plan b_demand "{\"tensor\":3,\"evict_after_access\":2,\"method\":\"swap\",\"prefetch_at\":null},$REC4"
plan b_same "{\"tensor\":3,\"evict_after_access\":2,\"method\":\"swap\",\"prefetch_at\":{\"tensor\":5,\"access\":2}},$REC4"
plan b_valid "{\"tensor\":3,\"evict_after_access\":2,\"method\":\"swap\",\"prefetch_at\":{\"tensor\":5,\"access\":1}},$REC4"
plan c_freed "$REC4"
plan e_written '{"tensor":4,"evict_after_access":2,"method":"recompute","recompute_ops":[2]}'
plan e_valid '{"tensor":4,"evict_after_access":2,"method":"recompute","recompute_ops":[1,2]}'
plan e_writer '{"tensor":3,"evict_after_access":3,"method":"recompute","recompute_ops":[1]}'
plan d_trigger '{"tensor":3,"evict_after_access":2,"method":"swap","prefetch_at":{"tensor":8,"access":1}}'

# expect NAME TRACE PLAN RC [REGEX]
expect() {
  local out rc
  out=$("$PY" "$CHECK" "$TMP/$2.trace" "$TMP/$3.json" 2>&1)
  rc=$?
  if [ "$rc" != "$4" ] || { [ -n "${5:-}" ] && ! grep -Eq "$5" <<<"$out"; }; then
    echo "FAIL $1: exit $rc (want $4${5:+, output matching /$5/})"
    sed 's/^/    /' <<<"$out"
    fails=$((fails + 1))
  else
    echo "ok   $1: exit $rc: $(grep -m1 '^INVALID' <<<"$out" || tail -n1 <<<"$out")"
  fi
}

expect "a: list reads a dropped source it does not recompute" chain a_dropped 1 \
  'INVALID action 1 .*op 4 .*recompute op 2 .*needs tensor 3: dropped by the plan'
expect "a: the list replays the dropped source's op" chain a_valid 0 '2 actions, 0 invalid'
expect "b: source's prefetch triggered after the back-access" chain b_late 1 \
  'INVALID action 1 .*needs tensor 3: swapped out .*no prefetch issued by op 4'
expect "b: source's prefetch on demand at its own later access" chain b_demand 1 \
  'INVALID action 1 .*needs tensor 3: swapped out .*no prefetch issued by op 4'
# a prefetch is issued as its trigger op starts, after that op's lists
expect "b: source's prefetch triggered by the back-access itself" chain b_same 1 \
  'INVALID action 1 .*needs tensor 3: swapped out .*no prefetch issued by op 4'
expect "b: source's prefetch triggered by the op before" chain b_valid 0 '2 actions, 0 invalid'
expect "c: list reads a source freed before the back-access" mask c_freed 1 \
  'INVALID action 0 .*needs tensor 9: freed by the framework after op 2'
expect "c: the same plan without the freed mask" chain c_freed 0 '1 actions, 0 invalid'
expect "d: in-trigger after the back-access (static)" chain d_trigger 1 \
  'INVALID action 0 .*static: in-trigger op 6 .*after the back-access op 5'

expect "e: list reads a source written in place since" inplace e_written 1 \
  'INVALID action 0 .*needs tensor 3: written in place by op 3 '
expect "e: the list recomputes that source first" inplace e_valid 0 '1 actions, 0 invalid'
expect "e: list misses an in-place write of the tensor (static)" inplace e_writer 1 \
  'INVALID action 0 .*static: op 3 \(aten.add_.Tensor\) writes tensor 3'

# Bad usage and unreadable input: 64.
out=$("$PY" "$CHECK" "$TMP/chain.trace" 2>&1); rc=$?
[ $rc = 64 ] || { echo "FAIL usage: exit $rc, want 64"; fails=$((fails + 1)); }
echo 'not json' >"$TMP/bad.json"
out=$("$PY" "$CHECK" "$TMP/chain.trace" "$TMP/bad.json" 2>&1); rc=$?
[ $rc = 64 ] || { echo "FAIL unreadable plan: exit $rc, want 64"; fails=$((fails + 1)); }

if [ $fails -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checker self-tests passed"
