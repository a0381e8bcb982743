"""Where the CUDA converter's time goes, step by step, at V4-Flash expert geometry (on a CUDA GPU).

Times, after a warm-up (Triton compile, allocator pools), medians over --repeat rounds:
  pinned alloc of one 2048x4096 BF16 output; H2D of one FP4 matrix from pinned memory; the decode kernel;
  D2H of one BF16 matrix into pinned memory; one bf16 unit (3 matrices) through Bf16Target.run plus a
  sync; the same while another thread copies host memory like the writer does; host memcpy bandwidth
  (pinned -> page-aligned staging block, as the writer copies); sha256 bandwidth.

usage: python3 scripts/gpu/diag_cuda_unit.py [--repeat 30]
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import statistics
import threading
import time

import numpy as np
import torch

ROWS, K = 2048, 4096  # one V4-Flash w1/w3 matrix


def median_ms(fn, repeat: int, sync: bool = True) -> float:
    ts = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    from fimoe_convert.checkpoint import model_spec_from_config
    from fimoe_convert.numerics import dequant_fp4_to_bf16
    from fimoe_convert.plan import OutTensor, Unit
    from fimoe_convert.targets import TargetOptions, make_target

    n = args.repeat
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (ROWS, K // 2), dtype=torch.uint8, generator=g).pin_memory()
    scales = torch.randint(120, 135, (ROWS, K // 32), dtype=torch.uint8, generator=g).pin_memory()
    dcodes, dscales = codes.cuda(), scales.cuda()
    y = dequant_fp4_to_bf16(dcodes, dscales)
    host = torch.empty_like(y, device="cpu").pin_memory()
    mb = y.numel() * 2 / 1e6
    print(f"one matrix: {codes.numel() / 1e6:.1f} MB of codes in, {mb:.1f} MB of BF16 out")
    print(
        f"pinned alloc {mb:.1f} MB (cache warm): "
        f"{median_ms(lambda: torch.empty(y.shape, dtype=y.dtype, pin_memory=True), n, False):.3f} ms"
    )
    print(f"H2D codes from pinned: {median_ms(lambda: dcodes.copy_(codes, non_blocking=True), n):.3f} ms")
    print(f"decode kernel: {median_ms(lambda: dequant_fp4_to_bf16(dcodes, dscales, out=y), n):.3f} ms")
    print(f"D2H BF16 into pinned: {median_ms(lambda: host.copy_(y, non_blocking=True), n):.3f} ms")

    model = model_spec_from_config({"model_type": "deepseek_v4", "expert_dtype": "fp4", "hidden_size": K,
                                    "moe_intermediate_size": ROWS, "n_routed_experts": 1, "num_experts_per_tok": 1,
                                    "num_hidden_layers": 1})
    tgt = make_target("bf16", model, TargetOptions(device="cuda"))
    names = [f"e.{leg}" for leg in ("w1", "w2", "w3")]
    unit = Unit("e", "b", 0, (0, 1), tuple(f"{m}.{k}" for m in names for k in ("weight", "scale")),
                tuple(OutTensor(f"{m}.weight", "BF16", (ROWS, K), "e", None) for m in names))
    inputs = {}
    for m in names:
        inputs[f"{m}.weight"], inputs[f"{m}.scale"] = codes.view(torch.int8), scales.view(torch.float8_e8m0fnu)
    held = []

    def run():
        held.append(tgt.run(unit, inputs))
        del held[:-8]  # like the writer's queue: a few units wait to be written

    print(f"bf16 unit (3 matrices), run + sync: {median_ms(run, n):.3f} ms")
    stop = threading.Event()
    src = np.ones(64 << 20, np.uint8)
    blk = np.frombuffer(mmap.mmap(-1, 64 << 20), np.uint8)

    def copier():
        while not stop.is_set():
            blk[:] = src

    t = threading.Thread(target=copier, daemon=True)
    t.start()
    print(f"bf16 unit, run + sync, while another thread copies 64 MiB blocks: {median_ms(run, n):.3f} ms")
    stop.set()
    t.join()
    pinned = torch.empty(64 << 20, dtype=torch.uint8).pin_memory().numpy()
    t0 = time.perf_counter()
    for _ in range(n):
        blk[:] = pinned
    print(f"host copy pinned -> staging block: {n * 64 * 2**20 / (time.perf_counter() - t0) / 1e9:.1f} GB/s")
    t0 = time.perf_counter()
    for _ in range(n):
        hashlib.sha256(blk).digest()
    print(f"sha256: {n * 64 * 2**20 / (time.perf_counter() - t0) / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
