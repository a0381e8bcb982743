"""FP4 (E2M1, two codes per byte, element 2i in the low nibble) with one E8M0 scale per 32 values.

`dequant_fp4_to_bf16` is bit-identical to the seed formula (vLLM's `_dequant_fp4_ue8m0_gran32`:
float32 LUT with -0.0 for code 8, scale `(s << 23)` as float32, product cast to BF16) for every
scale byte: an E2M1 value times a power of two is exact, so a table of BF16 pairs indexed by
(scale byte, code byte) reproduces it without float arithmetic on the hot path.
"""

from __future__ import annotations

import torch

FP4_GROUP = 32  # K values per E8M0 scale
SCALE_NAN_BYTE = 255  # E8M0 NaN; corrupt input
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

_PAIR_TABLES: dict[torch.device, torch.Tensor] = {}


def scale_bytes(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 scales (uint8 or float8_e8m0fnu) as uint8 bytes, no copy."""
    if scales.dtype == torch.uint8:
        return scales
    if scales.dtype in (torch.float8_e8m0fnu, torch.int8):
        return scales.view(torch.uint8)
    raise TypeError(f"E8M0 scales must be uint8 or float8_e8m0fnu, got {scales.dtype}")


def find_nan_scales(scales: torch.Tensor) -> int:
    """How many scale bytes are 255 (NaN in E8M0)."""
    return int((scale_bytes(scales) == SCALE_NAN_BYTE).sum())


def _pair_table(device: torch.device) -> torch.Tensor:
    """int32 [256 * 256]: entry (s << 8 | b) holds the two BF16 values of code byte b at scale byte s,
    low nibble in the low half (the element that comes first in memory on little-endian)."""
    table = _PAIR_TABLES.get(device)
    if table is None:
        lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        scale = (torch.arange(256, dtype=torch.int32) << 23).view(torch.float32)  # 2**(s-127), as the seed
        byte = torch.arange(256)
        lo = (lut[byte & 0xF][None, :] * scale[:, None]).to(torch.bfloat16).view(torch.int16).to(torch.int32)
        hi = (lut[byte >> 4][None, :] * scale[:, None]).to(torch.bfloat16).view(torch.int16).to(torch.int32)
        table = ((lo & 0xFFFF) | (hi << 16)).reshape(-1).to(device)
        _PAIR_TABLES[device] = table
    return table


def dequant_fp4_to_bf16(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[..., K/2] int8/uint8 codes and [..., K/32] uint8/float8_e8m0fnu scales -> BF16 [..., K]."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"FP4 codes must be int8 or uint8, got {packed.dtype}")
    sb = scale_bytes(scales)
    k_half = packed.shape[-1]
    if packed.shape[:-1] != sb.shape[:-1] or k_half * 2 != sb.shape[-1] * FP4_GROUP:
        raise ValueError(f"codes {tuple(packed.shape)} and scales {tuple(sb.shape)} do not match: "
                         f"expected scales [..., K/{FP4_GROUP}] for codes [..., K/2]")
    if packed.device.type == "cuda":
        from .fp4_triton import dequant_fp4_to_bf16_cuda

        return dequant_fp4_to_bf16_cuda(packed, sb)
    groups = sb.shape[-1]
    codes = packed.view(torch.uint8).reshape(*packed.shape[:-1], groups, FP4_GROUP // 2)
    index = (sb.to(torch.int32) << 8).unsqueeze(-1) | codes.to(torch.int32)
    pairs = _pair_table(packed.device)[index.reshape(-1)]
    return pairs.view(torch.bfloat16).reshape(*packed.shape[:-1], k_half * 2)


def dequant_fp8_block_to_bf16(weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """FP8 E4M3 [out, in] with one F32 scale per `block` tile (Base checkpoints) -> BF16 [out, in]."""
    rows, cols = block
    out, inp = weight.shape
    s = scales.float().repeat_interleave(rows, 0)[:out].repeat_interleave(cols, 1)[:, :inp]
    return (weight.float() * s).to(torch.bfloat16)
