"""Fused FP4 (E2M1) + E8M0 -> BF16 dequant for CUDA, in Triton.

One read of the codes (as int32 words: 4 code bytes = 8 values), one read of the scale byte per 32
values, one write of BF16; no float arithmetic. The BF16 bits come from integer exponent arithmetic
that reproduces the seed formula (float32 E2M1 LUT with -0.0 for code 8, times `(s << 23)` viewed as
float32, cast to BF16) bit for bit for every scale byte 0..254:

- code c = sign(bit 3) | mag(bits 0..2); for mag >= 1 the product is an exact power-of-two multiple
  of 1 or 1.5, so its BF16 exponent field is E = s - 1 + (mag >> 1) and its mantissa is 0x40 for
  mag in {3, 5, 7} (1.5, 3, 6), else 0.
- mag == 1 (0.5) at s == 1 gives 2**-127: E == 0, the BF16 subnormal 0x0040.
- E >= 255 overflows: the float32 product is inf, BF16 0x7F80.
- mag == 0 (+-0) or s == 0 (scale 0.0: `0 << 23` is +0.0) gives +-0.
- the sign is code bit 3 in all of these cases (-0.0 * x = -0.0).
- s == 255 (E8M0 NaN, rejected upstream as corrupt) gives inf for mag >= 1 and NaN 0x7FC0 for zeros;
  the seed's NaN bits there depend on the device, so 255 is not part of the bit-exact contract.

Only this module imports Triton, and `fp4.py` imports this module for CUDA inputs only, so the package
imports (and the CPU path runs) without Triton; `triton_available()` says whether the kernel exists.
"""

from __future__ import annotations

import torch

FP4_GROUP = 32
BLOCK_WORDS = 1024  # int32 code words per program: 4 KiB of codes in, 16 KiB of BF16 out
NUM_WARPS = 4

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

    @triton.jit(do_not_specialize=["one"])
    def fp4_e8m0_to_bf16_kernel(
        words_ptr,  # int32 [n_words]: code bytes, 4 per word, little-endian (byte i of the row = bits 8i..8i+7)
        scales_ptr,  # uint8 [n_words // 4]: one scale byte per 16 code bytes = 4 words
        out_ptr,  # int16 [n_words * 8]: BF16 bits
        n_words,
        one,  # always 1, not specialized: see below
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0).to(tl.int64)
        word = pid * BLOCK + tl.arange(0, BLOCK)  # int64: 256 experts x 8M values overflow int32
        in_range = word < n_words
        # Each thread writes the 8 BF16 values (16 bytes) of one word per store, consecutive threads
        # consecutive words. Loading the words in that same layout (one int32 per thread per word,
        # still coalesced across the warp) avoids a round trip through shared memory; hiding the
        # contiguity of the load addresses behind `one` stops the compiler from picking 16-byte loads
        # in another layout.
        src_word = word * one
        w = tl.load(words_ptr + src_word, mask=in_range, other=0)
        s = tl.load(scales_ptr + (src_word >> 2), mask=in_range, other=0).to(tl.int32)  # uint8: zero-extended
        j = tl.arange(0, 8)
        # value 8*word + j is nibble j of the word (low nibble of byte 0 first); arithmetic >> is fine
        # for negative words since every nibble is masked
        bits = _bf16_bits((w[:, None] >> (j[None, :] * 4)) & 0xF, s[:, None])
        offs = word[:, None] * 8 + j[None, :]
        tl.store(out_ptr + offs, bits.to(tl.int16), mask=in_range[:, None])


def dequant_fp4_to_bf16_cuda(packed: torch.Tensor, scales: torch.Tensor, *, out: torch.Tensor | None = None,
                             block_words: int = BLOCK_WORDS, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """[..., K/2] int8/uint8 codes and [..., K/32] uint8 (or float8_e8m0fnu) scales on one CUDA device
    -> BF16 [..., K], bit-identical to the seed formula for scale bytes 0..254.

    Non-contiguous inputs are made contiguous first (one extra copy). `out`, if given, must be a
    contiguous BF16 tensor of the result's shape on the same device."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"FP4 codes must be int8 or uint8, got {packed.dtype}")
    if scales.dtype in (torch.float8_e8m0fnu, torch.int8):
        scales = scales.view(torch.uint8)
    if scales.dtype != torch.uint8:
        raise TypeError(f"E8M0 scales must be uint8 or float8_e8m0fnu, got {scales.dtype}")
    if packed.dim() == 0:
        raise ValueError("FP4 codes must have at least one dimension [..., K/2]")
    k_half = packed.shape[-1]
    if packed.shape[:-1] != scales.shape[:-1] or k_half * 2 != scales.shape[-1] * FP4_GROUP:
        raise ValueError(f"codes {tuple(packed.shape)} and scales {tuple(scales.shape)} do not match: "
                         f"expected scales [..., K/{FP4_GROUP}] for codes [..., K/2]")
    if packed.device.type != "cuda" or scales.device != packed.device:
        raise ValueError(f"codes ({packed.device}) and scales ({scales.device}) must be on one CUDA device")
    if block_words <= 0 or block_words & (block_words - 1):
        raise ValueError(f"block_words must be a power of two, got {block_words}")
    shape = (*packed.shape[:-1], k_half * 2)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=packed.device)
    elif (out.dtype != torch.bfloat16 or tuple(out.shape) != shape or out.device != packed.device
          or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous bfloat16 {shape} tensor on {packed.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    if out.numel() == 0:
        return out
    codes = packed.view(torch.uint8).contiguous().reshape(-1)
    if codes.data_ptr() % 4:  # a view starting mid-word: re-home it so it reads as int32
        codes = codes.clone()
    words = codes.view(torch.int32)  # K/2 is a multiple of 16, so rows are whole words and groups are 4 words
    sb = scales.contiguous().reshape(-1)
    n_words = words.numel()
    grid = (-(-n_words // block_words),)
    with torch.cuda.device(packed.device):
        fp4_e8m0_to_bf16_kernel[grid](words, sb, out.view(torch.int16), n_words, 1, BLOCK=block_words,
                                      num_warps=num_warps)
    return out

