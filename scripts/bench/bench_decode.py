#!/usr/bin/env python3
"""FP4 + E8M0 -> BF16 decode speed at V4-Flash expert geometry (K = 4096 hidden, 2048 out per matrix).

    python3 scripts/bench/bench_decode.py --device cpu            # 1 and 8 matrices
    python3 scripts/bench/bench_decode.py --device cuda           # 1 and 256 matrices, plus % of copy bandwidth
    python3 scripts/bench/bench_decode.py --device cuda --sweep   # also sweep the Triton kernel's knobs
    ... --json FILE                                               # also write the results as JSON

Checks `fimoe_convert.numerics.dequant_fp4_to_bf16` bit for bit against the seed formula (vLLM's
`_dequant_fp4_ue8m0_gran32`, copied below) before timing; the seed is timed the way vLLM
runs it, one expert matrix at a time. The sweep times the kernel over block_groups x num_warps
(x load_bytes), each setting checked bit for bit against the default's verified output. Greppable lines:
    [8 x 2048x4096] ratio ours/seed: 9.1x
    [256 x 2048x4096] ours: 3400 GB/s = 91% of copy
    [256 x 2048x4096] sweep block_groups=64 num_warps=2 load_bytes=4: 3912 GB/s = 92% of copy (bit-exact)
    [256 x 2048x4096] sweep best: block_groups=64 num_warps=4 load_bytes=4: 93% of copy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

try:
    import fimoe_convert  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fimoe_convert.numerics import dequant_fp4_to_bf16  # noqa: E402

HIDDEN = 4096  # K of w1/w3 (V4-Flash hidden size)
OUT = 2048  # rows per matrix (V4-Flash moe_intermediate_size)
SEED_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def seed_2d(packed: torch.Tensor, sf_ue8m0: torch.Tensor) -> torch.Tensor:
    """vLLM's `_dequant_fp4_ue8m0_gran32`, verbatim: [rows, K//2] packed e2m1 + [rows, K//32] ue8m0-uint8
    scales -> bf16 [rows, K]."""
    raw = packed.view(torch.uint8)
    lut = torch.tensor(SEED_LUT, dtype=torch.float32, device=raw.device)
    vals = torch.empty(raw.shape[0], raw.shape[1] * 2, dtype=torch.float32, device=raw.device)
    vals[:, ::2] = lut[(raw & 0x0F).to(torch.int64)]
    vals[:, 1::2] = lut[(raw >> 4).to(torch.int64)]
    sf = (sf_ue8m0.to(torch.int32) << 23).view(torch.float32)
    return (vals * sf.repeat_interleave(32, dim=-1)).to(torch.bfloat16)


def seed_dequant(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[E, N, K//2] -> [E, N, K] the way vLLM runs it (`_dequant_expert_weights_to_bf16`: a loop over experts)."""
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.bfloat16, device=packed.device)
    for e in range(packed.shape[0]):
        out[e] = seed_2d(packed[e], scales[e].view(torch.uint8))
    return out


def timed(fns: dict, device: str, repeat: int, warmup: int = 1) -> dict:
    """Median seconds per call of each function; the functions take turns in every round, so a change
    in machine load (a shared dev box) hits them all alike."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    times: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def make_inputs(n: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    packed = torch.randint(
        -128, 128, (n, OUT, HIDDEN // 2), dtype=torch.int8, generator=g, device=device
    )  # as stored: I8
    scales = torch.randint(110, 136, (n, OUT, HIDDEN // 32), dtype=torch.uint8, generator=g, device=device)  # real-ish
    scales[0, 0, :4] = torch.tensor([0, 1, 253, 254], dtype=torch.uint8, device=device)  # and the edges
    return packed, scales.view(torch.float8_e8m0fnu)


def check_exact(packed: torch.Tensor, scales: torch.Tensor) -> None:
    got = dequant_fp4_to_bf16(packed, scales)
    for i in range(packed.shape[0]):  # per matrix: keeps the seed's temporaries small
        want = seed_2d(packed[i], scales[i].view(torch.uint8))
        if not torch.equal(got[i].view(torch.int16), want.view(torch.int16)):
            bad = int((got[i].view(torch.int16) != want.view(torch.int16)).sum())
            sys.exit(f"FAIL: matrix {i}: {bad} values differ from the seed formula")


def bench(n: int, device: str, repeat: int, sweep: bool) -> dict:
    tag = f"[{n} x {OUT}x{HIDDEN}]"
    packed, scales = make_inputs(n, device)
    check_exact(packed, scales)
    print(f"{tag} bit-exact vs seed: yes ({n * OUT * HIDDEN} values)")
    moved = packed.numel() + scales.numel() + n * OUT * HIDDEN * 2  # bytes read + written by one decode
    out = torch.empty(n, OUT, HIDDEN, dtype=torch.bfloat16, device=device)

    t = timed({"seed": lambda: seed_dequant(packed, scales),
               "ours": lambda: dequant_fp4_to_bf16(packed, scales),
               "out": lambda: dequant_fp4_to_bf16(packed, scales, out=out)}, device, repeat)
    t_seed, t_ours, t_out = t["seed"], t["ours"], t["out"]
    print(f"{tag} seed: {t_seed * 1e3:.2f} ms = {moved / t_seed / 1e9:.1f} GB/s (vLLM formula, one expert at a time)")
    print(f"{tag} ours: {t_ours * 1e3:.2f} ms = {moved / t_ours / 1e9:.1f} GB/s (fresh output)")
    print(f"{tag} ours out=: {t_out * 1e3:.2f} ms = {moved / t_out / 1e9:.1f} GB/s (preallocated output)")
    print(f"{tag} ratio ours/seed: {t_seed / t_ours:.1f}x")
    print(f"{tag} ratio ours(out=)/seed: {t_seed / t_out:.1f}x")
    row = {"matrices": n, "rows": OUT, "k": HIDDEN, "bytes_moved": moved, "seed_s": t_seed, "ours_s": t_ours,
           "ours_out_s": t_out, "seed_gbps": moved / t_seed / 1e9, "ours_gbps": moved / t_ours / 1e9,
           "ours_out_gbps": moved / t_out / 1e9}
    if device != "cuda":
        return row
    src = torch.empty(moved // 2, dtype=torch.uint8, device=device)  # a copy of moved/2 bytes moves `moved` bytes
    dst = torch.empty_like(src)
    t_copy = timed({"copy": lambda: dst.copy_(src)}, device, repeat)["copy"]
    copy_bw = moved / t_copy / 1e9
    print(f"{tag} copy: {t_copy * 1e3:.2f} ms = {copy_bw:.0f} GB/s (device-to-device, {moved} bytes read + written)")
    print(f"{tag} ours: {moved / t_out / 1e9:.0f} GB/s = {100 * moved / t_out / 1e9 / copy_bw:.0f}% of copy")
    row.update(copy_s=t_copy, copy_gbps=copy_bw)
    if sweep:
        sweep_kernels(tag, packed, scales, out, moved, copy_bw, repeat)
    return row


def sweep_configs() -> list[dict]:
    """Knob sets to time: block_groups x num_warps with 4-byte code loads, and a few with 16-byte loads."""
    configs = []
    for block_groups in (64, 128, 256, 512, 1024):
        for num_warps in (1, 2, 4, 8):
            if 16 <= block_groups // num_warps <= 128:  # 16..128 values per thread: keep registers sane
                configs.append(dict(block_groups=block_groups, num_warps=num_warps, load_bytes=4))
    for block_groups, num_warps in ((128, 4), (256, 4), (256, 8), (512, 8)):  # 16 B code loads, for comparison
        configs.append(dict(block_groups=block_groups, num_warps=num_warps, load_bytes=16))
    return configs


def sweep_label(cfg: dict) -> str:
    return f"block_groups={cfg['block_groups']} num_warps={cfg['num_warps']} load_bytes={cfg['load_bytes']}"


def sweep_kernels(tag: str, packed: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, moved: int,
                  copy_bw: float, repeat: int) -> None:
    """Time every sweep config into `out`, each checked against the default kernel's output (itself checked
    against the seed). A config that fails to compile or run is reported and skipped."""
    from fimoe_convert.numerics.fp4_triton import dequant_fp4_to_bf16_cuda

    ref = dequant_fp4_to_bf16(packed, scales).view(torch.int16)
    best: dict = {}
    for cfg in sweep_configs():
        label = sweep_label(cfg)
        fn = lambda: dequant_fp4_to_bf16_cuda(packed, scales, out=out, **cfg)  # noqa: B023, E731
        try:
            out.zero_()
            fn()  # compiles; a failure here is a config problem, not a timing one
            torch.cuda.synchronize()
            exact = torch.equal(out.view(torch.int16), ref)
            ts = timed({"k": fn}, "cuda", repeat)["k"]
        except Exception as e:  # noqa: BLE001 - report and go on to the next config
            msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
            print(f"{tag} sweep {label}: skipped ({type(e).__name__}: {msg})", flush=True)
            continue
        pct = 100 * moved / ts / 1e9 / copy_bw
        print(f"{tag} sweep {label}: {moved / ts / 1e9:.0f} GB/s = {pct:.0f}% of copy "
              f"({'bit-exact' if exact else 'NOT BIT-EXACT vs the default kernel'})", flush=True)
        if exact and pct > best.get("pct", 0.0):
            best = {"pct": pct, "label": label}
    if best:
        print(f"{tag} sweep best: {best['label']}: {best['pct']:.0f}% of copy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--experts", type=int, default=None, help="matrices per batch (default 8 on cpu, 256 on cuda)")
    ap.add_argument("--repeat", type=int, default=None, help="timed calls per measurement (default 5 cpu, 20 cuda)")
    ap.add_argument("--sweep", action="store_true",
                    help="cuda: also time the Triton kernel over block sizes / warp counts / load widths")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device")
    n = args.experts or (8 if args.device == "cpu" else 256)
    repeat = args.repeat or (5 if args.device == "cpu" else 20)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "unset")  # torch CPU allocator huge pages: fresh outputs fault less
    print(f"device: {args.device} ({where}), torch {torch.__version__}, THP_MEM_ALLOC_ENABLE={thp}, repeat {repeat}")
    if args.device == "cuda":
        from fimoe_convert.numerics import fp4_triton

        print(
            "path: "
            f"{'triton kernel' if fp4_triton.triton_available() else 'torch table gather (triton not importable)'}"
        )
    rows = [bench(size, args.device, repeat, args.sweep and size == n) for size in sorted({1, n})]
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "where": where, "torch": torch.__version__,
                                               "repeat": repeat, "cores": os.cpu_count(), "loadavg": os.getloadavg(),
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
