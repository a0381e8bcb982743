"""Load time of one MoE layer: the runtime shim reading converted output vs the load-time path a
server takes today (read the FP4 experts, the seed's per-expert dequant loop, then FlashInfer's
preprocess), measured in the same run on the same layer. Prints `ratio today/shim: X.Xx` (goal >= 10x).

usage: python3 scripts/bench/bench_load.py [--target sm100_mxfp8_mxfp8_bf16_cutedsl | megamoe_sm90_mxfp4]
       [--device cpu|cuda]
       [--experts 8]
       [--warmup 1]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

LUT = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def seed_dequant(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The seed formula (vLLM's _dequant_fp4_ue8m0_gran32), one expert matrix at a time."""
    lut = torch.tensor(LUT, dtype=torch.float32, device=packed.device)
    b = packed.view(torch.uint8).long()
    v = torch.stack([lut[b & 0xF], lut[b >> 4]], -1).flatten(-2)
    s = (scales.view(torch.uint8).int() << 23).view(torch.float32)
    return (v.unflatten(-1, (-1, 32)) * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)


PAGE = 4096  # bytes; touching one byte per page makes a lazily mapped file really be read


def touch(obj) -> int:
    """Touch every page of every tensor's storage (a lazily mapped file must really be read to count)."""
    from fimoe_convert.numerics.structure import flatten

    _, tensors = flatten(obj, "x")
    total = 0
    for t in tensors.values():
        whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        total += int(whole[::PAGE].sum())
    return total


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="sm100_mxfp8_mxfp8_bf16_cutedsl")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of both paths first")
    ap.add_argument("--work", default="/tmp/fimoe-loadbench")
    args = ap.parse_args()
    from fimoe_convert import convert
    from fimoe_convert.files.sources.local import open_source
    from fimoe_convert.runtime import load_transformed_weights
    from fimoe_convert.targets import TargetOptions, get_kernel, make_target
    from fimoe_convert.testing import make_checkpoint

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    src = make_checkpoint(work / "src", "flash-geometry", layers=1, mtp=0, hash_layers=0, experts=args.experts)
    out = work / "out"
    convert(str(src), str(out), args.target, device=args.device)
    layer = "layers.0"

    source = open_source(str(src))
    model = source.model

    def today_megamoe():
        """flashinfer.megamoe consumes FP4 itself: read the experts, then the repack it needs (scale windows,
        Marlin order, FlashInfer's tile transform) on the device; no dequant."""
        from fimoe_convert.targets.megamoe import STRUCTURE, prefix

        whole = TargetOptions(device=args.device, unit_bytes=1 << 62)  # one unit per leg: all of the rank's experts
        tgt = make_target(get_kernel(args.target), model, whole)
        got = {}
        for unit in (u for u in tgt.units() if u.block == layer and u.rank == 0):
            got.update(tgt.transform(unit, {n: source.read(n) for n in unit.inputs}))
        return tuple(got[f"{prefix(layer, 0)}.{leg}.{slot}"] for leg, slot in STRUCTURE)

    def today_path():
        """Read FP4 experts, dequantize expert by expert with the seed formula, FlashInfer preprocess."""
        if args.target.startswith("megamoe"):
            return today_megamoe()
        legs = {leg: [] for leg in ("w1", "w2", "w3")}
        for j in range(model.n_routed_experts):
            for leg in legs:
                w = source.read(f"{layer}.ffn.experts.{j}.{leg}.weight").to(args.device)
                s = source.read(f"{layer}.ffn.experts.{j}.{leg}.scale").to(args.device)
                legs[leg].append(seed_dequant(w, s))
        w13 = torch.cat([torch.stack(legs["w1"]), torch.stack(legs["w3"])], dim=1)
        tgt = make_target(get_kernel(args.target), model, TargetOptions(device=args.device))
        return tgt.preprocess(model, (w13, torch.stack(legs["w2"])), model.n_routed_experts)

    def shim_path():
        """Read the converted layer straight to the device."""
        return load_transformed_weights(out, layer, 0, device=args.device)

    def timed(fn):
        sync(args.device)
        t0 = time.perf_counter()
        obj = fn()
        touch(obj)
        sync(args.device)
        return time.perf_counter() - t0, obj

    # A server loads every layer the same way, so one-time costs of the first (kernel compiles, allocator
    # pools) are paid by both paths in an untimed warm-up on this layer.
    for _ in range(args.warmup):
        timed(today_path)
        timed(shim_path)
    t_today, today = timed(today_path)
    t_shim, ours = timed(shim_path)

    from fimoe_convert.numerics.structure import same_object

    print(f"layer {layer}: {model.n_routed_experts} experts at H={model.hidden_size}, I={model.moe_intermediate_size}; "
          f"target {args.target} on {args.device}; identical objects: {same_object(ours, today)}")
    what = ("read + repack for FlashInfer's megamoe" if args.target.startswith("megamoe")
            else "read + seed dequant loop + FlashInfer preprocess")
    print(f"today ({what}): {t_today:.3f} s")
    print(f"shim (load_transformed_weights, every byte read): {t_shim:.3f} s")
    print(f"ratio today/shim: {t_today / t_shim:.1f}x (goal >= 10x)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
