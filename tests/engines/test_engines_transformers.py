"""Every output a dense engine loads is loaded by a real client: the tiny fixture (`make_checkpoint(DIR, "tiny")`, the
one generator; transformers' DeepseekV4ForCausalLM loads it with no missing or unexpected key) is converted and
loaded with AutoModelForCausalLM.from_pretrained on the CPU; the logits must be bit-identical to the source's loaded
the same way (max |logit diff| = 0). scripts/engines/transformers_versions.sh runs this file against other
transformers versions."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.20")
pytest.importorskip("accelerate")

from fimoe_convert import convert  # noqa: E402
from fimoe_convert.demo import run_demo  # noqa: E402
from fimoe_convert.testing import make_checkpoint, transformers_model as tm  # noqa: E402

OUTPUTS = {  # id -> (target, --param values, what config.json must say)
    "bf16": ("bf16", {}, {"quantization_config": True, "expert_dtype": None}),
    "bf16-dense-bf16": ("bf16", {"dense": "bf16"}, {"quantization_config": None, "expert_dtype": None}),
    "fp8_block-e8m0": ("fp8_block", {}, {"quantization_config": True, "expert_dtype": None}),
    "fp8_block-f32": ("fp8_block", {"scale_dtype": "f32"}, {"quantization_config": True, "expert_dtype": "fp8"}),
}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    src = make_checkpoint(tmp_path_factory.mktemp("release") / "src", "tiny")
    logits, info = tm.load_logits(src)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    assert torch.isfinite(logits).all()
    return src, logits


@pytest.mark.parametrize("output", [o if o == "bf16" else pytest.param(o, marks=pytest.mark.slow) for o in OUTPUTS])
def test_output_loads_in_transformers_with_identical_logits(release, output, tmp_path):
    src, want = release
    target, params, config = OUTPUTS[output]
    convert(str(src), str(tmp_path / "out"), target, params=params)
    got, info = tm.load_logits(tmp_path / "out")
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    diff = float((got.float() - want.float()).abs().max())
    print(f"transformers {transformers.__version__} {output}: max |logit diff| = {diff}")
    assert diff == 0.0 and torch.equal(got, want)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert ("quantization_config" in cfg) == bool(config["quantization_config"])
    assert cfg.get("expert_dtype") == config["expert_dtype"]


@pytest.mark.slow
def test_the_demo_checkpoint_and_its_bf16_output_load_with_identical_logits(tmp_path):
    summary = run_demo(tmp_path / "demo")
    assert summary["ok"], summary["summary"]
    want, info = tm.load_logits(tmp_path / "demo" / "src")
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    got, info = tm.load_logits(tmp_path / "demo" / "out-bf16")
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    diff = float((got.float() - want.float()).abs().max())
    print(f"transformers {transformers.__version__} demo bf16: max |logit diff| = {diff}")
    assert torch.isfinite(want).all() and diff == 0.0 and torch.equal(got, want)


@pytest.mark.slow
def test_a_changed_expert_byte_changes_the_logits(release, tmp_path):
    """The check can fail: a converted output whose one expert byte differs gives other logits."""
    src, want = release
    out = tmp_path / "out"
    convert(str(src), str(out), "fp8_block")
    from safetensors.torch import load_file, save_file

    name = "layers.1.ffn.experts.0.w1.weight"
    shard = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(out / shard))
    flipped = tensors[name].view(torch.uint8).clone()
    flipped[:, :64] ^= 0x80  # sign bit of 64 E4M3 values in every row
    tensors[name] = flipped.view(torch.float8_e4m3fn)
    save_file(tensors, str(out / shard), metadata={"format": "pt"})
    got, _ = tm.load_logits(out)
    assert not torch.equal(got, want)
