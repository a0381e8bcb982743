"""Every output a dense engine loads is loaded by a real client: a tiny random DeepseekV4ForCausalLM made by
transformers' own classes, written in DeepSeek's release format (fimoe_convert.testing.transformers_model),
converted, and loaded with AutoModelForCausalLM.from_pretrained on the CPU; the logits must be bit-identical to the
source's loaded the same way (max |logit diff| = 0)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", minversion="5.24")
pytest.importorskip("accelerate")

from fimoe_convert.convert import convert  # noqa: E402
from fimoe_convert.testing import transformers_model as tm  # noqa: E402

OUTPUTS = {  # id -> (target, --param values, what config.json must say)
    "bf16": ("bf16", {}, {"quantization_config": True, "expert_dtype": None}),
    "bf16-dense-bf16": ("bf16", {"dense": "bf16"}, {"quantization_config": None, "expert_dtype": None}),
    "fp8_block-e8m0": ("fp8_block", {}, {"quantization_config": True, "expert_dtype": None}),
    "fp8_block-f32": ("fp8_block", {"scale_dtype": "f32"}, {"quantization_config": True, "expert_dtype": "fp8"}),
}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    src = tm.write_release_checkpoint(tmp_path_factory.mktemp("release") / "src")
    logits, info = tm.load_logits(src)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    return src, logits


@pytest.mark.parametrize("output", list(OUTPUTS))
def test_output_loads_in_transformers_with_identical_logits(release, output, tmp_path):
    src, want = release
    target, params, config = OUTPUTS[output]
    convert(str(src), str(tmp_path / "out"), target, params=params)
    got, info = tm.load_logits(tmp_path / "out")
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    diff = float((got.float() - want.float()).abs().max())
    print(f"{output}: max |logit diff| = {diff}")
    assert diff == 0.0 and torch.equal(got, want)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert ("quantization_config" in cfg) == bool(config["quantization_config"])
    assert cfg.get("expert_dtype") == config["expert_dtype"]


def test_the_release_writer_is_the_reference(release, tmp_path):
    """The check can fail: a converted output whose one expert byte differs gives other logits."""
    src, want = release
    out = tmp_path / "out"
    convert(str(src), str(out), "fp8_block")
    from fimoe_convert.files.output import read_output_tensors

    name = "layers.1.ffn.experts.0.w1.weight"
    w = read_output_tensors(out, [name])[name]
    from safetensors.torch import load_file, save_file

    shard = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(out / shard))
    flipped = w.view(torch.uint8).clone()
    flipped[0, :64] ^= 0x08  # sign bit of 64 E4M3 values
    tensors[name] = flipped.view(torch.float8_e4m3fn)
    save_file(tensors, str(out / shard), metadata={"format": "pt"})
    got, _ = tm.load_logits(out)
    assert not torch.equal(got, want)
