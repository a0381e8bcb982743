"""What the GPU proofs share: a flashinfer import from an unpacked tree without its __init__, the source experts of
one block read with safetensors, their exact FP32 dequant, FP8 activations, and the FP32 reference MoE."""

from __future__ import annotations

import datetime
import importlib.machinery
import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import torch


def log(*a) -> None:
    print(*a, flush=True)


def install_flashinfer_stub(site: str) -> None:
    """Import `flashinfer.<sub>` from an unpacked tree at `site` without running flashinfer/__init__.py (which
    imports every backend, the cutlass DSL among them)."""
    site = os.path.abspath(site)
    pkg_dir = os.path.join(site, "flashinfer")
    if not os.path.isdir(pkg_dir):
        raise SystemExit(f"--fi-site {site}: no flashinfer/ folder there; give the folder that holds flashinfer/")
    if site not in sys.path:
        sys.path.insert(0, site)
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = [pkg_dir]
    pkg.__file__ = os.path.join(pkg_dir, "__init__.py")
    spec = importlib.machinery.ModuleSpec("flashinfer", None, is_package=True)
    spec.submodule_search_locations = [pkg_dir]
    pkg.__spec__ = spec  # so importlib.util.find_spec("flashinfer") answers instead of raising
    sys.modules["flashinfer"] = pkg


def machine_info() -> dict:
    info = {"date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    gpu_mem_gib=round(p.total_memory / 2**30, 1))
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        info["nvidia_smi"] = f"unavailable ({e})"
    return info


def read_source_experts(ckpt: Path, block: str, n_experts: int) -> dict[str, torch.Tensor]:
    """Stacked source tensors of one block: w{1,2,3}.{weight,scale} as [E, ...] (uint8 views)."""
    from safetensors import safe_open

    wm = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    out: dict[str, list[torch.Tensor]] = {}
    for j in range(n_experts):
        for leg in ("w1", "w2", "w3"):
            for kind in ("weight", "scale"):
                name = f"{block}.ffn.experts.{j}.{leg}.{kind}"
                with safe_open(str(ckpt / wm[name]), framework="pt") as f:
                    out.setdefault(f"{leg}.{kind}", []).append(f.get_tensor(name).view(torch.uint8))
    return {k: torch.stack(v) for k, v in out.items()}


def reference_weights(src: dict[str, torch.Tensor], device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact BF16 dequant of the source, as FP32 on `device`: W1, W3 [E, I, H], W2 [E, H, I]."""
    from fimoe_convert.numerics import dequant_fp4_to_bf16

    def deq(leg):
        return dequant_fp4_to_bf16(src[f"{leg}.weight"], src[f"{leg}.scale"]).float().to(device)

    return deq("w1"), deq("w3"), deq("w2")


def fp8_activations(x: torch.Tensor):
    """[m, H] FP32 -> E4M3 [m, H] and FP32 power-of-two scales [m, H/128] (amax/448 rounded up), as
    DeepGEMM-style per-token 1x128 quantization; returns also the exact dequantized FP32 input."""
    m, h = x.shape
    xb = x.view(m, h // 128, 128)
    amax = xb.abs().amax(-1).clamp_min(1e-30)
    sf = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (xb / sf.unsqueeze(-1)).to(torch.float8_e4m3fn)
    deq = (q.float() * sf.unsqueeze(-1)).view(m, h)
    return q.view(m, h).contiguous(), sf.contiguous(), deq


def fp8_round_rows_per128(v: torch.Tensor) -> torch.Tensor:
    """Round [rows, I] to E4M3 with one UE8M0 scale per 128 columns (the kernel's L1 output), back to FP32."""
    r, n = v.shape
    vb = v.view(r, n // 128, 128)
    amax = vb.abs().amax(-1, keepdim=True)
    sf = torch.exp2(torch.ceil(torch.log2((amax / 448.0).clamp_min(2.0**-126))))
    return ((vb / sf).to(torch.float8_e4m3fn).float() * sf).view(r, n)


def reference_moe(x: torch.Tensor, w1, w3, w2, topk_idx, topk_w, clamp: float | None, fp8_intermediate: bool = False):
    """FP32 MoE: y[t] = sum_k w[t,k] * W2[e] @ (silu(min(W1[e] x, c)) * clamp(W3[e] x, -c, c)); routes < 0 skipped."""
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    stats = {"gate_clamped": 0, "up_clamped": 0, "values": 0}
    for e in range(w1.shape[0]):
        tok, slot = (topk_idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        g = xe @ w1[e].T
        u = xe @ w3[e].T
        if clamp is not None:
            stats["gate_clamped"] += int((g > clamp).sum())
            stats["up_clamped"] += int((u.abs() > clamp).sum())
            stats["values"] += g.numel()
            g = torch.clamp(g, max=clamp)
            u = torch.clamp(u, -clamp, clamp)
        h = torch.nn.functional.silu(g) * u * topk_w[tok, slot].unsqueeze(-1)
        if fp8_intermediate:
            h = fp8_round_rows_per128(h)
        y.index_add_(0, tok, h @ w2[e].T)
    return y, stats


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_routes(idx: torch.Tensor, wts: torch.Tensor, lo: int, hi: int, mask: str = "minus_one"):
    """One EP rank's view of global top-k routes: ids of its experts [lo, hi) made local; the other ranks' routes
    masked with -1 (`mask="minus_one"`, FlashInfer's pad-route mask) or, as a control, sent to local expert 0
    with weight 0 (`mask="zero_weight"`)."""
    mine = (idx >= lo) & (idx < hi)
    if mask == "minus_one":
        return torch.where(mine, idx - lo, torch.full_like(idx, -1)), wts
    return torch.where(mine, idx - lo, torch.zeros_like(idx)), torch.where(mine, wts, torch.zeros_like(wts))
