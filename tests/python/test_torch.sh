#!/usr/bin/env bash
# One scenario of test_torch_adapter.py against a real capuchind.
#   test_torch.sh SCENARIO MODEL
# The daemon evicts weights and optimizer state only where nothing else
# fits (--evict-persistent auto); the adapter carries such plans out by
# resizing their storages to 0 and back (README, "PyTorch").
set -uo pipefail
source "${CAP_SOURCE_DIR:?}/tests/integration/daemon.bash"
py=${CAP_PYTHON:-/usr/bin/python3}
"$py" -c "import torch, capuchin" 2>/dev/null || {
  echo "skip: $py cannot import torch and capuchin"
  exit 77
}
start_daemon --evict-persistent auto
export CAPUCHIN_SOCKET=$tmp/d.sock CAP_DAEMON_PID=$dpid
"$py" "$src/tests/python/test_torch_adapter.py" "$1" "$2"
rc=$?
[ $rc -eq 0 ] || { echo "capuchind log:"; tail -n 20 "$tmp/d.log"; }
exit $rc
