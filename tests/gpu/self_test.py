#!/usr/bin/env python3
"""A GPU tool's self-test, run where there is no GPU (tests/gpu/CMakeLists.txt):

    self_test.py step_profile|live_census

Exit 77 (ctest's skip) where this interpreter has no PyTorch.
"""
import importlib
import os
import sys

try:
    import torch  # noqa: F401 - the tools need it
except ImportError:
    print("skipped: this interpreter has no PyTorch")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.exit(importlib.import_module(sys.argv[1]).self_test())
