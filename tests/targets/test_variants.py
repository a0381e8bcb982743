"""Every DeepSeek V4 variant: converts to BF16 with the core checks (bit-exact experts against an
independent reference, byte-identical copies, scales dropped, config rewritten where the dialect keeps
expert_dtype), and `inspect` names it and the targets that apply."""

import json

import pytest
import torch
from reference import load_all, same_bits, seed_dequant

from fimoe_convert import convert, verify
from fimoe_convert.checkpoint import variant_name
from fimoe_convert.errors import ValidationError
from fimoe_convert.files.sources.local import open_source
from fimoe_convert.inspection import inspect
from fimoe_convert.kernels import KERNELS
from fimoe_convert.testing import fixture_spec, make_checkpoint

# id: (preset, overrides, variant name, MoE blocks, experts per block)
VARIANTS = {
    "flash": ("tiny", {}, "V4-Flash", 4, 8),
    "pro": ("pro-geometry", {}, "V4-Pro", 1, 2),
    "base": ("base", {}, "V4 Base (FP8 experts)", 4, 8),
    "base-expert-dtype": ("base", {"expert_dtype_in_config": True}, "V4 Base (FP8 experts)", 4, 8),
    "dspark": ("dspark", {}, "V4 0731/DSpark (3 MTP blocks)", 6, 8),
    "v4.1": ("v4.1", {}, "V4.1", 4, 8),
}


def ref_fp8_block_dequant(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Independent reference for FP8 (Base) experts: E4M3 value times its tile's F32 scale, the product in
    float32 (DeepSeek's weight_dequant), cast to BF16; tile by tile."""
    rows, cols = block
    out = torch.empty(weight.shape, dtype=torch.bfloat16)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            w = weight[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols].to(torch.float32)
            out[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols] = (w * scale[i, j].to(torch.float32)).to(
                torch.bfloat16
            )
    return out


def is_expert(name: str) -> bool:
    return ".ffn.experts." in name


@pytest.fixture(scope="module", params=[pytest.param(v, marks=pytest.mark.slow) if v == "pro" else v for v in VARIANTS])
def variant(request, tmp_path_factory):
    preset, overrides, name, blocks, experts = VARIANTS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    src = make_checkpoint(root / "src", preset, **overrides)
    out = root / "bf16"
    convert(str(src), str(out), "bf16", shard_size="64MB")
    return {"id": request.param, "src": src, "out": out, "name": name, "blocks": blocks, "experts": experts}


def test_variant_converts_to_bf16_bit_exact(variant):
    src, dst = load_all(variant["src"]), load_all(variant["out"])
    cfg = json.loads((variant["src"] / "config.json").read_text())
    model = open_source(str(variant["src"])).model
    weights = [n for n in src if is_expert(n) and n.endswith(".weight")]
    assert len(weights) == variant["blocks"] * variant["experts"] * 3
    assert {n.split(".ffn.")[0] for n in weights} == set(model.moe_blocks)
    for name in weights:
        w, s = src[name], src[name.removesuffix(".weight") + ".scale"]
        if model.expert_dtype == "fp4":
            assert w.dtype == torch.int8 and s.dtype == torch.float8_e8m0fnu
            want = seed_dequant(w, s)
        else:
            assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
            want = ref_fp8_block_dequant(w, s, tuple(cfg["quantization_config"]["weight_block_size"]))
        assert dst[name].dtype == torch.bfloat16 and tuple(dst[name].shape) == tuple(want.shape)
        assert same_bits(dst[name], want), name


def test_variant_copies_everything_else_byte_for_byte(variant):
    src, dst = load_all(variant["src"]), load_all(variant["out"])
    assert set(dst) == {n for n in src if not (is_expert(n) and n.endswith(".scale"))}
    for name, t in src.items():
        if not is_expert(name):
            assert dst[name].dtype == t.dtype and same_bits(dst[name], t), name
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (variant["out"] / f).read_bytes() == (variant["src"] / f).read_bytes()
    assert verify(str(variant["out"]), deep=True, src=str(variant["src"])).problems == []


def test_variant_config_drops_expert_dtype_and_skips_the_experts(variant):
    """No engine accepts expert_dtype "bf16": it goes, and the FP8 quantization_config (dense layers)
    lists every MoE block's experts as not quantized (docs/ENGINES.md)."""
    before = json.loads((variant["src"] / "config.json").read_text())
    after = json.loads((variant["out"] / "config.json").read_text())
    assert "expert_dtype" not in after and "expert_dtype" not in after["quantization_config"]
    q_before = {k: v for k, v in before["quantization_config"].items() if k != "expert_dtype"}
    skip = after["quantization_config"].pop("ignored_layers")
    assert after["quantization_config"] == q_before
    source = open_source(str(variant["src"]))
    # one name per block in DeepSeek's, SGLang's and vLLM's spelling, and SGLang's MTP draft module for mtp.0
    has_mtp = "mtp.0" in source.model.moe_blocks
    assert skip[0] == "lm_head" and len(skip) == 1 + 3 * len(source.model.moe_blocks) + has_mtp
    assert ("model.decoder.mlp.experts" in skip) == has_mtp
    assert all(f"{b}.ffn.experts" in skip and f"{b}.mlp.experts" in skip for b in source.model.moe_blocks)
    if variant["id"] == "v4.1":
        assert after["text_config"] == before["text_config"] and after["vision_config"] == before["vision_config"]
    assert {k: v for k, v in after.items() if k not in ("expert_dtype", "quantization_config")} == \
        {k: v for k, v in before.items() if k not in ("expert_dtype", "quantization_config")}


def test_inspect_names_the_variant_and_the_targets_that_apply(variant):
    source = open_source(str(variant["src"]))
    assert variant_name(source.model, source.config) == variant["name"]
    fits = inspect(str(variant["src"])).targets
    assert fits["bf16"] == "fits"
    fp4_consumers = [k.name for k in KERNELS if k.consumes == "fp4"]
    assert "fp8_block" in fp4_consumers
    if source.model.expert_dtype == "fp8":
        for name in fp4_consumers:
            assert any(f"--target {name}: consumes FP4 experts, but this checkpoint's experts are FP8" in p
                       and "use --target bf16" in p for p in fits[name]), (name, fits[name])
    else:
        assert fits["fp8_block"] == "fits"


def test_fp4_consuming_targets_refuse_base_checkpoints(tmp_path):
    src = make_checkpoint(tmp_path / "src", "base")
    with pytest.raises(
        ValidationError,
        match=r"--target fp8_block: consumes FP4 experts, but this checkpoint's experts "
        r"are FP8 \(expert_dtype 'fp8'\); use --target bf16",
    ):
        convert(str(src), str(tmp_path / "out"), "fp8_block")
    assert not (tmp_path / "out").exists()


def test_variant_fixtures_have_their_distinguishing_features(tmp_path):
    dspark = load_all(make_checkpoint(tmp_path / "dspark", "dspark"))
    assert {"mtp.0.main_proj.weight", "mtp.0.main_proj.scale", "mtp.0.main_norm.weight", "mtp.2.norm.weight",
            "mtp.2.markov_head.embed.weight", "mtp.2.confidence_head.proj.weight", "mtp.2.hc_head_fn"} <= set(dspark)
    assert all(f"mtp.{k}.ffn.experts.7.w2.weight" in dspark for k in range(3))
    v41_dir = make_checkpoint(tmp_path / "v41", "v4.1")
    v41, cfg = load_all(v41_dir), json.loads((v41_dir / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v41" and "hidden_size" in cfg["text_config"] and "hidden_size" not in cfg
    assert cfg["quantization_config"]["expert_dtype"] == "fp4" and cfg["quantization_config"]["weight_block_size"] == [
        32,
        32,
    ]
    assert tuple(v41["layers.0.attn.wq_a.scale"].shape) == (128 // 32, 256 // 32)
    assert {"layers.0.engram.embed.weight", "layers.1.attn.indexer.wq_b.scale", "vision.patch_embed.weight"} <= set(v41)
    base_dir = make_checkpoint(tmp_path / "base", "base")
    base, cfg = load_all(base_dir), json.loads((base_dir / "config.json").read_text())
    assert "expert_dtype" not in cfg
    assert base["layers.0.ffn.experts.0.w1.weight"].dtype == torch.float8_e4m3fn
    assert base["layers.0.ffn.experts.0.w1.scale"].dtype == torch.float32
    spec = fixture_spec("base")  # one F32 scale per 128x128 tile of w1 [inter, hidden]
    assert tuple(base["layers.0.ffn.experts.0.w1.scale"].shape) == (spec.inter // 128, spec.hidden // 128)
    assert base["layers.0.attn.wq_a.scale"].dtype == torch.float32
