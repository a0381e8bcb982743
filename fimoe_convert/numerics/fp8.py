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

The conversion itself needs no float arithmetic: with k = s - t, the E4M3 bytes of a code byte depend only on
(k, code byte), and so does exactness, so `fp4_to_fp8_block` gathers both E4M3 bytes of each code byte
from a table of int16 pairs indexed by (k, code byte), built once with the float formula itself (like
numerics/fp4.py's BF16 pair table). Only groups with k < `EXACT_MIN_OFFSET` can be lossy; their code bytes
are looked up in a second table of the same index. The float path (`fp4_to_fp8_block_float`, the former
implementation) still measures the error of lossy tiles.

Pure tensor functions, CPU or any torch device; work is done in row chunks of whole tiles. On the CPU the
chunks are spread over `torch.get_num_threads()` threads (`index_select` is single-threaded in ATen and
releases the GIL)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fp4 import E2M1_VALUES, FP4_GROUP, find_nan_scales, run_chunks, scale_bytes

MAX_OFFSET_BITS = 6  # tile scale = largest per-32 scale / 2**6; 6 * 2**6 = 384 <= 448 (E4M3 max)
EXACT_SPAN = 14  # per-32 scale bytes of a tile spanning at most this many steps always convert exactly
MIN_TILE_BYTE = 1  # tile scale bytes are at least this (2**-126, a normal float32)
_CHUNK_ELEMS = 1 << 20  # values per work chunk of the float path (rounded to whole tile rows)

EXACT_MIN_OFFSET = -8  # E2M1 value * 2**k is exact in E4M3 for k in [-8, 6]: only groups below -8 can be lossy
# From k = -13 down every E2M1 value * 2**k rounds to a signed zero (6 * 2**-13 < 2**-10, half E4M3's smallest
# subnormal), so offsets below it share its table row.
TABLE_MIN_OFFSET = -13
_TABLE_CHUNK_BYTES = 1 << 19  # code bytes per CPU work item (whole tile rows): 2 MiB of int32 index, as fp4.py
_DEVICE_CHUNK_BYTES = 1 << 26  # code bytes per step on other devices (256 MiB of int32 index)
_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


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


def _check_args(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Shapes and dtypes of codes and scales; the scale bytes (uint8), checked for 255."""
    if packed.dim() != 2 or packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"FP4 codes must be a 2-D int8/uint8 tensor [out, in/2], got {packed.dtype} "
                        f"{tuple(packed.shape)}")
    sb = scale_bytes(scales)
    out_dim, k_half = packed.shape
    k = 2 * k_half
    if sb.shape != (out_dim, k // FP4_GROUP) or k % FP4_GROUP:
        raise ValueError(f"codes {tuple(packed.shape)} and scales {tuple(sb.shape)} do not match: "
                         f"expected scales [out, in/{FP4_GROUP}] for codes [out, in/2]")
    if sb.device != packed.device:
        raise ValueError(f"codes are on {packed.device} but scales on {sb.device}")
    if find_nan_scales(sb):
        raise ValueError("scale byte 255 (NaN in E8M0) in FP4 scales")
    return sb


def _empty_outputs(out_dim: int, k: int, tile_rows: int, tile_cols: int, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """The outputs to fill, as Fp8BlockResult's fields: FP8 weight [out_dim, k]; per tile its scale byte, lossy
    flag (False) and errors (0)."""
    tiles = (tile_rows, tile_cols)
    return (torch.empty(out_dim, k, dtype=torch.float8_e4m3fn, device=dev),
            torch.empty(tiles, dtype=torch.uint8, device=dev), torch.zeros(tiles, dtype=torch.bool, device=dev),
            torch.zeros(tiles, dtype=torch.float32, device=dev), torch.zeros(tiles, dtype=torch.float32, device=dev))


def fp4_to_fp8_block_float(packed: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] = (128, 128)
                           ) -> Fp8BlockResult:
    """`fp4_to_fp8_block` done in float32, value by value (the former implementation); kept to measure the
    error of lossy tiles, and as the reference the table path is tested against."""
    rows, cols = _check_block(block)
    sb = _check_args(packed, scales)
    out_dim, k_half = packed.shape
    k = 2 * k_half
    groups, gpt = k // FP4_GROUP, cols // FP4_GROUP
    tr, tc = -(-out_dim // rows), -(-k // cols)
    weight, tile_bytes, lossy, max_abs, max_rel = _empty_outputs(out_dim, k, tr, tc, packed.device)
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


def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """int16 pairs and bool lossy flags, [20 * 256] each (offsets -13..6), indexed by (k - TABLE_MIN_OFFSET) << 8 | code
    byte: the two E4M3 bytes of the code byte's values times 2**k (element 2i first in memory), made by the
    float path's own product and cast; and 1 where either value * 2**k is not exact in E4M3."""
    tabs = _TABLES.get(device)
    if tabs is None:
        lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        byte = torch.arange(256)
        vals = torch.stack([lut[byte & 0xF], lut[byte >> 4]], dim=-1)  # [256, 2]: low nibble first
        offsets = torch.arange(TABLE_MIN_OFFSET, MAX_OFFSET_BITS + 1, dtype=torch.int32)
        prod = vals.unsqueeze(0) * pow2_f32(offsets).view(-1, 1, 1)  # [rows, 256, 2], exact in float32
        y = prod.to(torch.float8_e4m3fn)
        pairs = y.contiguous().view(torch.int16).reshape(-1)  # memory order, so no byte-order question
        lossy = (y.float() != prod).any(dim=-1).reshape(-1)
        tabs = (pairs.to(device), lossy.to(device))
        _TABLES[device] = tabs
    return tabs


def _convert_rows(codes: torch.Tensor, sb: torch.Tensor, r0: int, r1: int, rows: int, gpt: int,
                  index: torch.Tensor, weight16: torch.Tensor, tile_bytes: torch.Tensor, lossy: torch.Tensor) -> None:
    """Rows r0:r1 (r0 at a tile boundary) by table: tile bytes, E4M3 pairs, lossy flags of their tiles."""
    n, k_half = r1 - r0, codes.shape[1]
    groups = sb.shape[1]
    pairs, lossy_table = _tables(codes.device)
    s = sb[r0:r1].to(torch.int32)
    t = (_per_tile(s, rows, gpt, "amax") - MAX_OFFSET_BITS).clamp_min_(MIN_TILE_BYTE)
    t0 = r0 // rows
    tile_bytes[t0:t0 + t.shape[0]] = t
    k = s.sub_(_tile_map(t, rows, gpt, n, groups))  # [n, groups]: k = s - t <= 6
    low = k < EXACT_MIN_OFFSET
    any_low = bool(low.any())
    k.clamp_min_(TABLE_MIN_OFFSET).sub_(TABLE_MIN_OFFSET).bitwise_left_shift_(8)
    idx = index[: n * k_half]
    idx.view(n, k_half).copy_(codes[r0:r1])
    idx3 = idx.view(n, groups, FP4_GROUP // 2)
    idx3.bitwise_or_(k.unsqueeze(-1))
    torch.index_select(pairs, 0, idx, out=weight16[r0:r1].reshape(-1))
    if any_low:  # groups that may be lossy: look their code bytes up in the lossy table
        where = low.nonzero()
        flags = torch.index_select(lossy_table, 0, idx3[where[:, 0], where[:, 1]].reshape(-1))
        bad = where[flags.view(-1, FP4_GROUP // 2).any(dim=1)]
        if bad.numel():
            lossy[(bad[:, 0] + r0) // rows, bad[:, 1] // gpt] = True


def _convert(codes: torch.Tensor, sb: torch.Tensor, rows: int, gpt: int, weight16: torch.Tensor,
             tile_bytes: torch.Tensor, lossy: torch.Tensor) -> None:
    out_dim, k_half = codes.shape
    cpu = codes.device.type == "cpu"
    chunk_bytes = _TABLE_CHUNK_BYTES if cpu else _DEVICE_CHUNK_BYTES
    step = rows * max(1, chunk_bytes // max(1, rows * k_half))  # whole tile rows per work item
    run_chunks(out_dim, step,
               lambda r0, r1, index: _convert_rows(codes, sb, r0, r1, rows, gpt, index, weight16, tile_bytes, lossy),
               min(step, out_dim) * k_half, codes.device, torch.get_num_threads() if cpu else 1, codes.numel())


def fp4_to_fp8_block(packed: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] = (128, 128)) -> Fp8BlockResult:
    """[out, in/2] FP4 codes + [out, in/32] E8M0 scales -> FP8 E4M3 [out, in] + E8M0 scale per `block` tile,
    with a per-tile exactness check. Scale bytes must be 0..254 (255, NaN, is refused). Bit-identical to
    `fp4_to_fp8_block_float`."""
    rows, cols = _check_block(block)
    sb = _check_args(packed, scales)
    out_dim, k_half = packed.shape
    k = 2 * k_half
    gpt = cols // FP4_GROUP
    tr, tc = -(-out_dim // rows), -(-k // cols)
    weight, tile_bytes, lossy, max_abs, max_rel = _empty_outputs(out_dim, k, tr, tc, packed.device)
    if weight.numel() == 0:  # no tiles either
        return Fp8BlockResult(weight, tile_bytes, lossy, max_abs, max_rel)
    codes = packed.view(torch.uint8).contiguous()
    _convert(codes, sb.contiguous(), rows, gpt, weight.view(torch.int16), tile_bytes, lossy)
    if bool(lossy.any()):  # rare (refused unless --allow-lossy): measure the error on the float path, tile row by row
        for i in lossy.any(dim=1).nonzero().flatten().tolist():
            r0, r1 = i * rows, min(out_dim, (i + 1) * rows)
            ref = fp4_to_fp8_block_float(packed[r0:r1], sb[r0:r1], block)
            if not torch.equal(ref.lossy[0], lossy[i]):
                raise RuntimeError(f"fp4_to_fp8_block: the lossy table and the float check disagree in tile row {i}")
            max_abs[i], max_rel[i] = ref.max_abs[0], ref.max_rel[0]
    return Fp8BlockResult(weight, tile_bytes, lossy, max_abs, max_rel)
