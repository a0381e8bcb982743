"""Where the CUDA converter's time goes, one step at a time, on the fixture bench_convert uses: for every
bf16 unit of a flash-geometry checkpoint, time (a) pinned reads of its inputs, (b) the target's run, and
inside it (c) pinned output allocation alone. Prints milliseconds per unit.

usage: python3 scripts/diag_cuda_unit.py [--layers 2]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--work", default="/tmp/fimoe-diag")
    args = ap.parse_args()
    from fimoe_convert.source import open_source
    from fimoe_convert.targets import TargetOptions, get_target
    from fimoe_convert.testing import make_checkpoint

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    src = make_checkpoint(work / "src", "flash-geometry", layers=args.layers)
    source = open_source(str(src))
    tgt = get_target("bf16")
    units = tgt.units(source.model, TargetOptions(device="cuda", arch=(9, 0)))
    torch.cuda.init()
    steps = {"read pinned": 0.0, "run": 0.0, "sync": 0.0, "pinned alloc 3x16.8MB": 0.0, "run, no D2H": 0.0}
    keep = []
    for u in units:
        t0 = time.perf_counter()
        inputs = {n: source.read(n, pin=True) for n in u.inputs}
        t1 = time.perf_counter()
        out = tgt.run(u, inputs, "cuda")
        t2 = time.perf_counter()
        torch.cuda.current_stream().synchronize()
        t3 = time.perf_counter()
        bufs = [torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for v in out.values()]
        t4 = time.perf_counter()
        for w in (n for n in u.inputs if n.endswith(".weight")):
            from fimoe_convert.numerics import dequant_fp4_to_bf16
            dequant_fp4_to_bf16(inputs[w].to("cuda", non_blocking=True),
                                inputs[w.replace(".weight", ".scale")].to("cuda", non_blocking=True))
        torch.cuda.current_stream().synchronize()
        t5 = time.perf_counter()
        keep = (keep + [out, bufs])[-16:]  # hold a few, like the writer's queue does
        for k, dt in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            steps[k] += dt
    n = len(units)
    print(f"{n} units (one expert: 3 matrices of 2048x4096)")
    for k, v in steps.items():
        print(f"{k}: {1e3 * v / n:.2f} ms per unit, {v:.2f} s in all")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
