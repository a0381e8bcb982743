"""FP4 (E2M1) + E8M0 -> BF16 dequant: bit-exact against the seed formula (vLLM's `_dequant_fp4_ue8m0_gran32`).

The seed is re-implemented here on purpose (not imported from the package). Outputs are compared as
int16 bit patterns, so -0.0, subnormals, inf and NaN payloads all count.
GPU tests (`-m gpu`) need CUDA and Triton; they skip elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from fimoe_convert.numerics import dequant_fp4_to_bf16, fp4 as fp4_mod

SEED_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def seed_dequant(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The seed formula (vLLM's `_dequant_fp4_ue8m0_gran32` body, on [..., K/2] flattened to 2-D):
    float32 LUT (-0.0 for code 8), element 2i = low nibble of byte i, scale = (int32(s) << 23) viewed
    as float32, float32 product cast to BF16."""
    raw = packed.view(torch.uint8).reshape(-1, packed.shape[-1])
    sf_ue8m0 = scales.view(torch.uint8).reshape(-1, scales.shape[-1])
    lut = torch.tensor(SEED_LUT, dtype=torch.float32, device=raw.device)
    vals = torch.empty(raw.shape[0], raw.shape[1] * 2, dtype=torch.float32, device=raw.device)
    vals[:, ::2] = lut[(raw & 0x0F).to(torch.int64)]
    vals[:, 1::2] = lut[(raw >> 4).to(torch.int64)]
    sf = (sf_ue8m0.to(torch.int32) << 23).view(torch.float32)
    out = (vals * sf.repeat_interleave(32, dim=-1)).to(torch.bfloat16)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def bits(x: torch.Tensor) -> torch.Tensor:
    assert x.dtype == torch.bfloat16
    return x.view(torch.int16)


def assert_bit_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    g, w = bits(got).cpu(), bits(want).cpu()
    bad = (g != w).nonzero()
    assert len(bad) == 0, (
        f"{len(bad)} mismatches, first at {bad[0].tolist()}: got {g[tuple(bad[0])]:#06x} want {w[tuple(bad[0])]:#06x}"
    )


def all_combos(scale_bytes: range = range(255), device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Row r has scale byte scale_bytes[r] in all of its 16 groups and code bytes 0..255: every
    (scale byte, code byte) pair once. packed [S, 256] uint8, scales [S, 16] uint8."""
    s = torch.tensor(list(scale_bytes), dtype=torch.uint8)
    packed = torch.arange(256, dtype=torch.uint8).repeat(len(s), 1)
    return packed.to(device), s[:, None].repeat(1, 16).to(device)


def random_fp4(shape: tuple[int, ...], k: int, seed: int = 0, lo: int = 0, hi: int = 255, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (*shape, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(lo, hi, (*shape, k // 32), dtype=torch.uint8, generator=g)
    return packed.to(device), scales.to(device)


# ---------------------------------------------------------------- CPU: exhaustive bit-exactness


@pytest.mark.parametrize("codes_dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e8m0fnu])
def test_every_scale_and_code_byte_matches_seed(codes_dtype, scale_dtype):
    packed, scales = all_combos()
    want = seed_dequant(packed, scales)
    got = dequant_fp4_to_bf16(packed.view(codes_dtype), scales.view(scale_dtype))
    assert_bit_equal(got, want)


def test_seed_edge_values():
    """The corners the fast path must reproduce: scale 0 is 0.0 (not 2**-127), 0.5 * 2**-126 is the BF16
    subnormal 2**-127, 6 * 2**127 overflows to inf, code 8 is -0.0."""
    packed = torch.tensor([[0x81, 0x76] + [0] * 14] * 4, dtype=torch.uint8)  # codes 1, 8, 6, 7
    scales = torch.tensor([[0], [1], [254], [127]], dtype=torch.uint8)
    got = bits(dequant_fp4_to_bf16(packed, scales))[:, :4].tolist()
    neg0 = -0x8000
    assert got[0] == [0x0000, neg0, 0x0000, 0x0000]  # s=0: 0.5*0, -0*0, 4*0, 6*0
    assert got[1] == [0x0040, neg0, 0x0180, 0x01C0]  # s=1: 2**-127 (subnormal), -0, 2**-124, 1.5 * 2**-124
    assert got[2] == [0x7E80, neg0, 0x7F80, 0x7F80]  # s=254: 0.5 * 2**127 = 2**126, -0, inf, inf
    assert got[3] == [0x3F00, neg0, 0x4080, 0x40C0]  # s=127: 0.5, -0, 4, 6
    assert got == bits(seed_dequant(packed, scales))[:, :4].tolist()


def test_scale_byte_255_matches_seed_on_cpu():
    """255 (E8M0 NaN) is rejected upstream as corrupt; on CPU the table is built by the seed formula,
    so it still agrees with the seed bit for bit (inf and the platform's NaN)."""
    packed, scales = all_combos(range(255, 256))
    assert_bit_equal(dequant_fp4_to_bf16(packed, scales), seed_dequant(packed, scales))


# ---------------------------------------------------------------- CPU: shapes, layouts, threads


@pytest.mark.parametrize(
    "shape, k",
    [
        ((1,), 32),  # one group
        ((5,), 64),
        ((2, 3), 96),  # odd group count per row
        ((3, 1, 4), 128),
        ((2, 3, 5), 4096),  # leading batch dims, V4-Flash K
        ((7,), 2048 * 2),
    ],
)
def test_leading_dims_match_seed(shape, k):
    packed, scales = random_fp4(shape, k, seed=k + len(shape))
    got = dequant_fp4_to_bf16(packed, scales)
    assert got.shape == (*shape, k)
    assert_bit_equal(got, seed_dequant(packed, scales))


def test_batched_equals_per_matrix():
    packed, scales = random_fp4((4, 16), 256, seed=3)
    got = dequant_fp4_to_bf16(packed, scales)
    for i in range(4):
        assert torch.equal(bits(got[i]), bits(dequant_fp4_to_bf16(packed[i], scales[i])))


def test_threaded_path_large_input_with_ragged_chunks():
    """> _PARALLEL_MIN_BYTES of codes and a row count that is not a multiple of the chunk."""
    packed, scales = random_fp4((3, 701), 2048, seed=11, lo=1)
    assert packed.numel() > fp4_mod._PARALLEL_MIN_BYTES
    assert_bit_equal(dequant_fp4_to_bf16(packed, scales), seed_dequant(packed, scales))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_counts_and_small_chunks(monkeypatch, threads):
    packed, scales = random_fp4((37,), 512, seed=threads)
    monkeypatch.setattr(fp4_mod, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(fp4_mod, "_CHUNK_BYTES", 256 * 3)  # 3 rows per chunk: 13 chunks, last one short
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = dequant_fp4_to_bf16(packed, scales)
    finally:
        torch.set_num_threads(old)
    assert_bit_equal(got, seed_dequant(packed, scales))


def test_worker_errors_propagate(monkeypatch):
    monkeypatch.setattr(fp4_mod, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(fp4_mod, "_CHUNK_BYTES", 64)
    packed, scales = random_fp4((8,), 128)

    def broken(*args, **kwargs):
        raise RuntimeError("boom from index_select")

    monkeypatch.setattr(fp4_mod.torch, "index_select", broken)
    with pytest.raises(RuntimeError, match="boom from index_select"):
        dequant_fp4_to_bf16(packed, scales)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p, s: (p.transpose(0, 1), s.transpose(0, 1)), id="transposed-batch"),
        pytest.param(lambda p, s: (p[:, ::2], s[:, ::2]), id="strided-rows"),
        pytest.param(lambda p, s: (p[1:, 1:], s[1:, 1:]), id="offset-view"),
        pytest.param(lambda p, s: (p, s.transpose(0, 1).contiguous().transpose(0, 1)), id="scales-strided"),
    ],
)
def test_non_contiguous_inputs(make):
    packed, scales = random_fp4((4, 6), 128, seed=5)
    p, s = make(packed, scales)
    assert_bit_equal(dequant_fp4_to_bf16(p, s), seed_dequant(p.contiguous(), s.contiguous()))


def test_non_contiguous_last_dim():
    base_p, base_s = random_fp4((48,), 64, seed=8)  # [48, 32] codes, [48, 2] scales
    p = base_p.t().contiguous().t()  # same values, column-major
    s = base_s.t().contiguous().t()
    assert not p.is_contiguous()
    assert_bit_equal(dequant_fp4_to_bf16(p, s), seed_dequant(base_p, base_s))


def test_out_parameter_is_filled_and_returned():
    packed, scales = random_fp4((2, 8), 256, seed=9)
    out = torch.full((2, 8, 256), 7.0, dtype=torch.bfloat16)
    res = dequant_fp4_to_bf16(packed, scales, out=out)
    assert res is out
    assert_bit_equal(out, seed_dequant(packed, scales))


@pytest.mark.parametrize(
    "out, exc, match",
    [
        (torch.empty(2, 8, 128, dtype=torch.bfloat16), ValueError, "out has shape"),
        (torch.empty(2, 8, 256, dtype=torch.float32), TypeError, "out must be bfloat16"),
        (torch.empty(2, 256, 8, dtype=torch.bfloat16).transpose(1, 2), ValueError, "contiguous"),
    ],
)
def test_bad_out_raises(out, exc, match):
    packed, scales = random_fp4((2, 8), 256)
    with pytest.raises(exc, match=match):
        dequant_fp4_to_bf16(packed, scales, out=out)


def test_empty_inputs():
    assert dequant_fp4_to_bf16(torch.empty(0, 16, dtype=torch.uint8), torch.empty(0, 1, dtype=torch.uint8)).shape == (
        0,
        32,
    )
    assert dequant_fp4_to_bf16(torch.empty(3, 0, dtype=torch.int8), torch.empty(3, 0, dtype=torch.uint8)).shape == (
        3,
        0,
    )


@pytest.mark.parametrize("column_major", [False, True])
def test_generic_torch_path_matches_seed(column_major):
    """The plain-torch table gather used on CUDA without Triton (and other devices), run on CPU."""
    packed, scales = all_combos(range(256))
    if column_major:
        packed, scales = packed.t().contiguous().t(), scales.t().contiguous().t()
    out = torch.empty(256, 512, dtype=torch.bfloat16)
    fp4_mod._dequant_torch(packed, scales, out)
    assert_bit_equal(out, seed_dequant(packed, scales))


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(1, 4), min_size=0, max_size=3), groups=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_random_shapes_match_seed(rows, groups, seed):
    packed, scales = random_fp4(tuple(rows), groups * 32, seed=seed)
    assert_bit_equal(dequant_fp4_to_bf16(packed, scales), seed_dequant(packed, scales))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "packed_shape, scale_shape",
    [
        ((4, 16), (4, 2)),  # K/32 should be 1
        ((4, 32), (4, 1)),  # K/32 should be 2
        ((4, 16), (3, 1)),  # rows differ
        ((2, 4, 16), (4, 1)),  # leading dims differ
        ((4, 24), (4, 1)),  # K/2 = 24 is not a multiple of 16
    ],
)
def test_shape_mismatch_raises_value_error(packed_shape, scale_shape):
    with pytest.raises(ValueError, match=r"do not match: expected scales \[\.\.\., K/32\]"):
        dequant_fp4_to_bf16(torch.zeros(packed_shape, dtype=torch.uint8), torch.zeros(scale_shape, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.float8_e4m3fn])
def test_bad_scale_dtype_raises_type_error(dtype):
    with pytest.raises(TypeError, match="E8M0 scales must be uint8 or float8_e8m0fnu"):
        dequant_fp4_to_bf16(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 1, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.float8_e4m3fn])
def test_bad_codes_dtype_raises_type_error(dtype):
    with pytest.raises(TypeError, match="FP4 codes must be int8 or uint8"):
        dequant_fp4_to_bf16(torch.zeros(4, 16, dtype=dtype), torch.zeros(4, 1, dtype=torch.uint8))


# ---------------------------------------------------------------- GPU (Triton kernel), run with -m gpu on the H200

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _triton_or_skip():
    from fimoe_convert.numerics import fp4_triton

    if not fp4_triton.triton_available():
        pytest.skip("triton is not installed")
    return fp4_triton


@gpu
@needs_cuda
@pytest.mark.parametrize("codes_dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e8m0fnu])
def test_gpu_every_scale_and_code_byte_matches_seed(codes_dtype, scale_dtype):
    ft = _triton_or_skip()
    packed, scales = all_combos()
    want = seed_dequant(packed, scales)  # CPU seed
    p, s = packed.cuda().view(codes_dtype), scales.cuda().view(scale_dtype)
    assert_bit_equal(ft.dequant_fp4_to_bf16_cuda(p, s), want)
    assert_bit_equal(dequant_fp4_to_bf16(p, s), want)  # public entry point dispatches to the kernel


@gpu
@needs_cuda
def test_gpu_seed_formula_is_device_independent():
    """The seed run on the GPU gives the CPU seed's bits for scale bytes 0..254 (no flush of the 2**-127
    subnormal), so matching the CPU seed is matching vLLM's."""
    packed, scales = all_combos()
    assert_bit_equal(seed_dequant(packed.cuda(), scales.cuda()), seed_dequant(packed, scales))


@gpu
@needs_cuda
def test_gpu_v4_flash_batch_matches_seed():
    ft = _triton_or_skip()
    packed, scales = random_fp4((8, 2048), 4096, seed=42, lo=1, device="cuda")
    got = ft.dequant_fp4_to_bf16_cuda(packed, scales)
    torch.cuda.synchronize()
    for i in range(8):  # per matrix: keeps the seed's float32 temporaries small
        assert torch.equal(bits(got[i]), bits(seed_dequant(packed[i], scales[i]))), f"matrix {i}"


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "block_groups, num_warps, load_bytes",
    [
        (16, 4, 4),  # one scale byte per program: every scale byte runs both paths on its own
        (64, 2, 4),  # the default
        (256, 8, 16),  # 16-byte code loads (layout conversion through shared memory)
        (64, 1, 4),
    ],
)
def test_gpu_every_scale_byte_per_config(block_groups, num_warps, load_bytes):
    ft = _triton_or_skip()
    packed, scales = all_combos()
    got = ft.dequant_fp4_to_bf16_cuda(packed.cuda(), scales.cuda(), block_groups=block_groups, num_warps=num_warps,
                                      load_bytes=load_bytes)
    assert_bit_equal(got, seed_dequant(packed, scales))


@gpu
@needs_cuda
def test_gpu_scale_byte_255_gives_the_documented_bits():
    """255 is outside the seed contract (rejected upstream); the kernel gives the recipe's bits: inf for
    non-zero codes, NaN 0x7FC0 for the zeros, with the code's sign."""
    ft = _triton_or_skip()
    packed, scales = all_combos(range(254, 256), device="cuda")  # 254 too: a program mixing both
    got = bits(ft.dequant_fp4_to_bf16_cuda(packed, scales))[1].tolist()
    codes = [c for b in range(256) for c in (b & 15, b >> 4)]
    want = [(0x7FC0 if c & 7 == 0 else 0x7F80) | ((c & 8) << 12) for c in codes]
    assert [v & 0xFFFF for v in got] == want


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "shape, k, block_groups",
    [
        ((1,), 32, 256),  # 1 group: a single, mostly masked program
        ((3, 5, 7), 96, 256),  # odd leading shape, 3 groups per row
        ((13,), 4096, 256),  # n_groups (1664) not a multiple of the block
        ((1000,), 32, 128),  # K/2 = 16 bytes, many rows
        ((2, 3), 64, 16),
    ],
)
def test_gpu_odd_shapes(shape, k, block_groups):
    ft = _triton_or_skip()
    packed, scales = random_fp4(shape, k, seed=k, device="cuda")
    got = ft.dequant_fp4_to_bf16_cuda(packed, scales, block_groups=block_groups)
    assert_bit_equal(got, seed_dequant(packed.cpu(), scales.cpu()))


@gpu
@needs_cuda
def test_gpu_rare_scale_bytes_in_some_programs():
    """A few scale bytes 1 and 253..254 scattered over a batch: their programs take the exact path, the
    rest the common one, with partial tiles at the end of the data."""
    ft = _triton_or_skip()
    packed, scales = random_fp4((3, 37), 512, seed=7, lo=110, hi=136)
    scales[0, 0, 0], scales[1, 20, 7], scales[2, 36, 15] = 1, 253, 254
    want = seed_dequant(packed, scales)
    for block_groups in (16, 128, 1024):
        assert_bit_equal(ft.dequant_fp4_to_bf16_cuda(packed.cuda(), scales.cuda(), block_groups=block_groups), want)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p, s: (p.transpose(0, 1), s.transpose(0, 1)), id="transposed-batch"),
        pytest.param(lambda p, s: (p[:, ::2], s[:, ::2]), id="strided-rows"),
        pytest.param(lambda p, s: (p[1:, 1:], s[1:, 1:]), id="offset-view"),
        pytest.param(lambda p, s: (p.transpose(-1, -2).contiguous().transpose(-1, -2), s), id="column-major-codes"),
    ],
)
def test_gpu_non_contiguous(make):
    ft = _triton_or_skip()
    packed, scales = random_fp4((4, 6), 128, seed=5, device="cuda")
    p, s = make(packed, scales)
    assert_bit_equal(ft.dequant_fp4_to_bf16_cuda(p, s), seed_dequant(p.cpu(), s.cpu()))


@gpu
@needs_cuda
def test_gpu_empty():
    ft = _triton_or_skip()
    p = torch.empty(0, 64, dtype=torch.uint8, device="cuda")
    assert ft.dequant_fp4_to_bf16_cuda(p, torch.empty(0, 4, dtype=torch.uint8, device="cuda")).shape == (0, 128)


@gpu
@needs_cuda
def test_gpu_misaligned_codes_view():
    """A codes view whose data pointer is not 4-byte aligned (not reachable with whole rows of K/2 bytes,
    but a flat view can do it): the kernel reads codes byte by byte."""
    ft = _triton_or_skip()
    flat = torch.randint(0, 256, (1 + 4 * 64,), dtype=torch.uint8, device="cuda")
    p = flat[1:].view(4, 64)
    s = torch.randint(1, 255, (4, 4), dtype=torch.uint8, device="cuda")
    assert p.data_ptr() % 4
    assert_bit_equal(ft.dequant_fp4_to_bf16_cuda(p, s), seed_dequant(p.cpu(), s.cpu()))


@gpu
@needs_cuda
def test_gpu_misaligned_out_view():
    """An `out` starting mid-int32 is written through an aligned temporary; the bytes around it stay."""
    ft = _triton_or_skip()
    packed, scales = random_fp4((4,), 128, seed=2, device="cuda")
    buf = torch.full((1 + 4 * 128 + 1,), 7.0, dtype=torch.bfloat16, device="cuda")
    out = buf[1:-1].view(4, 128)
    assert out.data_ptr() % 4
    assert ft.dequant_fp4_to_bf16_cuda(packed, scales, out=out) is out
    assert_bit_equal(out, seed_dequant(packed.cpu(), scales.cpu()))
    assert buf[0].item() == 7.0 and buf[-1].item() == 7.0


@gpu
@needs_cuda
def test_gpu_out_parameter_and_torch_fallback():
    ft = _triton_or_skip()
    packed, scales = random_fp4((3, 64), 512, seed=1, device="cuda")
    want = seed_dequant(packed.cpu(), scales.cpu())
    out = torch.empty(3, 64, 512, dtype=torch.bfloat16, device="cuda")
    assert ft.dequant_fp4_to_bf16_cuda(packed, scales, out=out) is out
    assert_bit_equal(out, want)
    out2 = torch.empty_like(out)
    fp4_mod._dequant_torch(packed.reshape(-1, 256), scales.reshape(-1, 16), out2.view(-1, 512))
    assert_bit_equal(out2, want)
