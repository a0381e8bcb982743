"""FP4 (E2M1 + one E8M0 scale per 32 values) to FP8 E4M3 with one E8M0 scale per `block` tile.

The rule of DeepSeek's `inference/convert.py --expert-dtype fp8` (`cast_e2m1fn_to_e4m3fn`): a tile's
scale is the largest per-32 scale in the tile divided by 2**6, and every value is multiplied by its
group's offset from that, a power of two 2**k with k <= 6 (6 * 2**6 = 384 fits E4M3's 448). Done here
with integer exponents: tile byte t = max(s_max - 6, 1), k = s - t. (The clamp to 1 only matters when
every scale byte of a tile is below 7, i.e. scales under 2**-120; it keeps the tile scale a normal
float32 and away from byte 0, which some decoders read as 0.)

E2M1 values have at most two significant bits, so v * 2**k is exact in E4M3 for k in [-8, 6]
(0.5 * 2**-8 = 2**-9 is E4M3's smallest subnormal): a tile whose per-32 scale bytes span at most
`EXACT_SPAN` = 14 is always exact. A wider span can still be exact (it depends on which codes sit
in the low groups), so exactness is checked per tile, by comparing the FP8 result dequantized
(float32, value * 2**(t-127)) with the FP4 source dequantized (float32, value * 2**(s-127)),
for exact equality. Both are exact in float32 (no product leaves its range except to +-inf, and
then both sides give the same inf).

Pure tensor functions, CPU or any torch device; work is done in row chunks of whole tiles."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fp4 import E2M1_VALUES, FP4_GROUP, scale_bytes

MAX_OFFSET_BITS = 6  # tile scale = largest per-32 scale / 2**6; 6 * 2**6 = 384 <= 448 (E4M3 max)
EXACT_SPAN = 14  # per-32 scale bytes of a tile spanning at most this many steps always convert exactly
MIN_TILE_BYTE = 1  # tile scale bytes are at least this (2**-126, a normal float32)
_CHUNK_ELEMS = 1 << 20  # values per work chunk (rounded to whole tile rows)


def pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """2.0**e for integer exponents, exactly, as float32 (subnormal or 0 below 2**-126, inf above 2**127)."""
    e64 = e.to(torch.int64).clamp(-1074, 1023)
    return ((e64 + 1023) << 52).view(torch.float64).to(torch.float32)  # exact in float64; one rounding to f32


def e8m0_to_f32(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 scales (uint8 bytes or float8_e8m0fnu) -> float32 2**(s-127); byte 255 (NaN) -> NaN."""
    b = scale_bytes(scales).to(torch.int32)
    out = pow2_f32(b - 127)
    return out.masked_fill_(b == 255, float("nan"))


def fp4_values_f32(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] FP4 code bytes -> float32 E2M1 values [..., K] (element 2i from the low nibble; -0.0 for code 8)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    b = packed.view(torch.uint8).to(torch.int64)
    return torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).flatten(-2)


def _check_block(block: tuple[int, int]) -> tuple[int, int]:
    rows, cols = (int(b) for b in block)
    if rows <= 0 or cols <= 0 or cols % FP4_GROUP:
        raise ValueError(f"block {tuple(block)}: expected [rows, cols] with cols a multiple of {FP4_GROUP}")
    return rows, cols


def _tile_map(t: torch.Tensor, rows: int, gpt: int, n: int, groups: int) -> torch.Tensor:
    """Tile values [tr, tc] -> per-group values [n, groups]."""
    return t.repeat_interleave(rows, 0)[:n].repeat_interleave(gpt, 1)[:, :groups]


def _per_tile(x: torch.Tensor, rows: int, cols: int, reduce: str) -> torch.Tensor:
    """[n, K] -> [ceil(n/rows), ceil(K/cols)] by any/amax over each tile (zero padding)."""
    n, k = x.shape
    tr, tc = -(-n // rows), -(-k // cols)
    if (tr * rows, tc * cols) != (n, k):
        x = torch.nn.functional.pad(x, (0, tc * cols - k, 0, tr * rows - n))
    x = x.view(tr, rows, tc, cols)
    return x.any(dim=3).any(dim=1) if reduce == "any" else x.amax(dim=3).amax(dim=1)


@dataclass
class Fp8BlockResult:
    weight: torch.Tensor  # float8_e4m3fn [out, in]
    tile_bytes: torch.Tensor  # uint8 [ceil(out/rows), ceil(in/cols)]: E8M0 tile scales
    lossy: torch.Tensor  # bool [tiles]: the tile's dequantized FP8 differs from the dequantized FP4
    max_abs: torch.Tensor  # float32 [tiles]: largest |FP8 - FP4| (dequantized) in the tile, 0 if exact
    max_rel: torch.Tensor  # float32 [tiles]: largest |FP8 - FP4| / |FP4| in the tile, 0 if exact

    @property
    def lossy_tiles(self) -> int:
        return int(self.lossy.sum())

    def tile_scales_f32(self) -> torch.Tensor:
        """The tile scales as float32 2**(t-127) (exact)."""
        return pow2_f32(self.tile_bytes.to(torch.int32) - 127)

    def tile_scales_e8m0(self) -> torch.Tensor:
        return self.tile_bytes.view(torch.float8_e8m0fnu)


def fp4_to_fp8_block(packed: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] = (128, 128)) -> Fp8BlockResult:
    """[out, in/2] FP4 codes + [out, in/32] E8M0 scales -> FP8 E4M3 [out, in] + E8M0 scale per `block` tile,
    with a per-tile exactness check. Scale bytes must be 0..254 (check for 255 first: it is NaN)."""
    rows, cols = _check_block(block)
    if packed.dim() != 2 or packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"FP4 codes must be a 2-D int8/uint8 tensor [out, in/2], got {packed.dtype} {tuple(packed.shape)}")
    sb = scale_bytes(scales)
    out_dim, k_half = packed.shape
    k = 2 * k_half
    if sb.shape != (out_dim, k // FP4_GROUP) or k % FP4_GROUP:
        raise ValueError(f"codes {tuple(packed.shape)} and scales {tuple(sb.shape)} do not match: "
                         f"expected scales [out, in/{FP4_GROUP}] for codes [out, in/2]")
    if bool((sb == 255).any()):
        raise ValueError("scale byte 255 (NaN in E8M0) in FP4 scales")
    groups, gpt = k // FP4_GROUP, cols // FP4_GROUP
    tr, tc = -(-out_dim // rows), -(-k // cols)
    dev = packed.device
    weight = torch.empty(out_dim, k, dtype=torch.float8_e4m3fn, device=dev)
    tile_bytes = torch.empty(tr, tc, dtype=torch.uint8, device=dev)
    lossy = torch.zeros(tr, tc, dtype=torch.bool, device=dev)
    max_abs = torch.zeros(tr, tc, dtype=torch.float32, device=dev)
    max_rel = torch.zeros(tr, tc, dtype=torch.float32, device=dev)
    step = rows * max(1, _CHUNK_ELEMS // max(1, rows * k))  # whole tile rows per chunk
    for r0 in range(0, out_dim, step):
        r1 = min(out_dim, r0 + step)
        n, t0, t1 = r1 - r0, r0 // rows, -(-r1 // rows)
        s = sb[r0:r1].to(torch.int32)  # [n, groups]
        t = (_per_tile(s, rows, gpt, "amax") - MAX_OFFSET_BITS).clamp_min_(MIN_TILE_BYTE)  # [tiles in chunk, tc]
        tile_bytes[t0:t1] = t.to(torch.uint8)
        t_g = _tile_map(t, rows, gpt, n, groups)  # [n, groups]
        vals = fp4_values_f32(packed[r0:r1]).view(n, groups, FP4_GROUP)
        y = (vals * pow2_f32(s - t_g).unsqueeze(-1)).to(torch.float8_e4m3fn)  # k = s - t <= 6: no overflow
        weight[r0:r1] = y.view(n, k)
        deq8 = y.float() * pow2_f32(t_g - 127).unsqueeze(-1)
        deq4 = vals * pow2_f32(s - 127).unsqueeze(-1)
        diff = (deq8 != deq4).view(n, k)
        if bool(diff.any()):
            lossy[t0:t1] = _per_tile(diff, rows, cols, "any")
            err = torch.where(diff, (deq8 - deq4).abs().view(n, k), 0.0).nan_to_num_(posinf=float("inf"))
            rel = torch.where(diff, err / deq4.abs().view(n, k), 0.0)
            max_abs[t0:t1] = _per_tile(err, rows, cols, "amax")
            max_rel[t0:t1] = _per_tile(rel, rows, cols, "amax")
    return Fp8BlockResult(weight, tile_bytes, lossy, max_abs, max_rel)


def dequant_fp8_block_to_f32(weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """FP8 E4M3 [out, in] with one scale per `block` tile (float32, or E8M0 as float8_e8m0fnu) -> float32
    [out, in], the product done in float32."""
    rows, cols = (int(b) for b in block)
    s = e8m0_to_f32(scales) if scales.dtype in (torch.float8_e8m0fnu, torch.uint8) else scales.float()
    out, inp = weight.shape
    return weight.float() * s.repeat_interleave(rows, 0)[:out].repeat_interleave(cols, 1)[:, :inp]
