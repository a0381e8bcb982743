"""On a GPU: FlashInfer's deepgemm preprocess with an sgl-deep-gemm `deep_gemm`, and
`fimoe-convert --target sm100_fp8_fp4_bf16_deepgemm --device cuda` checked against it, bit for bit.

usage: python3 scripts/gpu/check_deepgemm.py WORK    (deep_gemm, flashinfer.moe_ep and fimoe_convert importable)

1. plain: FlashInfer's load-time path (the backend's `preprocess_weights`, which `MoEEpMegaLayer` calls
   when `MegaConfig(preprocess_weights=True)`) and the public `preprocess_mega_weights`, on CUDA, on the
   experts of a tiny fixture; then our CLI in a subprocess (without and with `--arch 10.0`).
   If that ran, every block and rank of our output is compared with it.
2. only when 1 failed with DeepGEMM's architecture dispatch ("Unknown SF transformation", compute
   capability 9.x): the same, in this process, with `deep_gemm.transform_sf_into_required_layout`
   replaced by the body DeepGEMM runs for (FP32, gran (1, 32)) when the device is SM100
   (`deep_gemm.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor`, a JIT CUDA kernel). That is
   NOT FlashInfer's path on this GPU; it is labelled "arch dispatch bypassed" wherever it is printed."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

T0 = time.perf_counter()
TARGET = "sm100_fp8_fp4_bf16_deepgemm"
WORK = Path(sys.argv[1])
SRC = WORK / "k"
DEV = os.environ.get("DG_CHECK_DEVICE", "cuda")  # "cpu" only for a dry run of this script with a stand-in deep_gemm


def say(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def exact(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " / ")


import deep_gemm  # noqa: E402 - after the sys.path and device setup above
import flashinfer.moe_ep as me  # noqa: E402 - after the sys.path and device setup above
from flashinfer.moe_ep.core.kernel import registry  # noqa: E402 - after the sys.path and device setup above
from safetensors import safe_open  # noqa: E402 - after the sys.path and device setup above

import fimoe_convert  # noqa: E402 - after the sys.path and device setup above
from fimoe_convert.numerics.structure import same_object  # noqa: E402 - after the sys.path and device setup above
from fimoe_convert.runtime import load_transformed_weights  # noqa: E402 - after the sys.path and device setup above
from fimoe_convert.testing import make_checkpoint  # noqa: E402 - after the sys.path and device setup above

gpu = (
    f"{torch.cuda.get_device_name()} cc {'.'.join(map(str, torch.cuda.get_device_capability()))}"
    if DEV == "cuda"
    else DEV
)
say(f"deep_gemm {getattr(deep_gemm, '__version__', '?')} ({deep_gemm.__file__}); torch {torch.__version__}; {gpu}; "
    f"fimoe_convert {fimoe_convert.__file__}")

make_checkpoint(SRC, "tiny", inter=256)  # I=256: every packed scale tensor has >1 column (see the report)
cfg = json.loads((SRC / "config.json").read_text())
H, INTER = cfg["hidden_size"], cfg["moe_intermediate_size"]
E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
BLOCKS = [f"layers.{i}" for i in range(cfg["num_hidden_layers"])] + [
    f"mtp.{k}" for k in range(cfg["num_nextn_predict_layers"])
]
EP = 2
index = json.loads((SRC / "model.safetensors.index.json").read_text())["weight_map"]
say(f"fixture {SRC}: H={H} I={INTER} experts={E} top_k={K} blocks={BLOCKS}")


def tensor(name):
    with safe_open(str(SRC / index[name]), "pt") as f:
        return f.get_tensor(name)


def fi_pack(block, lo, hi):
    """MoEWeightPack of the checkpoint's FP4 experts, built here from the files (gate rows, then up rows;
    raw uint8 E8M0 scales), on CUDA."""
    get = lambda leg, kind: torch.stack([tensor(f"{block}.ffn.experts.{j}.{leg}.{kind}") for j in range(lo, hi)])
    w13 = torch.cat([get("w1", "weight"), get("w3", "weight")], 1).view(torch.uint8)
    s13 = torch.cat([get("w1", "scale"), get("w3", "scale")], 1).view(torch.uint8)
    return me.MoEWeightPack(w13.to(DEV), get("w2", "weight").view(torch.uint8).to(DEV), s13.to(DEV),
                            get("w2", "scale").view(torch.uint8).to(DEV))


def fi_load_path(pack, n):
    """What MoEEpMegaLayer._preprocess_weights does: the registered backend's preprocess_weights."""
    backend = registry.create_mega_kernel(
        me.Sm100_Fp8_Fp4_Bf16_Deepgemm_MegaMoeConfig(intermediate_size=INTER, top_k=K)
    )
    backend.bind_ep_bootstrap(me.BootstrapConfig(world_size=1, rank=0))
    return backend.preprocess_weights(pack, me.FleetParams(num_experts=n, max_tokens_per_rank=128, token_hidden_size=H))


def fi_public(pack):
    return me.preprocess_mega_weights(pack, intermediate_size=INTER, hidden_size=H)


def describe(obj):
    return [(tuple(t.shape), str(t.dtype).removeprefix("torch."), tuple(t.stride())) for pair in obj for t in pair]


def cli(out, *extra, debug=False):
    cmd = [sys.executable, "-m", "fimoe_convert", str(SRC), str(out), "--target", TARGET, "--device", DEV,
           "--ep-size", str(EP), *extra]
    env = dict(os.environ, FIMOE_DEBUG="1" if debug else "0")
    t = time.perf_counter()
    # cwd: `python3 -m` puts the working directory first on sys.path, ahead of PYTHONPATH
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=WORK)
    lines = (p.stdout + p.stderr).strip().splitlines()
    say(
        f"$ (cd {WORK}) {' '.join(cmd[1:])}{'  (FIMOE_DEBUG=1)' if debug else ''}  "
        f"-> rc {p.returncode} in {time.perf_counter() - t:.1f} s"
    )
    for ln in [x for x in lines if "converting:" not in x][-30:]:
        print("    " + ln, flush=True)
    return p.returncode


def compare(out, label):
    """Every block and rank of our output against FlashInfer's load-time path on the same experts."""
    n = ok = 0
    first = None
    for block in BLOCKS:
        for rank in range(EP):
            lo, hi = rank * E // EP, (rank + 1) * E // EP
            pack = fi_pack(block, lo, hi)
            want = fi_load_path(pack, hi - lo)
            pub = fi_public(pack)
            got = load_transformed_weights(out, block, rank, device=DEV)
            same, same_pub = same_object(got, want), same_object(pub, want)
            n += 1
            ok += same and same_pub
            first = first or (got, block)
            say(f"{label}: {block} rank {rank} experts [{lo},{hi}): ours == FlashInfer load-time path: {same}; "
                f"public preprocess_mega_weights == load-time path: {same_pub}")
    # negative control: the first block's object against the next block's reference
    got0, b0 = first
    nxt = BLOCKS[1]
    ctrl = same_object(got0, fi_load_path(fi_pack(nxt, 0, E // EP), E // EP))
    say(f"{label}: negative control ({b0} rank 0 vs FlashInfer of {nxt} rank 0) same: {ctrl} (want False)")
    return ok, n, ctrl


# 1. plain ----------------------------------------------------------------------------------------
say("== 1. plain: FlashInfer's deepgemm preprocess on CUDA with this deep_gemm (no changes)")
plain_ok = False
arch_blocked = False
try:
    pack = fi_pack(BLOCKS[0], 0, E)
    ref = fi_load_path(pack, E)
    torch.cuda.synchronize() if DEV == "cuda" else None
    plain_ok = True
    say(f"FlashInfer preprocess ran: {describe(ref)}")
except Exception as e:  # noqa: BLE001
    msg = exact(e)
    arch_blocked = "Unknown SF transformation" in msg
    say(f"FlashInfer preprocess FAILED: {msg}")
    tb = traceback.format_exc().strip().splitlines()
    for ln in tb[-12:]:
        print("    " + ln, flush=True)

cli(WORK / "o_noarch")
rc = cli(WORK / "o_plain", "--arch", "10.0")
if plain_ok and rc == 0:
    ok, n, ctrl = compare(WORK / "o_plain", "plain")
    say(f"DEEPGEMM ON THIS GPU (plain FlashInfer path): {ok}/{n} block-ranks bit-identical; control {ctrl}")
    say(f"total {time.perf_counter() - T0:.1f} s")
    sys.exit(0 if ok == n and not ctrl else 1)

if not arch_blocked:
    say("not the architecture dispatch: stopping here")
    sys.exit(1)

# 2. arch dispatch bypassed ----------------------------------------------------------------------------
say("== 2. ARCH DISPATCH BYPASSED (not FlashInfer's path on this GPU): transform_sf_into_required_layout -> "
    "the SM100 branch body, deep_gemm.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor")
from deep_gemm.utils import layout as dg_layout  # noqa: E402 - after the sys.path and device setup above

_orig = deep_gemm.transform_sf_into_required_layout


def _sm100_branch(sf, mn, k, recipe, num_groups=None, is_sfa=None, disable_ue8m0_cast=False, *a, **kw):
    # DeepGEMM (csrc/apis/layout.hpp), (FP32, gran_mn, gran_k in {32, 128}) when arch_major == 10:
    # broadcast rows when gran_mn > 1 (not here: FlashInfer passes (1, 32)), then pack into UE8M0.
    assert sf.dtype == torch.float32 and tuple(recipe) == (1, 32) and not disable_ue8m0_cast, (sf.dtype, recipe)
    assert sf.shape[-2:] == (mn, k // 32) and (num_groups is None or sf.shape[0] == num_groups)
    return dg_layout.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)


deep_gemm.transform_sf_into_required_layout = _sm100_branch

# the JIT kernel against DeepGEMM's own PyTorch fallback of the same packing
s = (pack.w13_scale.to(torch.int32) << 23).view(torch.float32)
kern = dg_layout.get_mn_major_tma_aligned_packed_ue8m0_tensor(s)
fb = dg_layout._pack_fp32_into_ue8m0_fallback(s) if hasattr(dg_layout, "_pack_fp32_into_ue8m0_fallback") else None
say(f"bypass: packed scales {tuple(kern.shape)} {kern.dtype} stride {kern.stride()}; "
    f"== DeepGEMM's torch fallback: {None if fb is None else same_object(kern, fb)}")

try:
    ref = fi_load_path(pack, E)
    say(f"bypass: FlashInfer preprocess ran: {describe(ref)}")
except Exception as e:  # noqa: BLE001
    say(f"bypass: FlashInfer preprocess FAILED: {exact(e)}")
    sys.exit(1)

out = WORK / "o_bypass"
argv = sys.argv
sys.argv = ["fimoe_convert", str(SRC), str(out), "--target", TARGET, "--device", DEV, "--arch", "10.0",
            "--ep-size", str(EP)]
t = time.perf_counter()
try:
    runpy.run_module("fimoe_convert", run_name="__main__", alter_sys=False)
    code = 0
except SystemExit as e:
    code = e.code
sys.argv = argv
say(f"bypass: python3 -m fimoe_convert {SRC} {out} --target {TARGET} --device {DEV} --arch 10.0 --ep-size {EP} "
    f"(run in this process) -> exit {code} in {time.perf_counter() - t:.1f} s")
if code not in (0, None):
    sys.exit(1)
ok, n, ctrl = compare(out, "bypass")
say(f"DEEPGEMM H200 (ARCH DISPATCH BYPASSED): {ok}/{n} block-ranks bit-identical to FlashInfer's load-time path "
    f"run the same way; negative control same: {ctrl}")
deep_gemm.transform_sf_into_required_layout = _orig
say(f"total {time.perf_counter() - T0:.1f} s")
sys.exit(0 if ok == n and not ctrl else 1)
