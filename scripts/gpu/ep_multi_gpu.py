#!/usr/bin/env python3
"""The --ep-size N shards in a real N-GPU run: one process per GPU, the kernel's own cross-rank dispatch and
combine (NCCL symmetric memory for flashinfer.megamoe, NVSHMEM for flashinfer.moe_ep), every rank's output for its
own tokens checked against the FP32 reference MoE of the exact dequant of the source.

    torchrun --nproc-per-node 8 scripts/gpu/ep_multi_gpu.py megamoe --work DIR [--json FILE]
    torchrun --nproc-per-node 8 scripts/gpu/ep_multi_gpu.py moe_ep --work DIR [--json FILE]

DIR must be on a disk every rank sees (rank 0 makes the fixture and converts with --ep-size N there). Keep NVLink
multicast off where the host's GPUs are shared: NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1. Exit status 0 only when every rank passes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ep_proof import GEOMETRY, LIMITS, make_inputs  # noqa: E402
from moe_reference import install_flashinfer_stub, log, read_source_experts, reference_moe, reference_weights, rel_l2  # noqa: E402  # noqa: E402


def convert_once(kind: str, work: Path, geo: dict, world: int, seed: int) -> Path:
    """Rank 0 makes the fixture and converts with --ep-size `world`; the others wait at the barrier."""
    out = work / f"out_ep{world}"
    if dist.get_rank() == 0:
        from fimoe_convert import convert
        from fimoe_convert.testing import make_checkpoint

        ckpt = make_checkpoint(work / "ckpt", "tiny", seed=seed, hidden=geo["hidden"], inter=geo["inter"],
                               experts=geo["experts"], top_k=geo["top_k"], layers=1, hash_layers=0, mtp=1,
                               extreme_scales=False)
        target = "megamoe_sm90_mxfp4" if kind == "megamoe" else "sm90_fp8_fp8_bf16_pull_cutedsl"
        params = {} if kind == "megamoe" else {"fp8_scale_mode": "blockwise"}
        convert(str(ckpt), str(out), target, ep_size=world, device="cuda", params=params, overwrite=True)
    dist.barrier()
    return out


def run_megamoe(out: Path, block: str, geo: dict, m: int, x: dict):
    from flashinfer.megamoe import MegaMoESymmBuffer, mxfp4_mega_moe

    from fimoe_convert.runtime import load_megamoe_weights

    buf = MegaMoESymmBuffer(dist.group.WORLD, num_experts=geo["experts"], num_max_tokens_per_rank=m,
                            num_topk=geo["top_k"], hidden=geo["hidden"], intermediate_hidden=geo["inter"])
    try:
        l1, l2, g1, g2 = load_megamoe_weights(out, block, rank=dist.get_rank(), device="cuda")
        buf.stage(x["fp8"], x["sf"], x["idx"], x["wts"])  # global expert ids: the kernel dispatches across ranks
        y = torch.empty(m, geo["hidden"], dtype=torch.bfloat16, device="cuda")
        mxfp4_mega_moe(y, l1, l2, buf, num_tokens=m, l1_global_scales=g1, l2_global_scales=g2)
        torch.cuda.synchronize()
        return y, float(buf.activation_clamp)
    finally:
        buf.destroy()


def run_moe_ep(out: Path, block: str, geo: dict, m: int, x: dict):
    import flashinfer.moe_ep as me

    from fimoe_convert.runtime import mega_config

    rank, world = dist.get_rank(), dist.get_world_size()
    boot = me.BootstrapConfig(world_size=world, rank=rank, device=torch.cuda.current_device())
    fleet = me.FleetParams(num_experts=geo["experts"], max_tokens_per_rank=m, token_hidden_size=geo["hidden"])
    layer = me.MoEEpMegaLayer(boot, fleet, None, mega_config(out, block, rank=rank, device="cuda"))
    try:
        y = layer.forward(me.MoEEpTensors(hidden_states=x["bf16"], topk_ids=x["idx"], topk_weights=x["wts"]))
        torch.cuda.synchronize()
        return y.clone(), None
    finally:
        layer.destroy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("megamoe", "moe_ep"))
    ap.add_argument("--work", required=True, help="folder every rank sees (fixture and converted output)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fi-site", default=os.environ.get("FI_SITE"))
    ap.add_argument("--json", default=None, help="rank 0 writes every rank's rows here")
    args = ap.parse_args()
    if args.fi_site:
        install_flashinfer_stub(args.fi_site)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cuda.matmul.allow_tf32 = False
    geo = dict(GEOMETRY[args.kind])
    geo["experts"] = max(geo["experts"], world * geo["top_k"])  # every rank needs at least top-k local experts
    work = Path(args.work)
    out = convert_once(args.kind, work, geo, world, args.seed)
    from fimoe_convert.runtime import load_manifest

    rows = []
    gen = torch.Generator().manual_seed(args.seed + 1 + rank)  # each rank its own tokens and routes
    for block in load_manifest(out).layers:
        w1, w3, w2 = reference_weights(read_source_experts(work / "ckpt", block, geo["experts"]), "cuda")
        x = make_inputs(w1, geo, args.tokens, gen, 5.0)
        t0 = time.perf_counter()
        run = run_megamoe if args.kind == "megamoe" else run_moe_ep
        y, clamp = run(out, block, geo, args.tokens, x)
        value = x["fp8_value"] if args.kind == "megamoe" else x["bf16_value"]
        ref, _ = reference_moe(value, w1, w3, w2, x["idx"], x["wts"], clamp)
        err = rel_l2(y, ref)
        rows.append({"rank": rank, "block": block, "rel_l2": err, "seconds": time.perf_counter() - t0,
                     "ok": bool(torch.isfinite(y.float()).all()) and err < LIMITS[args.kind]["rel_l2"]})
    every: list = [None] * world
    dist.all_gather_object(every, rows)
    dist.destroy_process_group()
    if rank == 0:
        flat = [r for part in every for r in part]
        for r in flat:
            log(f"   rank {r['rank']} {r['block']:9s} rel_l2 {r['rel_l2']:.4f}  {'PASS' if r['ok'] else 'FAIL'}")
        ok = bool(flat) and all(r["ok"] for r in flat)
        log(f"EP {world} {args.kind}: " + ("PASSED" if ok else "FAILED"))
        if args.json:
            Path(args.json).write_text(json.dumps({"world": world, "kind": args.kind, "geometry": geo, "rows": flat,
                                                   "passed": ok}, indent=2))
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
