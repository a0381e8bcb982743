#!/usr/bin/env python3
"""Prove the --ep-size N shards of one conversion on ONE GPU: each EP rank's shard runs alone in the kernel at
world size 1, with the routes to other ranks' experts masked (-1), and the ranks' outputs summed in FP32.

    ep_proof.py megamoe --ep-sizes 1,2,4 [--fi-site DIR] [--json FILE]
    ep_proof.py moe_ep --target sm90_fp8_fp8_bf16_pull_cutedsl --ep-sizes 1,2,4 [--json FILE]

For each MoE block of a real-format fixture converted once per EP size, on the same random FP8/BF16 tokens and
global top-k routes:
  rel_l2        the summed ranks against the FP32 reference MoE of the exact dequant of the source
  vs_ep1        the summed ranks against the EP 1 output of the same source and kernel
  swapped       control: ranks 0 and 1 run each other's shard (their own routes): must fail the rel_l2 limit
                and miss the reference by 3x the rel_l2 of the true layout
  zero_weight   other ranks' routes sent to local expert 0 with weight 0 instead of -1 (reported, not checked)
Exit status 0 only when every check passes. What this cannot show: the cross-rank dispatch and combine (the
all-to-all) and the symmetric buffers across GPUs; scripts/gpu/ep_multi_gpu.py runs those on N GPUs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_reference import (  # noqa: E402
    fp8_activations,
    free_port,
    install_flashinfer_stub,
    local_routes,
    log,
    machine_info,
    read_source_experts,
    reference_moe,
    reference_weights,
    rel_l2,
)

SWAP_FACTOR = 3.0  # a swapped-shard control must fail the rel_l2 limit and miss the reference 3x the true layout
LIMITS = {"megamoe": {"rel_l2": 3e-2, "vs_ep1": 1e-2}, "moe_ep": {"rel_l2": 0.1, "vs_ep1": 1e-2}}
GEOMETRY = {"megamoe": dict(hidden=4096, inter=2048, experts=32, top_k=6),
            "moe_ep": dict(hidden=1024, inter=512, experts=32, top_k=4)}


class MegaMoERunner:
    """flashinfer.megamoe.mxfp4_mega_moe on a one-rank group; one MegaMoESymmBuffer per local expert count."""

    def __init__(self, geo: dict, tokens: int):
        import torch.distributed as dist

        self.geo, self.tokens, self.bufs = geo, tokens, {}
        if not dist.is_initialized():
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                    device_id=torch.device("cuda", 0))

    def clamp(self) -> float | None:
        return float(self._buf(self.geo["experts"]).activation_clamp)

    def _buf(self, n_local: int):
        import torch.distributed as dist
        from flashinfer.megamoe import MegaMoESymmBuffer

        if n_local not in self.bufs:
            g = self.geo
            self.bufs[n_local] = MegaMoESymmBuffer(dist.group.WORLD, num_experts=n_local,
                                                   num_max_tokens_per_rank=self.tokens, num_topk=g["top_k"],
                                                   hidden=g["hidden"], intermediate_hidden=g["inter"])
        return self.bufs[n_local]

    def run(self, out: Path, block: str, rank: int, n_local: int, x: dict, idx, wts) -> torch.Tensor:
        from flashinfer.megamoe import mxfp4_mega_moe

        from fimoe_convert.runtime import load_megamoe_weights

        l1, l2, g1, g2 = load_megamoe_weights(out, block, rank=rank, device="cuda")
        buf = self._buf(n_local)
        buf.stage(x["fp8"], x["sf"], idx, wts)
        m = x["fp8"].shape[0]
        y = torch.full((m, self.geo["hidden"]), float("nan"), dtype=torch.bfloat16, device="cuda")
        mxfp4_mega_moe(y, l1, l2, buf, num_tokens=m, l1_global_scales=g1, l2_global_scales=g2)
        torch.cuda.synchronize()
        return y

    def close(self) -> None:
        import torch.distributed as dist

        for b in self.bufs.values():
            b.destroy()
        dist.destroy_process_group()


class MoeEpRunner:
    """flashinfer.moe_ep.MoEEpMegaLayer at world size 1 from fimoe_convert.runtime.mega_config (rank r's shard)."""

    def __init__(self, geo: dict, tokens: int):
        import flashinfer.moe_ep as me

        self.me, self.geo, self.tokens, self.layers = me, geo, tokens, {}
        self.boot = me.BootstrapConfig(world_size=1, rank=0, device=0)

    def clamp(self) -> float | None:
        return None  # the converted kernel config's gate_up_clamp is None

    def run(self, out: Path, block: str, rank: int, n_local: int, x: dict, idx, wts) -> torch.Tensor:
        from fimoe_convert.runtime import mega_config

        me, key = self.me, (str(out), block, rank)
        if key not in self.layers:
            if self.layers and next(iter(self.layers))[1] != block:
                self.close()  # one block's layers at a time
            fleet = me.FleetParams(num_experts=n_local, max_tokens_per_rank=self.tokens,
                                   token_hidden_size=self.geo["hidden"])
            self.layers[key] = me.MoEEpMegaLayer(self.boot, fleet, None,
                                                 mega_config(out, block, rank=rank, device="cuda"))
        y = self.layers[key].forward(me.MoEEpTensors(hidden_states=x["bf16"], topk_ids=idx, topk_weights=wts))
        torch.cuda.synchronize()
        return y.clone()

    def close(self) -> None:
        for layer in self.layers.values():
            layer.destroy()
        self.layers.clear()


def make_inputs(w1, geo: dict, m: int, gen: torch.Generator, gate_rms: float) -> dict:
    """Random tokens scaled so the gate pre-activation RMS is about `gate_rms`, as FP8 (+ scales) and BF16, each
    with its exact FP32 value; random global top-k routes and softmax weights."""
    h, e, k = geo["hidden"], geo["experts"], geo["top_k"]
    x = torch.randn(m, h, generator=gen)
    probe = x.cuda() @ w1.reshape(-1, h).T
    x = x * (gate_rms / float(probe.pow(2).mean().sqrt()))
    fp8, sf, deq = (t.cuda() for t in fp8_activations(x))
    bf16 = x.to(torch.bfloat16).cuda()
    idx = torch.rand(m, e, generator=gen).argsort(-1)[:, :k].contiguous().cuda()
    wts = torch.softmax(torch.randn(m, k, generator=gen), -1).float().cuda()
    return {"fp8": fp8, "sf": sf, "fp8_value": deq, "bf16": bf16, "bf16_value": bf16.float(), "idx": idx, "wts": wts}


def summed(runner, out: Path, block: str, ranges: list, x: dict, mask: str = "minus_one",
           weights_of: dict | None = None) -> torch.Tensor:
    """Sum over ranks of each rank's kernel output on its own routes; `weights_of[r]`: run rank r's routes on
    another rank's shard (the swapped control)."""
    total = torch.zeros(x["idx"].shape[0], runner.geo["hidden"], dtype=torch.float32, device="cuda")
    for r, (lo, hi) in enumerate(ranges):
        idx, wts = local_routes(x["idx"], x["wts"], lo, hi, mask)
        shard = (weights_of or {}).get(r, r)
        total += runner.run(out, block, shard, hi - lo, x, idx, wts).float()
    return total


def prove_block(runner, kind: str, outs: dict, block: str, x: dict, ref, ep1) -> list[dict]:
    """One row per EP size: the checks in the module docstring."""
    from fimoe_convert.runtime import load_manifest

    rows, lim = [], LIMITS[kind]
    for ep, out in outs.items():
        ranges = [tuple(r) for r in load_manifest(out).ep.expert_ranges]
        t0 = time.perf_counter()
        y = summed(runner, out, block, ranges, x)
        row = {"kind": kind, "block": block, "ep_size": ep, "ranges": ranges, "rel_l2": rel_l2(y, ref),
               "vs_ep1": rel_l2(y, ep1) if ep1 is not None else 0.0, "finite": bool(torch.isfinite(y).all())}
        if ep > 1:
            row["swapped"] = rel_l2(summed(runner, out, block, ranges, x, weights_of={0: 1, 1: 0}), ref)
            row["zero_weight"] = rel_l2(summed(runner, out, block, ranges, x, mask="zero_weight"), ref)
        row["seconds"] = time.perf_counter() - t0
        row["ok"] = (row["finite"] and row["rel_l2"] < lim["rel_l2"] and row["vs_ep1"] < lim["vs_ep1"]
                     and (ep == 1 or row["swapped"] > max(lim["rel_l2"], SWAP_FACTOR * row["rel_l2"])))
        log(f"   {kind} {block:9s} EP {ep}: rel_l2 {row['rel_l2']:.4f}  vs EP1 {row['vs_ep1']:.5f}"
            + (f"  swapped control {row['swapped']:.4f}  zero-weight routes {row['zero_weight']:.4f}" if ep > 1 else "")
            + f"  ({row['seconds']:.1f} s)  {'PASS' if row['ok'] else 'FAIL'}")
        rows.append(row)
        if ep == 1:
            ep1 = y
    return rows


def convert_all(kind: str, target: str, params: dict, ckpt: Path, work: Path, sizes: list[int]) -> dict:
    from fimoe_convert import convert

    outs = {}
    for ep in sizes:
        out = work / f"out_ep{ep}"
        t0 = time.perf_counter()
        res = convert(str(ckpt), str(out), target, ep_size=ep, device="cuda", params=params, overwrite=True)
        log(f"== convert --target {target} --ep-size {ep} --device cuda: {res.bytes_written} bytes in "
            f"{time.perf_counter() - t0:.1f} s")
        outs[ep] = out
    return outs


def prove(kind: str, target: str, params: dict, sizes: list[int], geo: dict, tokens: int, work: Path, seed: int,
          gate_rms: float) -> tuple[list[dict], list[str]]:
    """Rows and failures of the proof; the EP 1 output is the first size (1 is put first)."""
    from fimoe_convert.runtime import load_manifest
    from fimoe_convert.testing import make_checkpoint

    if min(geo["experts"] // ep for ep in sizes) < geo["top_k"]:
        raise SystemExit(f"--experts {geo['experts']} --top-k {geo['top_k']}: each rank needs at least top-k local "
                         f"experts at --ep-size {max(sizes)}; raise --experts or lower --top-k")
    ckpt = make_checkpoint(work / "ckpt", "tiny", seed=seed, hidden=geo["hidden"], inter=geo["inter"],
                           experts=geo["experts"], top_k=geo["top_k"], layers=1, hash_layers=0, mtp=1,
                           extreme_scales=False)
    outs = convert_all(kind, target, params, ckpt, work, sizes)
    runner = MegaMoERunner(geo, tokens) if kind == "megamoe" else MoeEpRunner(geo, tokens)
    gen = torch.Generator().manual_seed(seed + 1)
    rows, failures = [], []
    try:
        for block in load_manifest(outs[sizes[0]]).layers:
            w1, w3, w2 = reference_weights(read_source_experts(ckpt, block, geo["experts"]), "cuda")
            x = make_inputs(w1, geo, tokens, gen, gate_rms)
            value = x["fp8_value"] if kind == "megamoe" else x["bf16_value"]
            ref, _ = reference_moe(value, w1, w3, w2, x["idx"], x["wts"], runner.clamp())
            del w1, w3, w2
            got = prove_block(runner, kind, outs, block, x, ref, None)
            rows += got
            failures += [f"{kind} {r['block']} EP {r['ep_size']}" for r in got if not r["ok"]]
    finally:
        runner.close()
    return rows, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("megamoe", "moe_ep"))
    ap.add_argument("--target", default=None, help="moe_ep: the kernel target (default sm90_fp8_fp8_bf16_pull_cutedsl)")
    ap.add_argument("--param", action="append", default=[], help="target parameter KEY=VALUE (moe_ep default: "
                    "fp8_scale_mode=blockwise)")
    ap.add_argument("--ep-sizes", default="1,2,4", help="comma-separated EP sizes; 1 is always run first")
    ap.add_argument("--experts", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--inter", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--gate-rms", type=float, default=5.0, help="activation scale: gate pre-activation RMS")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fi-site", default=os.environ.get("FI_SITE"),
                    help="folder holding an unpacked flashinfer/ (imported without its __init__); default: installed")
    ap.add_argument("--work", default=None, help="folder for the fixture and outputs (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    if args.fi_site:
        install_flashinfer_stub(args.fi_site)
    torch.backends.cuda.matmul.allow_tf32 = False
    info = machine_info()
    log("== machine: " + json.dumps(info))
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        log("FAIL: needs a Hopper (SM90) GPU visible to torch")
        return 2
    if args.kind == "moe_ep":
        os.environ.setdefault("MEGA_NO_DIST", "1")  # FlashInfer's one-rank switch: plain CUDA memory, no NVSHMEM
    geo = dict(GEOMETRY[args.kind])
    geo.update({k: v for k, v in (("experts", args.experts), ("top_k", args.top_k), ("hidden", args.hidden),
                                  ("inter", args.inter)) if v is not None})
    target = args.target or ("megamoe_sm90_mxfp4" if args.kind == "megamoe" else "sm90_fp8_fp8_bf16_pull_cutedsl")
    params = dict(p.split("=", 1) for p in args.param) or ({} if args.kind == "megamoe" else
                                                          {"fp8_scale_mode": "blockwise"})
    sizes = [1] + sorted({int(s) for s in args.ep_sizes.split(",") if s.strip()} - {1})
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix=f"ep-proof-{args.kind}-"))
    log(f"== {target} {params} geometry {geo}, {args.tokens} tokens, EP sizes {sizes}")
    t0 = time.perf_counter()
    rows, failures = prove(args.kind, target, params, sizes, geo, args.tokens, work, args.seed, args.gate_rms)
    ok = bool(rows) and not failures
    log(f"total {time.perf_counter() - t0:.1f} s; " + ("EP PROOF PASSED" if ok else f"EP PROOF FAILED: {failures}"))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "target": target, "params": params, "geometry": geo,
                                               "tokens": args.tokens, "rows": rows, "failures": failures,
                                               "passed": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
