#!/usr/bin/env python3
"""Prove a `megamoe_sm90_mxfp4` conversion end to end on a Hopper GPU (H100/H200).

1. Make a real-format DeepSeek V4 fixture (H=1024, I=512, 8 experts, top-2, 2 layers + 1 MTP block,
   realistic scale bytes), convert it with `fimoe_convert.convert(..., "megamoe_sm90_mxfp4")`, and
   load every MoE block through the runtime shim (`load_megamoe_weights`) straight onto the GPU.
2. Run `flashinfer.megamoe.mxfp4_mega_moe` at EP=1 (a one-rank NCCL group on tcp://127.0.0.1) on
   random FP8 activations (per-128 power-of-two block scales) and random top-k routing.
3. Compare with an FP32 reference MoE built from the exact BF16 dequant of the *source* checkpoint
   (read with safetensors, decoded with `fimoe_convert.numerics.dequant_fp4_to_bf16`), using the
   kernel's clamped SwiGLU (flashinfer/data/include/flashinfer/megamoe/detail/fused_epilogue.inl):
       g = min(x W1^T, clamp);  u = clamp(x W3^T, -clamp, clamp);  h = silu(g) * u
       y = sum over the token's top-k experts of  weight * (h W2^T)
   Check (the "main" run, m=256 tokens): relative L2 error < 3e-2 for every block.
4. Negative control: the same windowed scales and global scales, but the FP4 bytes left in the
   checkpoint's linear nibble order (no Marlin reorder), through FlashInfer's own transform:
   relative L2 error must be > 0.2.
Also checked: the shim's bytes equal FlashInfer's transform of the windowed, Marlin-ordered source,
and the output is finite. A second reference rounds the intermediate activation to FP8 the way the
kernel does (UE8M0 scale per 128 columns, after the routing weight); the kernel's FP8 intermediate
alone costs about 0.025 rel. L2 against the FP32 reference, so the "extra" decode-sized runs (m=16,
few samples, so that figure scatters around 3e-2) are checked against this second reference instead
(< 3e-2), plus the negative control. Every error is printed either way.

Exit status 0 only when every check passes.

Needs fimoe-convert and flashinfer-python >= 0.7.4 (`pip install -e '.[flashinfer]'`) on an SM90 GPU:
    python3 scripts/gpu/prove_megamoe_sm90.py --json prove.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()

import torch  # noqa: E402
from moe_reference import (  # noqa: E402
    fp8_activations,
    free_port,
    log,
    machine_info,
    read_source_experts,
    reference_moe,
    reference_weights,
    rel_l2,
)

REL_L2_MAX = 3e-2
NEG_REL_L2_MIN = 0.2
DEVICE = "cuda"
FIXTURE = dict(hidden=1024, inter=512, experts=8, top_k=2, layers=2, hash_layers=0, mtp=1, extreme_scales=False)


def kernel_inputs_from_source(src: dict[str, torch.Tensor], marlin: bool):
    """FlashInfer's transform of the source, windowed exactly as the converter does; with marlin=False
    the nibble reorder is skipped (the negative control). Returns (l1, l2, g1, g2) on CPU."""
    from flashinfer.megamoe import transform_mxfp4_weights_for_mega_moe

    from fimoe_convert.numerics.mxfp4 import linear_to_marlin, window_scales

    l1p = torch.cat([src["w1.weight"], src["w3.weight"]], dim=1)
    l1s = torch.cat([src["w1.scale"], src["w3.scale"]], dim=1)
    legs = []
    for p, s in ((l1p, l1s), (src["w2.weight"], src["w2.scale"])):
        newp, news, g, _rep, bad = window_scales(p, s, allow_lossy=False)
        assert not bad, f"experts {bad} do not fit the scale window"
        legs.append((linear_to_marlin(newp) if marlin else newp.contiguous(), news.contiguous(), torch.exp2(g.float())))
    l1, l2 = transform_mxfp4_weights_for_mega_moe(legs[0][:2], legs[1][:2])
    return l1, l2, legs[0][2], legs[1][2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=None, help="folder for the fixture and the output (default: a temp folder)")
    ap.add_argument("--tokens", type=int, default=256,
                    help="token count m of the checked run per block (rel L2 vs the FP32 reference < 3e-2)")
    ap.add_argument("--extra-tokens", default="16",
                    help="extra decode-sized token counts per block (comma-separated, may be empty): checked against "
                         "the reference that rounds the intermediate to FP8 like the kernel, plus the negative control")
    ap.add_argument("--convert-device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gate-rms", type=float, default=5.0,
                    help="scale activations so the gate pre-activation RMS is about this (exercises the clamp)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    runs = [(args.tokens, "main")] + [(int(t), "extra") for t in args.extra_tokens.split(",") if t.strip()]
    token_counts = [m for m, _ in runs]

    info = machine_info()
    log("== machine ==")
    for k, v in info.items():
        log(f"  {k}: {v}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        log("FAIL: needs a Hopper (SM90) GPU visible to torch")
        return 2

    from fimoe_convert import convert
    from fimoe_convert.runtime import load_manifest, load_megamoe_weights
    from fimoe_convert.testing import make_checkpoint

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="prove-megamoe-"))
    ckpt, out = work / "ckpt", work / "out"

    t = time.perf_counter()
    make_checkpoint(ckpt, "tiny", seed=args.seed, **FIXTURE)
    log(f"== fixture: {FIXTURE} in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    res = convert(str(ckpt), str(out), "megamoe_sm90_mxfp4", ep_size=1, device=args.convert_device, overwrite=True)
    log(f"== convert --target megamoe_sm90_mxfp4 --ep-size 1 --device {args.convert_device}: "
        f"{res.bytes_written} bytes in {time.perf_counter() - t:.1f} s; report {json.dumps(res.report.to_json())}")

    manifest = load_manifest(out)
    blocks = list(manifest.layers)
    log(f"== blocks in the manifest: {blocks}")
    h, inter, n_exp, top_k = FIXTURE["hidden"], FIXTURE["inter"], FIXTURE["experts"], FIXTURE["top_k"]

    import torch.distributed as dist
    from flashinfer.megamoe import MegaMoESymmBuffer, mxfp4_mega_moe

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=torch.device(DEVICE, 0))
    group = dist.group.WORLD
    t = time.perf_counter()
    buf = MegaMoESymmBuffer(group, num_experts=n_exp, num_max_tokens_per_rank=max(token_counts), num_topk=top_k,
                            hidden=h, intermediate_hidden=inter)
    clamp = float(buf.activation_clamp)
    log(f"== MegaMoESymmBuffer(world 1, E={n_exp}, max tokens {max(token_counts)}, top-{top_k}, H={h}, I={inter}, "
        f"activation_clamp={clamp}, fast_math={buf.fast_math}) in {time.perf_counter() - t:.1f} s")

    def run_kernel(l1, l2, g1, g2, x_fp8, x_sf, idx, w, m):
        buf.stage(x_fp8, x_sf, idx, w)
        y = torch.full((m, h), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        mxfp4_mega_moe(y, l1, l2, buf, num_tokens=m, l1_global_scales=g1, l2_global_scales=g2)
        torch.cuda.synchronize()
        return y

    def one_run(block, m, kind, l1, l2, g1, g2, n1, n2, ng1, ng2, w1, w3, w2, same):
        x = torch.randn(m, h, generator=gen)
        # Scale so the gate pre-activation RMS is about --gate-rms: some values cross the clamp.
        probe = x.to(DEVICE) @ w1.reshape(-1, h).T
        x = x * (args.gate_rms / float(probe.pow(2).mean().sqrt()))
        x_fp8, x_sf, x_deq = (t_.to(DEVICE) for t_ in fp8_activations(x))
        idx = torch.rand(m, n_exp, generator=gen).argsort(-1)[:, :top_k].contiguous()
        wts = torch.softmax(torch.randn(m, top_k, generator=gen), -1).float()
        idx, wts = idx.to(DEVICE), wts.to(DEVICE)

        ref, st = reference_moe(x_deq, w1, w3, w2, idx, wts, clamp)
        ref_q, _ = reference_moe(x_deq, w1, w3, w2, idx, wts, clamp, fp8_intermediate=True)
        ref_noclamp, _ = reference_moe(x_deq, w1, w3, w2, idx, wts, None)

        tk = time.perf_counter()
        y = run_kernel(l1, l2, g1, g2, x_fp8, x_sf, idx, wts, m)
        first_s = time.perf_counter() - tk
        y_neg = run_kernel(n1, n2, ng1, ng2, x_fp8, x_sf, idx, wts, m)
        # Steady-state time of one call (CUDA events, after the JIT build above).
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        y2 = torch.empty_like(y)

        def step():
            buf.stage(x_fp8, x_sf, idx, wts)
            mxfp4_mega_moe(y2, l1, l2, buf, num_tokens=m, l1_global_scales=g1, l2_global_scales=g2)

        for _ in range(3):
            step()
        ev0.record()
        for _ in range(20):
            step()
        ev1.record()
        torch.cuda.synchronize()
        us = ev0.elapsed_time(ev1) / 20 * 1000
        repeat_equal = bool(torch.equal(y, y2))

        finite = bool(torch.isfinite(y).all())
        err, err_neg, err_q = rel_l2(y, ref), rel_l2(y_neg, ref), rel_l2(y, ref_q)
        checked = err if kind == "main" else err_q
        row = {"block": block, "m": m, "kind": kind, "rel_l2": err, "neg_rel_l2": err_neg,
               "rel_l2_vs_fp8_intermediate_ref": err_q, "rel_l2_vs_unclamped_ref": rel_l2(y, ref_noclamp),
               "fp8_intermediate_ref_vs_fp32_ref": rel_l2(ref_q, ref),
               "gate_clamped_frac": st["gate_clamped"] / max(1, st["values"]),
               "up_clamped_frac": st["up_clamped"] / max(1, st["values"]),
               "finite": finite, "shim_bytes_match_transform": same, "repeat_bitwise_equal": repeat_equal,
               "first_call_s": first_s, "us_per_call": us,
               "ok": finite and same and checked < REL_L2_MAX and err_neg > NEG_REL_L2_MIN}
        if not finite:
            failures.append(f"{block} m={m}: kernel output has non-finite values")
        if not checked < REL_L2_MAX:
            what = "FP32 reference" if kind == "main" else "FP8-intermediate reference"
            failures.append(f"{block} m={m}: rel L2 vs the {what} {checked:.4g} >= {REL_L2_MAX}")
        if not err_neg > NEG_REL_L2_MIN:
            failures.append(f"{block} m={m}: negative control rel L2 {err_neg:.4g} <= {NEG_REL_L2_MIN} (should fail)")
        log(f"   {block:9s} m={m:<4d} [{kind}] rel_l2={err:.4f}  neg_control={err_neg:.4f}  "
            f"(vs fp8-intermediate ref {row['rel_l2_vs_fp8_intermediate_ref']:.4f}, "
            f"vs unclamped ref {row['rel_l2_vs_unclamped_ref']:.4f}; clamped gate {row['gate_clamped_frac']:.2%} "
            f"up {row['up_clamped_frac']:.2%}; first call {first_s:.1f} s, {us:.1f} us/call)")
        return row

    rows, failures = [], []
    gen = torch.Generator().manual_seed(args.seed + 12345)
    for block in blocks:
        l1, l2, g1, g2 = load_megamoe_weights(out, block, rank=0, device=DEVICE)
        assert all(t_.device.type == DEVICE for t_ in (l1, l2, g1, g2))
        src = read_source_experts(ckpt, block, n_exp)
        w1, w3, w2 = reference_weights(src, DEVICE)
        # The shim's bytes are what FlashInfer's transform gives for the windowed, Marlin-ordered source.
        p1, p2, pg1, pg2 = kernel_inputs_from_source(src, marlin=True)
        same = (torch.equal(p1, l1.cpu()) and torch.equal(p2, l2.cpu())
                and torch.equal(pg1, g1.cpu()) and torch.equal(pg2, g2.cpu()))
        if not same:
            failures.append(f"{block}: loaded tensors differ from FlashInfer's transform of the source")
        n1, n2, ng1, ng2 = (t_.to(DEVICE) for t_ in kernel_inputs_from_source(src, marlin=False))
        for m, kind in runs:
            try:
                rows.append(one_run(block, m, kind, l1, l2, g1, g2, n1, n2, ng1, ng2, w1, w3, w2, same))
            except Exception as e:  # noqa: BLE001 -- report it and go on with the other runs
                failures.append(f"{block} m={m}: {type(e).__name__}: {e}")
                log(f"   {block:9s} m={m:<4d} [{kind}] ERROR {type(e).__name__}: {e}")
                if isinstance(e, torch.cuda.OutOfMemoryError) or "CUDA" in str(e):
                    raise

    buf.destroy()
    dist.destroy_process_group()
    wall = time.perf_counter() - T0

    log("")
    log(
        f"== results: rel_l2 = kernel vs the FP32 reference (must be < {REL_L2_MAX} on the main runs); "
        f"neg_ctrl = same weights without the Marlin reorder (must be > {NEG_REL_L2_MIN}); "
        "vs_fp8ref = kernel vs the reference that rounds the intermediate to FP8 "
        f"(must be < {REL_L2_MAX} on extra runs)"
    )
    log(f"{'block':10s} {'m':>4s} {'run':>5s} {'rel_l2':>9s} {'neg_ctrl':>9s} {'vs_fp8ref':>10s} {'result':>7s}")
    for r in rows:
        log(f"{r['block']:10s} {r['m']:4d} {r['kind']:>5s} {r['rel_l2']:9.4f} {r['neg_rel_l2']:9.4f} "
            f"{r['rel_l2_vs_fp8_intermediate_ref']:10.4f} {'PASS' if r['ok'] else 'FAIL':>7s}")
    log(f"total wall time: {wall:.1f} s")
    if len(blocks) != 3:
        failures.append(f"expected 3 MoE blocks (2 layers + 1 MTP), the manifest has {blocks}")
    ok = not failures and len(rows) == len(blocks) * len(token_counts)
    for f in failures:
        log(f"FAIL: {f}")
    log("PROOF PASSED" if ok else "PROOF FAILED")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "fixture": FIXTURE, "rows": rows,
                                               "failures": failures, "wall_s": wall, "passed": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
