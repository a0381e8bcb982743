"""Knobs for scripts/gpu/bench_variants.py, read at interpreter start by every child (put this folder first on
PYTHONPATH). Not part of the tool: they try settings that the tool does not expose. A sitecustomize found further on
PYTHONPATH (a FlashInfer package stub, say) still runs: FIMOE_SITE_NEXT names its folder."""

import atexit
import os
import sys
import time

if os.environ.get("FIMOE_SITE_NEXT"):
    path = os.path.join(os.environ["FIMOE_SITE_NEXT"], "sitecustomize.py")
    with open(path) as f:
        exec(compile(f.read(), path, "exec"))  # the stub named by the person running the bench
if os.environ.get("FIMOE_SWITCH"):  # seconds: the interpreter's thread switch interval (default 0.005)
    sys.setswitchinterval(float(os.environ["FIMOE_SWITCH"]))
if os.environ.get("FIMOE_IO_BLOCK"):  # bytes per read/write call and staging block
    import fimoe_convert.budget as _budget

    _budget.IO_BLOCK = int(os.environ["FIMOE_IO_BLOCK"])
if os.environ.get("FIMOE_MARK"):  # registered first, so it runs last of the atexit handlers
    atexit.register(lambda: print(f"[atexit-last] {time.time():.3f}", file=sys.stderr, flush=True))
