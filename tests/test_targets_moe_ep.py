"""Every flashinfer.moe_ep target that preprocesses on a CPU: converted with --ep-size 2, each block
and rank loaded through the runtime loader is bit-identical (structure, dtypes, shapes, strides,
bytes) to FlashInfer's own preprocess function called directly on the same experts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fimoe_convert.convert import convert
from fimoe_convert.inspection import list_targets
from fimoe_convert.errors import ValidationError
from fimoe_convert.testing import make_checkpoint

pytest.importorskip("flashinfer")
CHECK = Path(__file__).parent / "helpers" / "moe_ep_roundtrip.py"

CPU_TARGETS = [
    ("sm100_mxfp8_mxfp4_bf16_cutedsl", []),
    ("sm107_mxfp8_mxfp4_bf16_cutedsl", []),
    ("sm107_mxfp4_mxfp4_bf16_cutedsl", []),
    ("sm120_mxfp4_mxfp8_bf16_cake", []),
    ("sm100_bf16_bf16_bf16_cutedsl", []),
    ("sm100_mxfp8_mxfp8_bf16_cutedsl", []),
    ("sm90_fp8_fp8_bf16_pull_cutedsl", ["fp8_scale_mode=per_tensor"]),
    ("sm90_fp8_fp8_bf16_pull_cutedsl", ["fp8_scale_mode=blockwise"]),
]


@pytest.fixture(scope="module")
def kernel_ckpt(tmp_path_factory):
    # Scales kept finite in BF16 so the BF16-input kernels requantize real numbers.
    return make_checkpoint(tmp_path_factory.mktemp("k") / "src", "tiny", layers=2, hash_layers=1, mtp=1,
                           extreme_scales=False)


@pytest.mark.parametrize("target, params", CPU_TARGETS, ids=[f"{t}{'-' + p[0] if p else ''}" for t, p in CPU_TARGETS])
def test_bit_identical_to_flashinfer_preprocess(kernel_ckpt, tmp_path, target, params):
    r = subprocess.run([sys.executable, str(CHECK), target, str(kernel_ckpt), str(tmp_path / "out"), *params],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.strip().splitlines()[-1] == "OK 6"  # 2 layers + 1 MTP block, 2 ranks each


def test_targets_table_says_what_runs_here():
    rows = {r["name"]: r for r in list_targets()}
    for t, _ in CPU_TARGETS:
        assert rows[t]["available_here"] is True and rows[t]["kernel_name"] == t
    assert rows["sm100_nvfp4_nvfp4_bf16_cutedsl"]["vllm_moe_backend"] == "flashinfer_moe_ep_mega_cutedsl"
    assert rows["sm100_nvfp4_nvfp4_bf16_cutedsl"]["needs_nvshmem"] is True
    assert rows["sm100_fp8_fp4_bf16_deepgemm"]["vllm_moe_backend"] == "flashinfer_moe_ep_mega_deep_gemm"
    assert rows["sm100_fp8_fp4_bf16_deepgemm"]["needs_nvshmem"] is False
    import importlib.util
    if importlib.util.find_spec("deep_gemm") is None:
        assert rows["sm100_fp8_fp4_bf16_deepgemm"]["why"] == "needs the 'deep_gemm' package (not installed)"


@pytest.mark.parametrize("target, opts, match", [
    ("sm100_nvfp4_nvfp4_bf16_cutedsl", {"device": "cpu"}, r"--device cpu: --target sm100_nvfp4_nvfp4_bf16_cutedsl preprocesses on a CUDA device only"),
    ("sm90_fp8_mxfp4_bf16_pull_cutedsl", {"device": "cpu"}, r"--device cpu: .* preprocesses on a CUDA device only"),
    ("flashinfer_moe_ep_mega_cutedsl", {"device": "cpu", "arch": "9.0"},
     r"--arch 9\.0: --target sm100_nvfp4_nvfp4_bf16_cutedsl runs on compute capability 10\.0 or 10\.3"),
    ("sm90_fp8_fp8_bf16_pull_cutedsl", {"params": {"fp8_scale_mode": "rowwise"}},
     r"--param fp8_scale_mode=rowwise: expected one of per_tensor, blockwise"),
    ("sm107_mxfp8_mxfp4_bf16_cutedsl", {"params": {"x": "1"}}, r"--param x=1: sm107_mxfp8_mxfp4_bf16_cutedsl takes no parameters"),
    ("sm107_mxfp8_mxfp4_bf16_cutedsl", {"ep_size": 3}, r"--ep-size 3: must divide the 8 routed experts"),
])
def test_validation_names_the_flag(tiny_ckpt, tmp_path, target, opts, match):
    with pytest.raises(ValidationError, match=match):
        convert(str(tiny_ckpt), str(tmp_path / "out"), target, **opts)


def test_alias_resolves_and_all_problems_at_once(tiny_ckpt, tmp_path):
    with pytest.raises(ValidationError) as e:
        convert(str(tiny_ckpt), str(tmp_path / "out"), "deep_gemm_mega", ep_size=3, arch="9.0")
    text = str(e.value)
    assert "--ep-size 3" in text and "--arch 9.0: --target sm100_fp8_fp4_bf16_deepgemm" in text


def test_deepgemm_is_refused_up_front_naming_the_package_and_the_gpu(tiny_ckpt, tmp_path):
    """Before any tensor is read, not as a ModuleNotFoundError traceback: DeepGEMM is missing here, and its
    preprocessing needs an SM100 GPU (it refuses SM90 and has no CPU path)."""
    import importlib.util
    if importlib.util.find_spec("deep_gemm") is not None:
        pytest.skip("deep_gemm installed")
    with pytest.raises(ValidationError, match=r"(?s)^2 problems:.*--device cpu: --target sm100_fp8_fp4_bf16_deepgemm "
                                              r"preprocesses on a CUDA device only.*--target sm100_fp8_fp4_bf16_deepgemm: "
                                              r"needs the Python package 'deep_gemm', which is not installed here"):
        convert(str(tiny_ckpt), str(tmp_path / "out"), "sm100_fp8_fp4_bf16_deepgemm")
    assert not (tmp_path / "out").exists()


def test_manifest_structure_of_kernel_output(kernel_ckpt, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(CHECK), "sm107_mxfp8_mxfp4_bf16_cutedsl", str(kernel_ckpt), str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((out / "fimoe-manifest.json").read_text())
    s = m["layers"]["layers.1"]["1"]
    assert s["experts"] == [4, 8]
    fc1_w = s["structure"]["tuple"][0]["tuple"][0]
    assert fc1_w["tensor"] == "layers.1.ffn.experts.ep1.fc1.0" and fc1_w["dtype"] == "float4_e2m1fn_x2"
    assert fc1_w["shape"] == [4, 128, 256] and fc1_w["stride"] == [128 * 256, 1, 128]  # K-major view kept

