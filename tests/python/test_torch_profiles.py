"""The per-op path's C storages (python/src/storages.c) report what the
Python path reports: the measured step of the test CNN and transformer,
once with new storages adopted in C and once through the Python path
(Manager._c_storages = False), gives the daemon the same profile: the same
ops with the same tensor ids, the same tensors (bytes, kind, producer) and
every free after the same op. Only the times may differ.

    CAP_BIN_DIR=build/bin PYTHONPATH=build/python python3 test_torch_profiles.py

Starts its own capuchind per run. Exits 77 where torch is missing.
"""
import bisect
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

try:
    import torch  # noqa: F401
except ImportError:
    print("skip: no torch")
    sys.exit(77)

import capuchin

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import build, train_step  # noqa: E402


def measured_profile(model, c_storages):
    tmp = tempfile.mkdtemp()
    sock, db = os.path.join(tmp, "d.sock"), os.path.join(tmp, "d.db")
    daemon = subprocess.Popen([os.path.join(os.environ["CAP_BIN_DIR"], "capuchind"),
                               "--socket", sock, "--db", db],
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        m, o, batches = build(model)
        mgr = capuchin.Manager(budget="30%", job=model, socket=sock, plan_wait_s=20)
        mgr._c_storages = c_storages
        for i in range(2):  # the probe, the measured step
            with mgr.step():
                train_step(m, o, *batches(i))
        modes = [it["mode"] for it in mgr.iterations]
        mgr.close()
    finally:
        daemon.terminate()
        daemon.wait()
    if modes != ["probe", "measured"]:
        raise AssertionError("%s: steps ran %s" % (model, modes))
    c = sqlite3.connect(db)
    ops = c.execute("SELECT seq, end_ns, name, inputs, outputs FROM profile_ops "
                    "WHERE profile_id = 1 ORDER BY seq").fetchall()
    ends = [r[1] for r in ops]
    tensors = c.execute("SELECT tensor, bytes, kind, producer_op FROM profile_tensors "
                        "WHERE profile_id = 1 ORDER BY tensor").fetchall()
    # a free's place: after how many ops it came
    frees = sorted((bisect.bisect_right(ends, t), tid) for t, tid in c.execute(
        "SELECT t_ns, tensor FROM profile_frees WHERE profile_id = 1"))
    c.close()
    return {"ops": [(r[0],) + r[2:] for r in ops], "tensors": tensors, "frees": frees}


def main():
    failed = 0
    for model in ("cnn", "transformer"):
        c_path = measured_profile(model, True)
        py_path = measured_profile(model, False)
        for k in ("ops", "tensors", "frees"):
            ok = c_path[k] == py_path[k] and len(c_path[k]) > 0
            failed += not ok
            print("%s %s: %d %s, C path and Python path %s" % (
                "ok  " if ok else "FAIL", model, len(c_path[k]), k,
                "the same" if ok else "differ"))
            if not ok:
                print("  only C path:", sorted(set(c_path[k]) - set(py_path[k]))[:5])
                print("  only Python path:", sorted(set(py_path[k]) - set(c_path[k]))[:5])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
