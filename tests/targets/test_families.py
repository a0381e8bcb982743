"""What each family of targets says without a converter (targets/families.py): its own rule, its report line,
the model card's runtime needs, and the one builder of FlashInfer's kernel config."""

from __future__ import annotations

import dataclasses

import pytest

from fimoe_convert.checkpoint import model_spec_from_config
from fimoe_convert.kernels import KERNELS, get_kernel
from fimoe_convert.records import TargetReport
from fimoe_convert.targets import TargetOptions, family, validate
from fimoe_convert.targets.families import FAMILIES, kernel_config

MODEL = model_spec_from_config({"model_type": "deepseek_v4", "expert_dtype": "fp4", "hidden_size": 256,
                                "moe_intermediate_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
                                "num_hidden_layers": 1})


def test_every_kernel_row_has_a_family():
    assert {k.family for k in KERNELS} == set(FAMILIES)


@pytest.mark.parametrize("target, report, line", [
    ("fp8_block", {"fp8_block": {"tensors": 1, "tiles": 4, "lossy_tiles": 0, "lossy_tensors": 0, "worst_abs_err": 0.0,
                                 "worst_rel_err": 0.0}}, "fp8_block: 1 expert matrix, 4 tiles, all exact"),
    ("fp8_block", {"fp8_block": {"tensors": 6, "tiles": 1, "lossy_tiles": 3, "lossy_tensors": 2, "worst_abs_err": 0.5,
                                 "worst_rel_err": 0.125}},
     "fp8_block: 6 expert matrices, 1 tile, 3 lossy in 2 tensors (worst abs. error 0.5, rel. 0.125)"),
    ("megamoe_sm90_mxfp4", {"mxfp4_window": {"groups": 10, "clamped_groups": 2, "lossy_experts": 1,
                                             "worst_rel_l2": 0.25}},
     "MXFP4 scale window: 10 scale groups, 2 clamped in 1 expert (worst rel. L2 0.25)"),
    ("bf16", {}, ""),
    ("sm100_mxfp8_mxfp4_bf16_cutedsl", {}, ""),
])
def test_report_line(target, report, line):
    assert family(get_kernel(target)).report_line(TargetReport.from_json(report, "report")) == line


@pytest.mark.parametrize("target, needs", [
    ("bf16", []), ("fp8_block", []),
    ("megamoe_sm90_mxfp4", ["torch.distributed (process group)", "torch symmetric memory (MegaMoESymmBuffer)"]),
    ("sm100_nvfp4_nvfp4_bf16_cutedsl", ["torch.distributed", "NVSHMEM"]),
    ("sm120_mxfp4_mxfp8_bf16_cake", ["torch.distributed"]),
])
def test_runtime_needs(target, needs):
    kernel = get_kernel(target)
    assert family(kernel).runtime_needs(kernel) == needs


@pytest.mark.parametrize("target, problem", [
    ("fp8_block", r"--target fp8_block: quantization_config\.weight_block_size is \[128, 48\]; the columns must be a "
                  r"multiple of 32"),
    ("bf16", None),
])
def test_the_fp8_block_tile_rule_is_its_own(target, problem):
    model = dataclasses.replace(MODEL, weight_block_size=(128, 48))
    problems = validate(get_kernel(target), model, TargetOptions())
    assert (problems == []) if problem is None else any(__import__("re").match(problem, p) for p in problems)


@dataclasses.dataclass
class WithGeometry:
    intermediate_size: int = 0
    top_k: int = 0
    activation: str = "silu"


@dataclasses.dataclass
class WithoutTopK:
    intermediate_size: int = 0
    fast_math: bool = True


def test_one_kernel_config_builder():
    assert kernel_config(WithGeometry, (128, 2), {"activation": "swiglu"}) == WithGeometry(128, 2, "swiglu")
    assert kernel_config(WithoutTopK, (128, 2), {}, {"fast_math": False}) == WithoutTopK(128, False)
    # a geometry field given again (the runtime checked it equals the checkpoint's) is no conflict
    assert kernel_config(WithGeometry, (128, 2), {}, {"top_k": 2}) == WithGeometry(128, 2)
