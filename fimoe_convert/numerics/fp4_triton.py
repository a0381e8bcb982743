"""Fused FP4 (E2M1) + E8M0 -> BF16 dequant for CUDA, in Triton.

One read of the codes, one read of the scale byte per 32 values, one write of BF16; no float
arithmetic. The BF16 bits come from integer exponent arithmetic that reproduces the seed formula
(float32 E2M1 LUT with -0.0 for code 8, times `(s << 23)` viewed as float32, cast to BF16) bit for bit
for every scale byte 0..254. The recipe, per code c and scale byte s (`_bf16_bits`):

- code c = sign(bit 3) | mag(bits 0..2); for mag >= 1 the product is an exact power-of-two multiple
  of 1 or 1.5, so its BF16 exponent field is E = s - 1 + (mag >> 1) and its mantissa is 0x40 for
  mag in {3, 5, 7} (1.5, 3, 6), else 0.
- mag == 1 (0.5) at s == 1 gives 2**-127: E == 0, the BF16 subnormal 0x0040.
- E >= 255 overflows: the float32 product is inf, BF16 0x7F80.
- mag == 0 (+-0) or s == 0 (scale 0.0: `0 << 23` is +0.0) gives +-0.
- the sign is code bit 3 in all of these cases (-0.0 * x = -0.0).
- s == 255 (E8M0 NaN, rejected upstream as corrupt) gives inf for mag >= 1 and NaN 0x7FC0 for zeros;
  the seed's NaN bits there depend on the device, so 255 is not part of the bit-exact contract.

The kernel (`fp4_e8m0_to_bf16_groups_kernel`) turns one code byte into one int32 holding both
of its BF16 values (low nibble in bits 0..15, which come first in memory), two values per integer op
(SWAR). For s in {0} and 2..252 the recipe above reduces to (`_bf16x2_bits_common`):

- u = byte * 0x01001001 puts the nibbles at bits 0..3 and 16..19 and their sign bits at 15 and 31;
  m = u & 0x00070007 holds both magnitudes (zeroed for s == 0).
- bits(m) = 64 m + 64 [m >= 2] + (g - 64) [m >= 1] with g = (s - 1) << 7: m == 1 (0.5) gives g,
  m >= 2 gives g + 64 m = ((s - 1 + (m >> 1)) << 7) | ((m & 1) << 6), m == 0 gives 0.
- 8 [m >= k] in each 16-bit lane is (m + (8 - k) * 0x00010001) & 0x00080008: m <= 7, so no carry
  crosses a lane, and every lane stays below 0x8000 for s <= 252.

A program whose scale bytes include 1 (subnormal result) or 253..255 (overflow, NaN) runs `_bf16_bits`
itself instead: group scales of 2**-126 or 2**126..2**127 are far from trained weights', so that path is
rare and kept small, not fast.

A previous kernel (`_bf16_bits` per value, int32 code words in) reached 43-46% of copy bandwidth on the
H200: its sm_90 SASS had about 25 integer instructions per value, so it was integer-bound. This one's
common path has about 9 and reaches 89-93% (docs/PERFORMANCE.md).

Only this module imports Triton, and `fp4.py` imports this module for CUDA inputs only, so the package
imports (and the CPU path runs) without Triton; `triton_available()` says whether the kernel exists.
"""

from __future__ import annotations

import torch

from .fp4_args import checked_args

BLOCK_GROUPS = 64  # scale groups per program 1 KiB of codes in, 4 KiB of BF16 out
NUM_WARPS = 2  # with BLOCK_GROUPS 64: 92% of copy on the H200, best of the sweep (docs/PERFORMANCE.md)
LOAD_BYTES = 4  # code bytes per thread per load: see the kernel
EXACT_GROUPS = 32  # scale groups per step of the rare exact path

try:  # only this module needs Triton; fp4.py imports it on CUDA inputs only
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None
    tl = None


def triton_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _bf16_bits(code, s):
        """BF16 bits of E2M1 `code` (int32 0..15) times the E8M0 scale byte `s` (int32 0..255), as int32."""
        mag = code & 7
        e = s - 1 + (mag >> 1)  # BF16 exponent field for mag >= 1
        bits = (e << 7) | tl.where(mag >= 3, (mag & 1) << 6, 0)
        bits = tl.where(e == 0, 0x40, bits)  # 0.5 * 2**-126 = 2**-127, BF16 subnormal
        bits = tl.where(e >= 255, 0x7F80, bits)  # overflow to inf
        bits = tl.where((mag == 0) | (s == 0), 0, bits)  # +-0: zero code, or scale 0.0
        bits = tl.where(s == 255, tl.where(mag == 0, 0x7FC0, 0x7F80), bits)  # corrupt scale: NaN / inf
        return bits | ((code & 8) << 12)

    @triton.jit
    def _bf16x2_bits_common(b, s):
        """Both BF16 values of code bytes `b` (int32 0..255) at scale bytes `s` (int32, 0 or 2..252) as one
        int32, low nibble's value in bits 0..15 (module docstring); equals `_bf16_bits` on each nibble."""
        u = b * 0x01001001
        m = u & tl.where(s == 0, 0, 0x00070007)
        ge1 = (m + 0x00070007) & 0x00080008
        ge2 = (m + 0x00060006) & 0x00080008
        bits = m * 64 + ge2 * 8 + ge1 * (s * 16 - 24)  # 8 (s * 16 - 24) = g - 64
        return bits | (u & -0x7FFF8000)  # -0x7FFF8000 is 0x80008000 as int32: both sign bits

    @triton.jit
    def fp4_e8m0_to_bf16_groups_kernel(
        codes_ptr,  # uint8 [n_groups * 16]: two E2M1 codes per byte, low nibble first
        scales_ptr,  # uint8 [n_groups]: one E8M0 byte per 16 code bytes
        out_ptr,  # int32 [n_groups * 16]: code byte i -> BF16 of values 2i (bits 0..15) and 2i+1
        n_groups,
        BLOCK_GROUPS: tl.constexpr,
        LOAD_BYTES: tl.constexpr,
        EXACT_GROUPS: tl.constexpr,
    ):
        start = tl.program_id(0).to(tl.int64) * BLOCK_GROUPS  # int64: 256 experts x 8M values overflow int32
        codes_ptr += start * 16
        scales_ptr += start
        out_ptr += start * 16
        n_rows = tl.minimum(n_groups - start, BLOCK_GROUPS).to(tl.int32)  # < BLOCK_GROUPS in the last program
        rows = tl.arange(0, BLOCK_GROUPS)
        in_range = rows < n_rows
        # Claiming only LOAD_BYTES contiguous code bytes gives the load the store's layout (4 code bytes ->
        # one 16 B store of 4 words per thread); 16 would add a shared-memory layout conversion of the output.
        offs = tl.max_contiguous(rows[:, None] * 16 + tl.arange(0, 16)[None, :], [1, LOAD_BYTES])
        b = tl.load(codes_ptr + offs, mask=in_range[:, None], other=0).to(tl.int32)  # uint8: zero-extended
        s = tl.load(scales_ptr + rows, mask=in_range, other=0).to(tl.int32)
        if tl.max(tl.where(s == 1, 255, s), axis=0) < 253:
            tl.store(out_ptr + offs, _bf16x2_bits_common(b, s[:, None]), mask=in_range[:, None])
        else:
            # Scale byte 1 or >= 253 in this program: the recipe per nibble, EXACT_GROUPS rows at a time so
            # its many temporaries do not raise the register count (and cut the occupancy) of the common path.
            for first in range(0, BLOCK_GROUPS, EXACT_GROUPS):
                r = first + tl.arange(0, EXACT_GROUPS)
                ok = r < n_rows
                o = r[:, None] * 16 + tl.arange(0, 16)[None, :]
                c = tl.load(codes_ptr + o, mask=ok[:, None], other=0).to(tl.int32)
                sr = tl.load(scales_ptr + r, mask=ok, other=0).to(tl.int32)[:, None]
                tl.store(out_ptr + o, _bf16_bits(c & 15, sr) | (_bf16_bits(c >> 4, sr) << 16), mask=ok[:, None])


def _launch(codes: torch.Tensor, sb: torch.Tensor, out: torch.Tensor, *, block_groups: int, num_warps: int,
            load_bytes: int) -> None:
    """Run the kernel on flat contiguous uint8 codes [n_groups * 16], uint8 scales [n_groups] and a flat
    contiguous BF16 `out` [n_groups * 32] starting on a 4-byte boundary. No checks and no device guard:
    the caller's job. Tensors on the CPU work under TRITON_INTERPRET=1."""
    n_groups = sb.numel()
    grid = (triton.cdiv(n_groups, block_groups),)
    fp4_e8m0_to_bf16_groups_kernel[grid](codes, sb, out.view(torch.int32), n_groups, BLOCK_GROUPS=block_groups,
                                         LOAD_BYTES=load_bytes, EXACT_GROUPS=min(block_groups, EXACT_GROUPS),
                                         num_warps=num_warps)


def dequant_fp4_to_bf16_cuda(packed: torch.Tensor, scales: torch.Tensor, *, out: torch.Tensor | None = None,
                             block_groups: int = BLOCK_GROUPS, num_warps: int = NUM_WARPS,
                             load_bytes: int = LOAD_BYTES) -> torch.Tensor:
    """[..., K/2] int8/uint8 codes and [..., K/32] uint8 (or float8_e8m0fnu) scales on one CUDA device
    -> BF16 [..., K], bit-identical to the seed formula for scale bytes 0..254.

    Non-contiguous inputs are made contiguous first (one extra copy). `out`, if given, must be a
    contiguous BF16 tensor of the result's shape on the same device. Tuning knobs: `block_groups`
    (scale groups of 16 code bytes per program, a power of two), `num_warps` and `load_bytes`
    (contiguous code bytes per thread load)."""
    if packed.device.type != "cuda":
        raise ValueError(f"codes ({packed.device}) and scales ({scales.device}) must be on one CUDA device")
    if block_groups <= 0 or block_groups & (block_groups - 1):
        raise ValueError(f"block_groups must be a power of two, got {block_groups}")
    if load_bytes not in (1, 2, 4, 8, 16):
        raise ValueError(f"load_bytes must be 1, 2, 4, 8 or 16, got {load_bytes}")
    scales, out = checked_args(packed, scales, out)
    return dequant_checked(packed, scales, out, block_groups=block_groups, num_warps=num_warps, load_bytes=load_bytes)


def dequant_checked(packed: torch.Tensor, sb: torch.Tensor, out: torch.Tensor, *, block_groups: int = BLOCK_GROUPS,
                    num_warps: int = NUM_WARPS, load_bytes: int = LOAD_BYTES) -> torch.Tensor:
    """The launch behind `dequant_fp4_to_bf16_cuda` for arguments already checked (uint8 scales, a matching
    contiguous BF16 `out`): at 256 experts the kernel takes 1.4 ms, so a second round of Python checks shows."""
    if out.numel() == 0:
        return out
    codes = packed.view(torch.uint8).contiguous().reshape(-1)
    sb = sb.contiguous().reshape(-1)
    flat = out.reshape(-1)
    dst = flat if flat.data_ptr() % 4 == 0 else torch.empty_like(flat)  # the kernels write whole int32 words
    if packed.device.index == torch.cuda.current_device():
        _launch(codes, sb, dst, block_groups=block_groups, num_warps=num_warps, load_bytes=load_bytes)
    else:
        with torch.cuda.device(packed.device):
            _launch(codes, sb, dst, block_groups=block_groups, num_warps=num_warps, load_bytes=load_bytes)
    if dst is not flat:
        flat.copy_(dst)
    return out
