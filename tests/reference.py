"""Independent references for tests: the seed dequant formula, written from its description
(vLLM's `_dequant_fp4_ue8m0_gran32`), sharing no code with the package; and a reader of a whole
output folder through the safetensors library."""

import json
from pathlib import Path

import torch
from safetensors import safe_open

HUB_REPO = "deepseek-ai/DeepSeek-V4-Tiny"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"

SEED_LUT = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def seed_dequant(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    lut = torch.tensor(SEED_LUT, dtype=torch.float32, device=packed.device)
    b = packed.view(torch.uint8).to(torch.int64)
    vals = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).flatten(-2)  # element 2i = low nibble
    s = (scales.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    k = vals.shape[-1]
    return (
        (vals.reshape(*vals.shape[:-1], k // 32, 32) * s.unsqueeze(-1)).reshape(*vals.shape[:-1], k).to(torch.bfloat16)
    )


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def load_all(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint folder, by name."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for shard in sorted(set(index.values())):
        with safe_open(str(folder / shard), "pt") as f:
            for k in f.keys():  # noqa: SIM118 - safe_open is not a dict
                out[k] = f.get_tensor(k)
    return out
