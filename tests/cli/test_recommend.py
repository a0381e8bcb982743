"""`fimoe-convert recommend --engine E --gpu G`: which target (or none) and why, from fimoe_convert/serving.py, without
torch; unknown names get one line with the closest one; docs/TARGETS.md's decision table is made from the same data
and docs/SERVING.md shows every serve command it prints."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fimoe_convert import serving
from fimoe_convert.cli import main
from fimoe_convert.errors import UsageError
from fimoe_convert.kernels import BY_NAME

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("decision_table", REPO / "scripts" / "decision_table.py")
dt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dt)


@pytest.mark.parametrize("engine, gpu, needed, target, params, capability", [
    ("vllm", "H200", False, None, {}, "9.0"),
    ("vLLM", "b300", False, None, {}, "10.3"),
    ("sglang", "sm_90", False, None, {}, "9.0"),
    ("vllm", "RTX 5090", True, "fp8_block", {"scale_dtype": "f32"}, "12.0"),  # never plain fp8_block: read as FP4
    ("sglang", "5090", True, "fp8_block", {}, "12.0"),
    ("vllm", "A100", True, "bf16", {}, "8.0"),
    ("transformers", "H100", True, "fp8_block", {}, "9.0"),
    ("hf", "A100", True, "bf16", {}, "8.0"),
    ("flashinfer", "H200", True, "megamoe_sm90_mxfp4", {}, "9.0"),
    ("flashinfer", "GB200", True, "sm100_mxfp8_mxfp4_bf16_cutedsl", {}, "10.0"),
    ("flashinfer", "10.7", True, "sm107_mxfp8_mxfp4_bf16_cutedsl", {}, "10.7"),
    ("flashinfer", "rtx pro 6000", True, "sm120_mxfp4_mxfp8_bf16_cake", {}, "12.0"),
    ("flashinfer", "A100", False, None, {}, "8.0"),  # no megakernel: nothing to convert for it
])
def test_the_answer_per_engine_and_gpu(engine, gpu, needed, target, params, capability):
    r = serving.recommend(engine, gpu)
    assert (r.needed, r.best.target, r.best.params, r.capability) == (needed, target, params, capability)
    assert r.best.serve and r.best.checked and r.why


@pytest.mark.parametrize("engine, gpu", [(e, c) for e in serving.ENGINES for c in serving.ROW_NAMES])
def test_every_answer_is_a_target_of_the_kernel_table_with_its_own_params(engine, gpu):
    r = serving.recommend(engine, gpu)
    for o in (r.best, *r.also):
        if o.target is not None:
            kernel = BY_NAME[o.target]
            assert all(v in kernel.params[k] for k, v in o.params.items()), o
            assert not kernel.capabilities or gpu in kernel.capabilities, (o.target, gpu)
            assert o.convert.startswith("fimoe-convert deepseek-ai/DeepSeek-V4-Flash OUT ")


def test_vllm_is_never_told_plain_fp8_block():
    """vLLM reads fp8_block with E8M0 scales as FP4 and does not load it."""
    for cap in serving.ROW_NAMES:
        r = serving.recommend("vllm", cap)
        assert all(o.params.get("scale_dtype") == "f32" for o in (r.best, *r.also) if o.target == "fp8_block"), cap


@pytest.mark.parametrize("engine, gpu, match", [
    ("vlm", "H200", r"^--engine vlm: unknown engine; did you mean 'vllm'\? known: vllm, sglang, transformers, "
                    r"flashinfer$"),
    ("vllm", "H300", r"^--gpu H300: unknown GPU; did you mean 'H800' or 'H200'\? known: H100, .*, or a compute "
                     r"capability \(8\.0, 8\.9, 9\.0, 10\.0, 10\.3, 10\.7, 12\.0\)$"),
    ("vllm", "7.5", r"^--gpu 7\.5: unknown GPU; known: "),
])
def test_unknown_names_say_the_closest(engine, gpu, match):
    with pytest.raises(UsageError, match=match):
        serving.recommend(engine, gpu)


def test_the_command_prints_the_answer_and_one_error_line():
    r = CliRunner().invoke(main, ["recommend", "--engine", "vllm", "--gpu", "H200"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("vLLM on H200 (compute capability 9.0): no conversion needed. vLLM serves the released")
    assert "serve: vllm serve deepseek-ai/DeepSeek-V4-Flash --tensor-parallel-size 8" in lines
    assert "  convert: fimoe-convert deepseek-ai/DeepSeek-V4-Flash OUT --config v4_flash_fp8_block_vllm" in lines
    j = CliRunner().invoke(main, ["recommend", "--engine", "flashinfer", "--gpu", "H200", "--json"])
    assert json.loads(j.stdout)["best"]["convert"].endswith("--config v4_flash_megamoe_sm90_ep8")
    bad = CliRunner().invoke(main, ["recommend", "--engine", "vllm", "--gpu", "H300"])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: --gpu H300:")


def test_recommend_imports_no_torch():
    code = ("import sys; from fimoe_convert.cli import main\n"
            "try:\n    main(['recommend', '--engine', 'sglang', '--gpu', 'B200'])\n"
            "except SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("SGLang on B200 (compute capability 10.0): no conversion needed.")


def test_the_decision_table_in_targets_md_is_current():
    assert dt.differences((REPO / "docs" / "TARGETS.md").read_text(), dt.generate()) == [], (
        "docs/TARGETS.md's decision table is stale; run `python3 scripts/decision_table.py --write`")


@pytest.mark.parametrize("edit, reported", [
    (lambda t: t.replace("**nothing**: the release as it is", "`fp8_block`", 1), "decision-table: docs/TARGETS.md "
                                                                                   "shows"),
    (lambda t: t.replace(dt.END, ""), "docs/TARGETS.md: expected one region"),
])
def test_a_stale_table_is_reported_and_rewritten(edit, reported):
    text = (REPO / "docs" / "TARGETS.md").read_text()
    changed, table = edit(text), dt.generate()
    assert changed != text
    problems = dt.differences(changed, table)
    assert problems and problems[0].startswith(reported), problems
    if "shows" in reported:
        assert dt.differences(dt.rewrite(changed, table), table) == []


def test_serving_md_shows_every_engine_command_recommend_prints():
    doc = (REPO / "docs" / "SERVING.md").read_text()
    commands = {o.serve for e in ("vllm", "sglang") for c in serving.ROW_NAMES
                for o in (serving.recommend(e, c).best, *serving.recommend(e, c).also)}
    assert commands and [c for c in sorted(commands) if c not in doc] == []
