"""Run in a fresh process per kernel (FlashInfer's SM100 and SM90 kernel trees cannot share one):
convert SRC for TARGET with --ep-size 2, load every block and rank through the runtime loader, and
compare with FlashInfer's own preprocess function called directly on the same experts, prepared
independently here (checkpoint bytes via safe_open, BF16 via the seed formula).
usage: python moe_ep_roundtrip.py [--arch X.Y] TARGET SRC OUT [KEY=VALUE ...]   -> prints 'OK <units compared>'
(--arch: the compute capability converted for, when it is not the GPU's own)"""

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).parents[1]))
from reference import seed_dequant  # noqa: E402

from fimoe_convert import convert  # noqa: E402
from fimoe_convert.numerics.structure import same_object  # noqa: E402
from fimoe_convert.runtime import load_transformed_weights  # noqa: E402

argv = sys.argv[1:]
arch = None
if argv[:1] == ["--arch"]:
    arch, argv = argv[1], argv[2:]
target, src, out = argv[:3]
params = dict(a.split("=", 1) for a in argv[3:])
src = Path(src)
convert(str(src), out, target, ep_size=2, params=params, arch=arch)
cfg = json.loads((src / "config.json").read_text())
H, INTER = cfg["hidden_size"], cfg["moe_intermediate_size"]
E = cfg["n_routed_experts"]
index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]


def t(name):
    with safe_open(str(src / index[name]), "pt") as f:
        return f.get_tensor(name)


def experts(block, lo, hi):
    get = lambda leg, kind: torch.stack([t(f"{block}.ffn.experts.{j}.{leg}.{kind}") for j in range(lo, hi)])  # noqa: E731
    return {f"{leg}.{kind}": get(leg, kind) for leg in ("w1", "w2", "w3") for kind in ("weight", "scale")}


import flashinfer.moe_ep as me  # noqa: E402


def fp4_pack(x, e8m0):
    w13 = torch.cat([x["w1.weight"], x["w3.weight"]], 1).view(torch.uint8)
    s13 = torch.cat([x["w1.scale"], x["w3.scale"]], 1).view(torch.uint8)
    s2 = x["w2.scale"].view(torch.uint8)
    if e8m0:
        s13, s2 = s13.view(torch.float8_e8m0fnu), s2.view(torch.float8_e8m0fnu)
    return me.MoEWeightPack(w13, x["w2.weight"].view(torch.uint8), s13, s2)


def bf16_pack(x):
    w13 = torch.cat([seed_dequant(x["w1.weight"], x["w1.scale"]), seed_dequant(x["w3.weight"], x["w3.scale"])], 1)
    return me.MoEWeightPack(w13, seed_dequant(x["w2.weight"], x["w2.scale"]))


def direct(x):
    geo = dict(intermediate_size=INTER, hidden_size=H)
    if target in ("sm107_mxfp8_mxfp4_bf16_cutedsl", "sm107_mxfp4_mxfp4_bf16_cutedsl"):
        return me.preprocess_sm107_mxfp4_mega_weights(fp4_pack(x, True), **geo)
    if target == "sm100_mxfp8_mxfp4_bf16_cutedsl":  # no public function: the kernel's own helper
        from flashinfer.moe_ep.kernel_src.sm100.next_cutedsl_megamoe.shim.kernel_helpers import (
            preprocess_prequantized_block_scaled_weights,
        )
        p = fp4_pack(x, True)
        return preprocess_prequantized_block_scaled_weights(p.w13, p.w2, p.w13_scale, p.w2_scale,
                                                            quant_kind="mxfp4_mxfp8", **geo)
    if target == "sm120_mxfp4_mxfp8_bf16_cake":
        return me.preprocess_sm120_mxfp4_mxfp8_cake_mega_weights(fp4_pack(x, False), **geo)
    if target == "sm100_bf16_bf16_bf16_cutedsl":
        return me.preprocess_bf16_cutedsl_mega_weights(bf16_pack(x), **geo)
    if target == "sm100_mxfp8_mxfp8_bf16_cutedsl":
        return me.preprocess_mxfp8_cutedsl_mega_weights(bf16_pack(x), **geo)
    if target == "sm90_fp8_fp8_bf16_pull_cutedsl":
        return me.preprocess_sm90_pull_fp8_mega_weights(bf16_pack(x), **geo, **params)
    if target == "sm90_fp8_mxfp4_bf16_pull_cutedsl":
        return me.preprocess_sm90_pull_mxfp4_mega_weights(fp4_pack(x, False), **geo)
    if target == "sm100_nvfp4_nvfp4_bf16_cutedsl":
        return me.preprocess_nvfp4_cutedsl_mega_weights(bf16_pack(x), **geo)
    if target == "sm100_fp8_fp4_bf16_deepgemm":
        return me.preprocess_mega_weights(fp4_pack(x, False), **geo)
    raise SystemExit(f"no direct reference for {target}")


device = "cuda" if torch.cuda.is_available() else "cpu"
blocks = [f"layers.{i}" for i in range(cfg["num_hidden_layers"])] + [
    f"mtp.{k}" for k in range(cfg["num_nextn_predict_layers"])
]
n = 0
for block in blocks:
    for rank in (0, 1):
        lo, hi = rank * E // 2, (rank + 1) * E // 2
        x = experts(block, lo, hi)
        if device == "cuda":
            x = {k: v.cuda() for k, v in x.items()}
        want = direct(x)
        got = load_transformed_weights(out, block, rank, device=device)
        if not same_object(got, want):
            raise SystemExit(f"MISMATCH {target} {block} rank {rank}")
        n += 1
print(f"OK {n}")
