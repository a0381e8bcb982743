"""MXFP4 input preparation for FlashInfer's SM90 MegaMoE (`flashinfer.megamoe.weights` documents it):
Marlin nibble order, and E8M0 scales moved into the kernel's decoder window with the excess in a
per-expert power-of-two global scale. FlashInfer's own transform then owns the tile layout."""

from __future__ import annotations

import torch

from ..records import WindowReport
from .fp4 import FP4_GROUP, scale_bytes

WINDOW_LO = 127 - 5  # E8M0 byte of 2**-5, the smallest scale the decoder keeps exact
WINDOW_HI = 127 + 6  # E8M0 byte of 2**6, the largest
_E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def linear_to_marlin(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes with K[2i] in the low nibble of byte i -> Marlin order: in each 4-byte word,
    byte j holds K[j] in the high nibble and K[j+4] in the low nibble."""
    b = packed.view(torch.uint8)
    if b.shape[-1] % 4:
        raise ValueError(f"Marlin order needs K a multiple of 8, got K/2 = {b.shape[-1]}")
    w = b.reshape(*b.shape[:-1], -1, 4)
    codes = torch.stack([w & 0xF, w >> 4], dim=-1).reshape(*w.shape[:-1], 8)  # K[0..7] of each word
    return ((codes[..., :4] << 4) | codes[..., 4:]).reshape(b.shape)


def marlin_to_linear(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `linear_to_marlin`."""
    w = packed.view(torch.uint8).reshape(*packed.shape[:-1], -1, 4)
    codes = torch.cat([w >> 4, w & 0xF], dim=-1)  # K[0..7]
    pairs = codes.reshape(*codes.shape[:-1], 4, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).reshape(packed.shape)




def _group_nonzero(packed_u8: torch.Tensor) -> torch.Tensor:
    """[E, N, K/2] -> bool [E, N, K/32]: does the group hold a nonzero code (sign aside)."""
    nz = ((packed_u8 & 0x7) != 0) | ((packed_u8 & 0x70) != 0)
    return nz.reshape(*packed_u8.shape[:-1], -1, FP4_GROUP // 2).any(-1)


def _requantize(codes: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, one per element) scaled by 2**shift (shift <= 0), rounded to the nearest E2M1 code."""
    mag = _E2M1_MAGNITUDES[(codes & 7).long()] * torch.exp2(shift.float())
    idx = torch.bucketize(mag, _E2M1_MIDPOINTS, right=False).to(torch.uint8)
    return idx | (codes & 8)


def window_scales(packed: torch.Tensor, scales: torch.Tensor, allow_lossy: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, WindowReport, list[int]]:
    """Per expert (dim 0), shift every scale byte of groups with nonzero codes into
    [WINDOW_LO, WINDOW_HI] by one integer exponent g: value = fp4 * 2**(s - g - 127) * 2**g.

    Returns (packed, scale bytes, g per expert as int32, report, experts whose span does not fit).
    Exact when an expert's span of scale bytes is at most the window's 12 steps. Otherwise, with
    `allow_lossy`, g keeps the largest scales exact and smaller groups are requantized to the
    window's lowest scale (rounded to the nearest E2M1 value); without it, nothing is changed and
    the offending experts are returned for the caller to report."""
    p = packed.view(torch.uint8)
    s = scale_bytes(scales).to(torch.int32)
    nz = _group_nonzero(p)
    big = torch.where(nz, s, torch.full_like(s, -1)).flatten(1).amax(1)
    small = torch.where(nz, s, torch.full_like(s, 256)).flatten(1).amin(1)
    empty = big < 0
    big = torch.where(empty, torch.full_like(big, WINDOW_HI), big)
    small = torch.where(empty, torch.full_like(small, WINDOW_LO), small)
    lo_g, hi_g = big - WINDOW_HI, small - WINDOW_LO  # feasible shifts g in [lo_g, hi_g]
    fits = lo_g <= hi_g
    bad = (~fits).nonzero().flatten().tolist()
    report = WindowReport(groups=int(nz.sum()))
    if bad and not allow_lossy:
        return p, s.to(torch.uint8), torch.zeros_like(big), report, bad
    g = torch.where(fits, torch.clamp(torch.zeros_like(lo_g), lo_g, hi_g), lo_g)  # 0 when it fits as is
    shifted = s - g.view(-1, *([1] * (s.dim() - 1)))
    clamp = nz & (shifted < WINDOW_LO)
    new_s = shifted.clamp(WINDOW_LO, WINDOW_HI).to(torch.uint8)
    new_p = p
    if bool(clamp.any()):
        # Requantize clamped groups: their values scale by 2**(shifted - WINDOW_LO) at the window's lowest scale.
        codes = torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2)
        codes = codes.reshape(*codes.shape[:-1], -1, FP4_GROUP)
        shift = (shifted - WINDOW_LO).clamp(max=0).unsqueeze(-1).expand_as(codes)
        req = torch.where(clamp.unsqueeze(-1), _requantize(codes, shift), codes).flatten(-2)
        req = req.reshape(*req.shape[:-1], -1, 2)
        new_p = req[..., 0] | (req[..., 1] << 4)
        report.clamped_groups = int(clamp.sum())
        report.lossy_experts = len(bad)
    return new_p, new_s, g, report, bad
