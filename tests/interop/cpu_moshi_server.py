"""Kyutai's `python -m moshi.server` (PyPI moshi==0.2.13) on a CPU, for the interop test.

The reference server's warm-up calls `torch.cuda.synchronize()` unconditionally, which a CPU
build of torch refuses; that one call becomes a no-op here and everything else runs as
published. Usage: python cpu_moshi_server.py [moshi.server arguments]
"""

import runpy
import sys

import torch

torch.cuda.synchronize = lambda *args, **kwargs: None
sys.argv[0] = "moshi.server"
runpy.run_module("moshi.server", run_name="__main__", alter_sys=True)
