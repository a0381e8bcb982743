"""`fp8_block`: FP4 experts -> FP8 E4M3 with one scale per weight_block_size tile. Lossless where every
value is exact in E4M3 (checked against independent references written here from the rule's
description), lossy tiles refused or reported, both scale layouts, V4.1's 32x32 tiles."""

import json
from pathlib import Path

import pytest
import torch
from reference import SEED_LUT, load_all, same_bits

from fimoe_convert import convert, verify
from fimoe_convert.errors import CorruptTensorError, InputError, ValidationError
from fimoe_convert.files.output.manifest import read_manifest
from fimoe_convert.files.safetensors.header import read_header
from fimoe_convert.files.sources.local import open_source
from fimoe_convert.numerics.fp8 import EXACT_SPAN, fp4_to_fp8_block
from fimoe_convert.testing import PRESETS, make_checkpoint

TINY = PRESETS["tiny"]
TILES = (TINY.inter // 128) * (TINY.hidden // 128)  # 128x128 tiles of one expert matrix (every preset here)

# Independent references ----------------------------------------------------------------------------

def pow2(e: torch.Tensor) -> torch.Tensor:
    """2**e in float32 for integer e, via Python floats (exact; subnormal below 2**-126)."""
    return torch.tensor([2.0 ** int(x) for x in e.flatten().tolist()], dtype=torch.float64).float().view(e.shape)


def ref_fp4_f32(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FP4 experts dequantized exactly in float32: E2M1 value (element 2i = low nibble) * 2**(s-127) per 32."""
    lut = torch.tensor(SEED_LUT, dtype=torch.float32)
    b = packed.view(torch.uint8).to(torch.int64)
    vals = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).flatten(-2)
    s = pow2(scales.view(torch.uint8).to(torch.int64) - 127)
    return vals * s.repeat_interleave(32, dim=1)


def tile_scale_f32(scale: torch.Tensor) -> torch.Tensor:
    if scale.dtype == torch.float8_e8m0fnu:
        return pow2(scale.view(torch.uint8).to(torch.int64) - 127)
    assert scale.dtype == torch.float32
    return scale


def ref_fp8_f32(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """FP8 tile-scaled weight dequantized in float32, tile by tile."""
    rows, cols = block
    s = tile_scale_f32(scale)
    out = torch.empty(weight.shape, dtype=torch.float32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            out[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols] = \
                weight[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols].float() * s[i, j]
    return out


def ref_cast(packed: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule as DeepSeek's convert.py --expert-dtype fp8 states it, in float32: tile scale = the tile's
    largest per-32 scale / 2**6; each value times (its group's scale / tile scale), cast to E4M3."""
    rows, cols = block
    vals = ref_fp4_f32(packed, torch.full_like(scales.view(torch.uint8), 127))  # unscaled E2M1 values
    s = pow2(scales.view(torch.uint8).to(torch.int64) - 127).repeat_interleave(32, dim=1)
    tr, tc = -(-vals.shape[0] // rows), -(-vals.shape[1] // cols)
    tile = torch.empty(tr, tc, dtype=torch.float32)
    w = torch.empty(vals.shape, dtype=torch.float8_e4m3fn)
    for i in range(tr):
        for j in range(tc):
            sl = (slice(i * rows, (i + 1) * rows), slice(j * cols, (j + 1) * cols))
            tile[i, j] = s[sl].max() / 2 ** 6
            w[sl] = (vals[sl] * (s[sl] / tile[i, j])).to(torch.float8_e4m3fn)
    return w, tile


# Fixtures ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp8_out(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8") / "out"
    res = convert(str(tiny_ckpt), str(out), "fp8_block", shard_size="3MB")
    return out, res


@pytest.fixture(scope="module")
def fp8_f32_out(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8f32") / "out"
    convert(str(tiny_ckpt), str(out), "fp8_block", params={"scale_dtype": "f32"})
    return out


def expert_weights(tensors: dict) -> list[str]:
    return sorted(n for n in tensors if ".ffn.experts." in n and n.endswith(".weight"))


# Lossless ------------------------------------------------------------------------------------------

def test_tiny_scales_fit_the_tile_rule(tiny_ckpt):
    """Every expert matrix of the tiny fixture has per-32 scale bytes within SCALE_SPAN (8) <= 14 steps,
    extreme bytes 1..9 and 246..254 included, so every tile converts exactly."""
    src = load_all(tiny_ckpt)
    for name in expert_weights(src):
        s = src[name.removesuffix(".weight") + ".scale"].view(torch.uint8)
        assert int(s.max()) - int(s.min()) <= EXACT_SPAN, name


@pytest.mark.slow
def test_fp8_dequantizes_to_exactly_the_fp4_values(tiny_ckpt, fp8_out):
    out, res = fp8_out
    src, dst = load_all(tiny_ckpt), load_all(out)
    names = expert_weights(src)
    assert len(names) == 4 * 8 * 3
    for name in names:
        sname = name.removesuffix(".weight") + ".scale"
        w, s = dst[name], dst[sname]
        out_dim, in_dim = w.shape
        assert w.dtype == torch.float8_e4m3fn and tuple(w.shape) == (src[name].shape[0], 2 * src[name].shape[1])
        assert s.dtype == torch.float8_e8m0fnu and tuple(s.shape) == (-(-out_dim // 128), -(-in_dim // 128))
        want = ref_fp4_f32(src[name], src[sname])
        assert same_bits(ref_fp8_f32(w, s, (128, 128)), want), name  # values and signs of zero
    assert res.report.fp8_block.lossy_tiles == 0 and res.report.fp8_block.tiles == 4 * 8 * 3 * TILES


@pytest.mark.slow
def test_fp8_bytes_and_tile_scales_follow_deepseeks_rule(tiny_ckpt, fp8_out):
    src, dst = load_all(tiny_ckpt), load_all(fp8_out[0])
    for name in expert_weights(src):
        sname = name.removesuffix(".weight") + ".scale"
        w, tile = ref_cast(src[name], src[sname], (128, 128))
        assert same_bits(dst[name], w), name
        assert torch.equal(tile_scale_f32(dst[sname]), tile), name


def test_everything_else_is_copied_and_config_drops_expert_dtype(tiny_ckpt, fp8_out):
    out, _ = fp8_out
    src, dst = load_all(tiny_ckpt), load_all(out)
    assert set(dst) == set(src)
    for name, t in src.items():
        if ".ffn.experts." not in name:
            assert same_bits(dst[name], t), name
    before = json.loads((tiny_ckpt / "config.json").read_text())
    after = json.loads((out / "config.json").read_text())
    assert "expert_dtype" not in after
    assert after == {k: v for k, v in before.items() if k != "expert_dtype"}
    m = read_manifest(out, require_complete=True)
    assert m.target.name == "fp8_block" and m.layers["layers.0"].scale_dtype == "F8_E8M0"
    assert m.report.fp8_block.lossy_tiles == 0
    assert verify(str(out), deep=True, src=str(tiny_ckpt)).problems == []


@pytest.mark.slow
def test_f32_scale_layout_is_the_base_layout(tiny_ckpt, fp8_out, fp8_f32_out, tmp_path):
    e8m0, f32 = load_all(fp8_out[0]), load_all(fp8_f32_out)
    src = load_all(tiny_ckpt)
    for name in expert_weights(src):
        sname = name.removesuffix(".weight") + ".scale"
        assert same_bits(f32[name], e8m0[name])
        assert f32[sname].dtype == torch.float32
        assert torch.equal(f32[sname], pow2(e8m0[sname].view(torch.uint8).to(torch.int64) - 127))
    cfg = json.loads((fp8_f32_out / "config.json").read_text())
    assert cfg["expert_dtype"] == "fp8"
    assert json.loads((fp8_f32_out / "fimoe-manifest.json").read_text())["target"]["parameters"] == {
        "scale_dtype": "f32"
    }
    # The output is a Base checkpoint: fimoe-convert reads it back, and its BF16 equals the source's BF16.
    model = open_source(str(fp8_f32_out)).model
    assert model.expert_dtype == "fp8" and model.weight_block_size == (128, 128)
    convert(str(fp8_f32_out), str(tmp_path / "a"), "bf16")
    convert(str(tiny_ckpt), str(tmp_path / "b"), "bf16")
    a, b = load_all(tmp_path / "a"), load_all(tmp_path / "b")
    for name in expert_weights(src):
        assert same_bits(a[name], b[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("scale_dtype", ["e8m0", "f32"])
def test_v41_uses_32x32_tiles_and_keeps_expert_dtype_in_quantization_config(tmp_path, scale_dtype):
    src_dir = make_checkpoint(tmp_path / "src", "v4.1")
    out = tmp_path / "out"
    res = convert(str(src_dir), str(out), "fp8_block", params={"scale_dtype": scale_dtype})
    src, dst = load_all(src_dir), load_all(out)
    for name in expert_weights(src):
        sname = name.removesuffix(".weight") + ".scale"
        w, s = dst[name], dst[sname]
        assert tuple(s.shape) == (w.shape[0] // 32, w.shape[1] // 32)
        assert s.dtype == (torch.float32 if scale_dtype == "f32" else torch.float8_e8m0fnu)
        assert same_bits(ref_fp8_f32(w, s, (32, 32)), ref_fp4_f32(src[name], src[sname])), name
        rw, rt = ref_cast(src[name], src[sname], (32, 32))
        assert same_bits(w, rw) and torch.equal(tile_scale_f32(s), rt), name
    for name, t in src.items():  # engram, indexer, vision tower and the rest: untouched (f32: E8M0 scales -> F32)
        if ".ffn.experts." not in name:
            if scale_dtype == "f32" and t.dtype == torch.float8_e8m0fnu:
                assert dst[name].dtype == torch.float32 and torch.equal(dst[name], t.float()), name
            else:
                assert same_bits(dst[name], t), name
    assert res.report.fp8_block.lossy_tiles == 0
    before = json.loads((src_dir / "config.json").read_text())
    after = json.loads((out / "config.json").read_text())
    assert after["text_config"] == before["text_config"] and after["vision_config"] == before["vision_config"]
    q = dict(before["quantization_config"])
    del q["expert_dtype"]
    if scale_dtype == "f32":
        q["expert_dtype"] = "fp8"
    assert after["quantization_config"] == q and "expert_dtype" not in after
    if scale_dtype == "f32":  # readable again as a V4.1 checkpoint with FP8 experts and 32x32 F32 scales
        model = open_source(str(out)).model
        assert model.dialect == "v4.1" and model.expert_dtype == "fp8" and model.weight_block_size == (32, 32)


# Lossy ---------------------------------------------------------------------------------------------

def test_lossy_fixture_is_refused_naming_tensor_and_tile(tmp_path):
    src = make_checkpoint(tmp_path / "src", "lossy-fp8")
    out = tmp_path / "out"
    with pytest.raises(
        InputError,
        match=r"^tensor 'layers\.0\.ffn\.experts\.0\.w1\.weight': tile \(0, 0\) \(rows 0\.\.127, "
        rf"columns 0\.\.127\) is not exact in FP8 E4M3 \({TILES} of {TILES} tiles of this tensor are "
        r"lossy\): its per-32 scale bytes span \d+\.\.\d+, more than the 14 steps .*"
        r"run again with --allow-lossy --overwrite",
    ):
        convert(str(src), str(out), "fp8_block")
    assert read_manifest(out).complete is False and not (out / "model.safetensors.index.json").exists()


@pytest.mark.slow
def test_lossy_fixture_with_allow_lossy_reports_count_and_worst_error(tmp_path):
    src_dir = make_checkpoint(tmp_path / "src", "lossy-fp8")
    out = tmp_path / "out"
    res = convert(str(src_dir), str(out), "fp8_block", allow_lossy=True)
    rep = res.report.fp8_block
    assert read_manifest(out, require_complete=True).report == res.report
    src, dst = load_all(src_dir), load_all(out)
    lossy, tiles, worst_abs, worst_rel = 0, 0, 0.0, 0.0
    for name in expert_weights(src):
        sname = name.removesuffix(".weight") + ".scale"
        got, want = ref_fp8_f32(dst[name], dst[sname], (128, 128)), ref_fp4_f32(src[name], src[sname])
        rw, _ = ref_cast(src[name], src[sname], (128, 128))
        assert same_bits(dst[name], rw), name  # the rule, applied as stated, even where it loses
        diff = got != want
        tiles += dst[sname].numel()
        lossy += int(diff.view(diff.shape[0] // 128, 128, -1, 128).any(dim=3).any(dim=1).sum())
        if diff.any():
            err = (got - want).abs()[diff]
            worst_abs = max(worst_abs, float(err.max()))
            worst_rel = max(worst_rel, float((err / want.abs()[diff]).max()))
    assert rep.tiles == tiles == 2 * 4 * 3 * TILES
    assert rep.lossy_tiles == lossy > 0
    assert rep.worst_abs_err == worst_abs > 0
    assert rep.worst_rel_err == worst_rel > 0
    assert rep.examples[0] == "layers.0.ffn.experts.0.w1.weight tile (0, 0)"


@pytest.mark.slow
@pytest.mark.parametrize("writers", [2, 3])
def test_report_and_folder_do_not_depend_on_writers(tmp_path, writers):
    """Experts split between shards run in each lane that writes part of them: the report counts each tensor
    once, and lists examples in name order, whatever the lanes did first."""
    src = make_checkpoint(tmp_path / "src", "lossy-fp8")
    one, many = tmp_path / "one", tmp_path / "many"
    want = convert(str(src), str(one), "fp8_block", allow_lossy=True, shard_size="40KB", writers=1)
    got = convert(str(src), str(many), "fp8_block", allow_lossy=True, shard_size="40KB", writers=writers)
    assert got.shards > writers
    assert got.report == want.report and want.report.fp8_block.tensors == 2 * 4 * 3
    assert {p.name: p.read_bytes() for p in many.iterdir()} == {p.name: p.read_bytes() for p in one.iterdir()}


def _set_scale_byte(ckpt: Path, name: str, row: int, group: int, value: int) -> None:
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    shard = ckpt / index[name]
    info = read_header(shard).tensors[name]
    data = bytearray(shard.read_bytes())
    data[info.start + row * info.shape[1] + group] = value
    shard.write_bytes(bytes(data))


def test_one_widened_group_makes_exactly_one_lossy_tile(tiny_copy, tmp_path):
    """One per-32 scale byte lowered 12 steps below its tile's scale: every nonzero value of that group
    falls under E4M3's smallest subnormal, so exactly that tile is lossy."""
    name = "layers.1.ffn.experts.3.w2"
    tile = load_all(tiny_copy)[f"{name}.scale"].view(torch.uint8)[128:256, 0:4].clone()  # tile (1, 0) of w2
    tile[2, 2] = 0  # row 130, group 2: the byte we lower; the tile's scale comes from the others
    _set_scale_byte(tiny_copy, f"{name}.scale", 130, 2, int(tile.max()) - 6 - 12)
    with pytest.raises(
        InputError,
        match=rf"^tensor '{name}\.weight': tile \(1, 0\) \(rows 128\.\.255, columns 0\.\.127\) "
        rf"is not exact in FP8 E4M3 \(1 of {TILES} tiles",
    ):
        convert(str(tiny_copy), str(tmp_path / "out"), "fp8_block")
    res = convert(str(tiny_copy), str(tmp_path / "lossy"), "fp8_block", allow_lossy=True)
    rep = res.report.fp8_block
    assert (rep.lossy_tiles, rep.lossy_tensors) == (1, 1)
    assert rep.examples == [f"{name}.weight tile (1, 0)"]
    assert rep.worst_rel_err == 1.0  # values at most half E4M3's smallest subnormal round to zero


# Refusals and numerics -----------------------------------------------------------------------------

@pytest.mark.parametrize("params, match", [
    ({"scale_dtype": "bf16"}, r"--param scale_dtype=bf16: expected one of e8m0, f32"),
    ({"block": "64"}, r"--param block=64: fp8_block takes scale_dtype \(e8m0\|f32\)"),
])
def test_bad_params_are_refused(tiny_ckpt, tmp_path, params, match):
    with pytest.raises(ValidationError, match=match):
        convert(str(tiny_ckpt), str(tmp_path / "out"), "fp8_block", params=params)


def test_scale_byte_255_names_the_tensor(tiny_copy, tmp_path):
    _set_scale_byte(tiny_copy, "layers.2.ffn.experts.5.w1.scale", 0, 3, 255)
    with pytest.raises(
        CorruptTensorError, match=r"tensor 'layers\.2\.ffn\.experts\.5\.w1\.scale': 1 scale bytes are 255"
    ):
        convert(str(tiny_copy), str(tmp_path / "out"), "fp8_block")


@pytest.mark.parametrize("span", [*range(0, 18), pytest.param(18, marks=pytest.mark.slow)])
def test_span_rule_exact_up_to_14_steps(span):
    """Two groups of a tile at scale bytes 140 and 140 - span, all 16 codes in each: exact iff span <= 14."""
    codes = torch.arange(256, dtype=torch.uint8).view(8, 32)  # every code byte, so every (lo, hi) pair
    packed = codes.repeat(16, 1)  # [128, 32] bytes = [128, 64] values: two groups per row
    scales = torch.tensor([[140, 140 - span]], dtype=torch.uint8).repeat(128, 1)
    r = fp4_to_fp8_block(packed, scales, (128, 64))
    assert r.lossy_tiles == (1 if span > EXACT_SPAN else 0)
    assert int(r.tile_bytes) == 134
    exact = same_bits(
        ref_fp8_f32(r.weight, r.tile_bytes.view(torch.float8_e8m0fnu), (128, 64)), ref_fp4_f32(packed, scales)
    )
    assert exact == (span <= EXACT_SPAN)


def test_ragged_shapes_and_tiny_scales():
    """Partial tiles at the edges, and tiles whose largest scale byte is below 7 (tile byte clamped to 1)."""
    g = torch.Generator().manual_seed(1)
    packed = torch.randint(0, 256, (200, 48), generator=g, dtype=torch.uint8)  # [200, 96] values
    scales = torch.randint(0, 6, (200, 3), generator=g, dtype=torch.uint8)
    r = fp4_to_fp8_block(packed, scales, (128, 64))
    assert tuple(r.weight.shape) == (200, 96) and tuple(r.tile_bytes.shape) == (2, 2)
    assert r.lossy_tiles == 0 and bool((r.tile_bytes == 1).all())
    assert same_bits(
        ref_fp8_f32(r.weight, r.tile_bytes.view(torch.float8_e8m0fnu), (128, 64)), ref_fp4_f32(packed, scales)
    )


# The table path against the former float implementation ------------------------------------------
# `old_fp4_to_fp8_block` is the implementation of numerics/fp8.py before the table path (commit de11183),
# copied here with its helpers so that the reference does not move with the package.

OLD_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
OLD_CHUNK_ELEMS = 1 << 20


def old_pow2_f32(e: torch.Tensor) -> torch.Tensor:
    e64 = e.to(torch.int64).clamp(-1074, 1023)
    return ((e64 + 1023) << 52).view(torch.float64).to(torch.float32)


def old_fp4_values_f32(packed: torch.Tensor) -> torch.Tensor:
    lut = torch.tensor(OLD_E2M1, dtype=torch.float32, device=packed.device)
    b = packed.view(torch.uint8).to(torch.int64)
    return torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).flatten(-2)


def old_tile_map(t, rows, gpt, n, groups):
    return t.repeat_interleave(rows, 0)[:n].repeat_interleave(gpt, 1)[:, :groups]


def old_per_tile(x, rows, cols, reduce):
    n, k = x.shape
    tr, tc = -(-n // rows), -(-k // cols)
    if (tr * rows, tc * cols) != (n, k):
        x = torch.nn.functional.pad(x, (0, tc * cols - k, 0, tr * rows - n))
    x = x.view(tr, rows, tc, cols)
    return x.any(dim=3).any(dim=1) if reduce == "any" else x.amax(dim=3).amax(dim=1)


def old_fp4_to_fp8_block(packed, scales, block=(128, 128)):
    """(weight, tile_bytes, lossy, max_abs, max_rel) exactly as the former `fp4_to_fp8_block` computed them."""
    rows, cols = block
    sb = scales.view(torch.uint8)
    out_dim, k_half = packed.shape
    k = 2 * k_half
    groups, gpt = k // 32, cols // 32
    tr, tc = -(-out_dim // rows), -(-k // cols)
    weight = torch.empty(out_dim, k, dtype=torch.float8_e4m3fn)
    tile_bytes = torch.empty(tr, tc, dtype=torch.uint8)
    lossy = torch.zeros(tr, tc, dtype=torch.bool)
    max_abs = torch.zeros(tr, tc, dtype=torch.float32)
    max_rel = torch.zeros(tr, tc, dtype=torch.float32)
    step = rows * max(1, OLD_CHUNK_ELEMS // max(1, rows * k))
    for r0 in range(0, out_dim, step):
        r1 = min(out_dim, r0 + step)
        n, t0, t1 = r1 - r0, r0 // rows, -(-r1 // rows)
        s = sb[r0:r1].to(torch.int32)
        t = (old_per_tile(s, rows, gpt, "amax") - 6).clamp_min_(1)
        tile_bytes[t0:t1] = t.to(torch.uint8)
        t_g = old_tile_map(t, rows, gpt, n, groups)
        vals = old_fp4_values_f32(packed[r0:r1]).view(n, groups, 32)
        y = (vals * old_pow2_f32(s - t_g).unsqueeze(-1)).to(torch.float8_e4m3fn)
        weight[r0:r1] = y.view(n, k)
        deq8 = y.float() * old_pow2_f32(t_g - 127).unsqueeze(-1)
        deq4 = vals * old_pow2_f32(s - 127).unsqueeze(-1)
        diff = (deq8 != deq4).view(n, k)
        if bool(diff.any()):
            lossy[t0:t1] = old_per_tile(diff, rows, cols, "any")
            err = torch.where(diff, (deq8 - deq4).abs().view(n, k), 0.0).nan_to_num_(posinf=float("inf"))
            rel = torch.where(diff, err / deq4.abs().view(n, k), 0.0)
            max_abs[t0:t1] = old_per_tile(err, rows, cols, "amax")
            max_rel[t0:t1] = old_per_tile(rel, rows, cols, "amax")
    return weight, tile_bytes, lossy, max_abs, max_rel


def assert_same_as_old(packed, scales, block, result=None):
    r = fp4_to_fp8_block(packed, scales, block) if result is None else result
    want = old_fp4_to_fp8_block(packed, scales, block)
    for field, got, exp in zip(("weight", "tile_bytes", "lossy", "max_abs", "max_rel"),
                               (r.weight, r.tile_bytes, r.lossy, r.max_abs, r.max_rel), want):
        assert same_bits(got, exp), field  # bits: signed zeros of the weight, and the float error measures
    return r


def every_offset_and_code(t_values):
    """Tiles of 16 rows x 64 values (block (16, 64)): group 0 of each row at the tile's largest scale byte
    t + 6 (t clamped to 1 when that is below 7), group 1 at t + k; the 16 rows of group 1 hold all 256 code
    bytes. One tile per (t, k) pair with both scale bytes in 0..254."""
    codes = torch.arange(256, dtype=torch.uint8).view(16, 16)
    pairs = [(t, k) for t in t_values for k in range(-254, 7) if 0 <= t + k <= 254 and t + 6 <= 254]
    packed, scales = [], []
    for t, k in pairs:
        packed.append(torch.cat([codes.flip(0), codes], dim=1))  # [16 rows, 32 bytes] = 64 values
        hi = t + 6 if t > 1 else max(t + k, 0)  # t == 1: the largest byte may be anything from 0 to 7
        scales.append(torch.tensor([[hi, t + k]] * 16, dtype=torch.uint8))
    return torch.cat(packed), torch.cat(scales), pairs


@pytest.mark.parametrize("t_values", [[1], [2, 7], pytest.param([121, 130], marks=pytest.mark.slow),
                                      pytest.param([200, 248], marks=pytest.mark.slow)])
def test_table_equals_old_for_every_code_byte_and_offset(t_values):
    """Every code byte at every offset k = s - t that a tile can give (-248..6), at several tile bytes t:
    weight bytes, tile bytes, lossy tiles and their errors bit for bit as the float implementation."""
    packed, scales, pairs = every_offset_and_code(t_values)
    r = assert_same_as_old(packed, scales, (16, 64))
    lossy = {k for (t, k), flag in zip(pairs, r.lossy.flatten().tolist()) if flag}
    assert lossy == {k for t, k in pairs if k < -8}  # every offset below -8 loses some code byte, none above


E4M3_VALUES = {v for v in torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist() if v == v}


@pytest.mark.slow
@pytest.mark.parametrize("t", [9, 13, 127, 248])
def test_table_exactness_per_code_at_low_offsets(t):
    """k from -14 to -7, one code byte per tile: a tile is lossy exactly when a value of its code byte times
    2**k is not one of the 254 finite E4M3 values (bytes 0x00, 0x08, 0x80, 0x88 hold zeros: never lossy)."""
    pairs = [(k, b) for k in range(-14, -6) for b in range(256) if t + k >= 0]
    packed = torch.tensor([[0x77] * 16 + [b] * 16 for _, b in pairs], dtype=torch.uint8)  # group 1: all b
    scales = torch.tensor([[t + 6, t + k] for k, _ in pairs], dtype=torch.uint8)  # tile byte t
    r = assert_same_as_old(packed, scales, (1, 64))
    assert r.tile_bytes.unique().tolist() == [t]
    for (k, b), flag in zip(pairs, r.lossy[:, 0].tolist()):
        exact = all(abs(OLD_E2M1[c]) * 2.0 ** k in E4M3_VALUES for c in (b & 15, b >> 4))
        assert flag == (not exact), (k, b)


@pytest.mark.parametrize("shape, block, lo, hi", [
    ((256, 128), (128, 128), 110, 125),   # typical: span <= 14, every tile exact
    pytest.param((384, 256), (128, 128), 100, 140, marks=pytest.mark.slow),  # span up to 39: lossy among exact
    ((128, 64), (128, 128), 0, 255),      # any byte
    ((200, 48), (128, 64), 0, 6),         # rows and columns not multiples of the tile; tile bytes clamped to 1
    ((130, 80), (128, 128), 118, 140),    # two partial tiles each way
    ((1, 16), (128, 128), 120, 130),      # one row, one group
    ((96, 64), (32, 32), 110, 125),       # V4.1 tiles
    ((100, 48), (32, 32), 100, 150),      # V4.1, ragged, lossy
    ((64, 32), (32, 64), 0, 255),         # V4.1-like rows with wider tiles
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_table_equals_old_on_random_tiles(shape, block, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    scales = torch.randint(lo, hi, (shape[0], shape[1] // 16), generator=g, dtype=torch.uint8)
    r = assert_same_as_old(packed, scales, block)
    if hi - lo <= EXACT_SPAN + 1:
        assert r.lossy_tiles == 0


def test_table_equals_old_on_lossy_tiles_with_signed_codes():
    """Lossy tiles whose lost values are negative, zero codes of both signs, and int8 codes as read from
    the checkpoint: same lossy mask, same worst absolute and relative errors."""
    g = torch.Generator().manual_seed(7)
    packed = torch.randint(-128, 128, (256, 256), generator=g, dtype=torch.int8)
    scales = torch.full((256, 16), 130, dtype=torch.uint8)
    scales[::3, 1::4] = 130 - 6 - 9  # k = -9 in every fourth group of every third row
    scales[5, 7] = 0  # k far below: every nonzero value of that group flushes to a signed zero
    r = assert_same_as_old(packed, scales.view(torch.float8_e8m0fnu), (128, 128))
    assert 0 < r.lossy_tiles <= r.lossy.numel()
    assert float(r.max_rel.max()) == 1.0  # a flushed value


@pytest.mark.parametrize("threads, chunk_bytes", [pytest.param(1, 1 << 19, marks=pytest.mark.slow), (2, 1 << 19),
                                                 (2, 4096), (3, 1 << 12)])
def test_table_equals_old_over_threads_and_chunks(monkeypatch, threads, chunk_bytes):
    """Above the parallel threshold the rows are spread over threads in chunks of whole tile rows; results do
    not depend on how many threads or how the rows are cut (one lossy tile row included)."""
    from fimoe_convert.numerics import fp8

    monkeypatch.setattr(fp8, "_TABLE_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    g = torch.Generator().manual_seed(3)
    packed = torch.randint(0, 256, (1000, 1056), generator=g, dtype=torch.uint8)  # > _PARALLEL_MIN_BYTES
    scales = torch.randint(118, 131, (1000, 66), generator=g, dtype=torch.uint8)
    scales[300:310, 40] = 90  # lossy groups in tile row 2
    r = assert_same_as_old(packed, scales, (128, 128))
    assert r.lossy[:, 40 * 32 // 128].tolist() == [False, False, True, False, False, False, False, False]
    assert tuple(r.lossy.shape) == (8, 17)
    assert r.lossy_tiles == 1


def test_bad_inputs_are_refused():
    packed = torch.zeros(4, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="scale byte 255"):
        fp4_to_fp8_block(packed, torch.full((4, 1), 255, dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not match"):
        fp4_to_fp8_block(packed, torch.zeros(4, 2, dtype=torch.uint8))
    with pytest.raises(TypeError, match="2-D int8/uint8"):
        fp4_to_fp8_block(packed.float(), torch.zeros(4, 1, dtype=torch.uint8))
    r = fp4_to_fp8_block(torch.zeros(0, 16, dtype=torch.uint8), torch.zeros(0, 1, dtype=torch.uint8))
    assert tuple(r.weight.shape) == (0, 32) and tuple(r.tile_bytes.shape) == (0, 1) and r.lossy_tiles == 0
