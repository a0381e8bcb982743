"""Argument checks shared by the CPU decode (`fp4.py`) and the Triton kernel (`fp4_triton.py`): types, shapes,
devices and the output buffer, in one place that neither decoder imports the other for."""

from __future__ import annotations

import torch

from ..dtypes import FP4_GROUP


def scale_bytes(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 scales (uint8 or float8_e8m0fnu) as uint8 bytes, no copy."""
    if scales.dtype == torch.uint8:
        return scales
    if scales.dtype in (torch.float8_e8m0fnu, torch.int8):
        return scales.view(torch.uint8)
    raise TypeError(f"E8M0 scales must be uint8 or float8_e8m0fnu, got {scales.dtype}")


def checked_args(packed: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale bytes, out) for a decode of `packed` codes [..., K/2] with `scales` [..., K/32]: types, shapes and
    devices checked; `out` made (BF16 [..., K] on the codes' device) or checked."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"FP4 codes must be int8 or uint8, got {packed.dtype}")
    sb = scale_bytes(scales)
    if packed.dim() == 0:
        raise ValueError("FP4 codes must have at least one dimension [..., K/2]")
    k_half = packed.shape[-1]
    if packed.shape[:-1] != sb.shape[:-1] or k_half * 2 != sb.shape[-1] * FP4_GROUP:
        raise ValueError(f"codes {tuple(packed.shape)} and scales {tuple(sb.shape)} do not match: "
                         f"expected scales [..., K/{FP4_GROUP}] for codes [..., K/2]")
    if sb.device != packed.device:
        raise ValueError(f"codes are on {packed.device} but scales on {sb.device}")
    shape = (*packed.shape[:-1], k_half * 2)
    if out is None:
        return sb, torch.empty(shape, dtype=torch.bfloat16, device=packed.device)
    check_out(out, shape, packed.device)
    return sb, out


def check_out(out: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a tensor, got {type(out).__name__}")
    if out.dtype != torch.bfloat16:
        raise TypeError(f"out must be bfloat16, got {out.dtype}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, codes are on {device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
