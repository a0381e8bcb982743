"""--engine on a conversion (the engine's conversion, or a usage error when the engine would not load the output),
what the summary, inspect and the model card say of the output's scales and engines, and the errors that need no
weights: raised before torch is imported."""

import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fimoe_convert import options
from fimoe_convert.cli import main
from fimoe_convert.errors import UsageError, ValidationError
from fimoe_convert.options import check_flags
from fimoe_convert.targets.rules import cuda_device_node

FLAGS = {"ep_size": 1, "arch": None, "max_memory": "8GiB", "shard_size": "5GB", "params": None, "resume": False,
         "overwrite": False, "writers": None}


def flags(target=None, **kw):
    return check_flags(target, **{**FLAGS, **kw})


@pytest.mark.parametrize("engine, arch, target, params", [
    (None, None, "bf16", {}),
    ("vllm", None, "fp8_block", {"scale_dtype": "f32"}),
    ("vLLM", None, "fp8_block", {"scale_dtype": "f32"}),
    ("sglang", None, "fp8_block", {}),
    ("transformers", None, "fp8_block", {}),
    ("transformers", "8.0", "bf16", {}),  # no FP8 tensor cores
    ("flashinfer", "9.0", "megamoe_sm90_mxfp4", {}),
])
def test_engine_without_target_picks_the_engines_conversion(engine, arch, target, params):
    f = flags(engine=engine, arch=arch)
    assert (f.kernel.name, f.params, f.engine) == (target, params, engine and engine.lower())


@pytest.mark.parametrize("target, params, engine", [
    ("fp8_block", {"scale_dtype": "f32"}, "vllm"),
    ("fp8_block", {}, "sglang"),
    ("fp8_block", {"scale_dtype": "e8m0"}, "transformers"),
    ("bf16", {}, "vllm"),
    ("bf16", {"dense": "bf16"}, "transformers"),
    ("megamoe_sm90_mxfp4", {}, "flashinfer"),
])
def test_a_target_the_engine_loads_is_kept(target, params, engine):
    f = flags(target, engine=engine, params=params)
    assert (f.kernel.name, f.params) == (target, params)


@pytest.mark.parametrize("target, params, engine, match", [
    ("fp8_block", {}, "vllm", r"^--engine vllm with --target fp8_block: this output loads in SGLang, transformers, "
                              r"not vLLM; vLLM reads E8M0-scaled FP8 experts as FP4: use --param scale_dtype=f32"),
    ("fp8_block", {"scale_dtype": "e8m0"}, "vllm", r"^--engine vllm with --target fp8_block --param "
                                                   r"scale_dtype=e8m0: .* use --param scale_dtype=f32"),
    ("fp8_block", {"scale_dtype": "f32"}, "sglang", r"^--engine sglang with --target fp8_block --param "
                                                    r"scale_dtype=f32: this output loads in vLLM, transformers, not "
                                                    r"SGLang; .* use --param scale_dtype=e8m0"),
    ("megamoe_sm90_mxfp4", {}, "vllm", r"^--engine vllm with --target megamoe_sm90_mxfp4: this output loads in "
                                       r"FlashInfer directly, not vLLM; .*drop --target"),
    ("sm100_mxfp8_mxfp4_bf16_cutedsl", {}, "sglang", r"^--engine sglang with --target sm100_mxfp8_mxfp4_bf16_cutedsl"),
    ("bf16", {}, "flashinfer", r"^--engine flashinfer with --target bf16: .*pick one for your GPU"),
    ("bf16", {"dense": "bf16"}, "vllm", r"^--engine vllm with --target bf16 --param dense=bf16: this output loads "
                                        r"in transformers, not vLLM; drop --param dense=bf16"),
    (None, {}, "flashinfer", r"^--engine flashinfer: .*add --arch \(e\.g\. 9\.0\) or --target NAME"),
    (None, {}, "vlm", r"^--engine vlm: unknown engine; did you mean 'vllm'\?"),
])
def test_a_target_the_engine_does_not_load_is_a_usage_error(target, params, engine, match):
    with pytest.raises(UsageError, match=match):
        flags(target, engine=engine, params=params)


def test_flashinfer_on_a_gpu_without_a_megakernel_names_the_engines_instead():
    with pytest.raises(UsageError, match=r"^--engine flashinfer --arch 8\.0: no FlashInfer MoE megakernel .* use "
                                         r"--engine vllm, sglang or transformers"):
        flags(engine="flashinfer", arch="8.0")


@pytest.mark.parametrize("kw, match", [
    ({"target": "fp8_block", "params": {"scale_dtype": "bf8"}},
     r"^--param scale_dtype=bf8: expected one of e8m0, f32$"),
    ({"target": "bf16", "params": {"scale_dtype": "f32"}},
     r"^--param scale_dtype=f32: bf16 takes dense \(fp8\|bf16\)$"),
    ({"target": "megamoe_sm90_mxfp4", "arch": "10.0"},
     r"^--arch 10\.0: --target megamoe_sm90_mxfp4 runs on compute capability 9\.0; pick a target for 10\.0"),
    ({"target": "bf16", "device": "gpu"}, r"^--device gpu: expected auto, cpu or cuda$"),
])
def test_flag_values_are_checked_without_torch(kw, match):
    with pytest.raises((UsageError, ValidationError), match=match) as e:
        flags(**kw)
    assert e.value.exit_code == 2


def test_device_cuda_without_a_gpu_device_node(monkeypatch):
    monkeypatch.setattr(options, "cuda_device_node", lambda: False)
    with pytest.raises(UsageError, match=r"^--device cuda: no CUDA device is visible to torch here; use --device cpu"):
        flags("bf16", device="cuda")


# convert() in a fresh process: the error, and whether torch was imported by then.
PROBE = """
import sys
from fimoe_convert import convert
from fimoe_convert.errors import FimoeError
try:
    convert(sys.argv[1], sys.argv[2], **eval(sys.argv[3]))
except FimoeError as e:
    print(e.problems[0])
    print("torch imported:", "torch" in sys.modules)
"""


@pytest.mark.parametrize("kw, out, match", [
    ({"target": "fp8_block", "params": {"scale_dtype": "bf8"}}, "out", r"--param scale_dtype=bf8: expected one of"),
    ({"target": "megamoe_sm90_mxfp4", "arch": "10.0"}, "out", r"--arch 10\.0: --target megamoe_sm90_mxfp4 runs on"),
    pytest.param({"device": "cuda"}, "out", r"--device cuda: no CUDA device is visible",
                 marks=pytest.mark.skipif(cuda_device_node(), reason="a GPU device node exists here")),
    ({}, "full", r"OUT .*full: is not empty \(a\.txt\); choose an empty folder"),
    ({"target": "fp8_block", "engine": "vllm"}, "out", r"--engine vllm with --target fp8_block: "),
])
def test_errors_that_need_no_weights_come_before_torch(tiny_ckpt, tmp_path, kw, out, match):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a.txt").write_text("x")
    p = subprocess.run([sys.executable, "-c", PROBE, str(tiny_ckpt), str(tmp_path / out), repr(kw)],
                       capture_output=True, text=True, timeout=120)
    first, second = p.stdout.splitlines()
    assert re.match(match, first), p.stdout + p.stderr
    assert second == "torch imported: False"


def test_engine_vllm_names_f32_scales_in_the_summary_card_and_inspect(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(out), "--engine", "vllm", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == "expert scales: F32; loads in: vLLM, transformers"
    card = (out / "README.md").read_text()
    assert "| expert scales | F32 |\n| loads in | vLLM, transformers (converted with --engine vllm: vLLM) |" in card
    assert "fimoe-convert SRC OUT --engine vllm\n" in card
    shown = CliRunner().invoke(main, ["inspect", str(out)])
    assert "\nexpert scales: F32; loads in: vLLM, transformers\n" in shown.stdout, shown.output


def test_plain_fp8_block_says_e8m0_and_keeps_its_card(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(out), "--target", "fp8_block", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == "expert scales: E8M0; loads in: SGLang, transformers"
    card = (out / "README.md").read_text()
    assert "| expert scales |" not in card and "engine:" not in card and "--engine" not in card
