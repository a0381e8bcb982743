"""Every flashinfer.moe_ep target that preprocesses on a CPU: converted with --ep-size 2, each block
and rank loaded through the runtime loader is bit-identical (structure, dtypes, shapes, strides,
bytes) to FlashInfer's own preprocess function called directly on the same experts."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fimoe_convert import convert
from fimoe_convert.errors import ValidationError
from fimoe_convert.inspection import list_targets
from fimoe_convert.testing import PRESETS, make_checkpoint

pytest.importorskip("flashinfer")
TINY = PRESETS["tiny"]
CHECK = Path(__file__).parents[1] / "helpers" / "moe_ep_roundtrip.py"

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


@pytest.mark.slow
@pytest.mark.parametrize("target, params", CPU_TARGETS, ids=[f"{t}{'-' + p[0] if p else ''}" for t, p in CPU_TARGETS])
def test_bit_identical_to_flashinfer_preprocess(kernel_ckpt, tmp_path, target, params):
    r = subprocess.run([sys.executable, str(CHECK), target, str(kernel_ckpt), str(tmp_path / "out"), *params],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.strip().splitlines()[-1] == "OK 6"  # 2 layers + 1 MTP block, 2 ranks each


def test_targets_table_says_what_runs_here():
    rows = {r.name: r for r in list_targets()}
    for t, _ in CPU_TARGETS:
        assert rows[t].available_here is True and rows[t].kernel_name == t
    assert rows["sm100_nvfp4_nvfp4_bf16_cutedsl"].vllm_moe_backend == "flashinfer_moe_ep_mega_cutedsl"
    assert rows["sm100_nvfp4_nvfp4_bf16_cutedsl"].needs_nvshmem is True
    assert rows["sm100_fp8_fp4_bf16_deepgemm"].vllm_moe_backend == "flashinfer_moe_ep_mega_deep_gemm"
    assert rows["sm100_fp8_fp4_bf16_deepgemm"].needs_nvshmem is False
    import importlib.util
    if importlib.util.find_spec("deep_gemm") is None:
        assert rows["sm100_fp8_fp4_bf16_deepgemm"].why == "needs the 'deep_gemm' package (not installed)"


@pytest.mark.parametrize("gpu, want", [
    ("9.0", (False, "preprocessing needs compute capability 10.0 or 10.3 (this GPU is 9.0)")),
    ("10.0", (True, "yes")),
])
def test_targets_table_says_which_gpu_a_preprocessing_needs(monkeypatch, gpu, want):
    """On a GPU, a target whose FlashInfer preprocessing runs on some compute capabilities only is available on
    those only (its conversion refuses the others up front)."""
    from fimoe_convert.targets import get_kernel, rules

    monkeypatch.setattr(rules, "cuda_visible", lambda: True)
    monkeypatch.setattr(rules, "device_capability", lambda: gpu)
    assert rules.availability(get_kernel("sm100_nvfp4_nvfp4_bf16_cutedsl")) == want


@pytest.mark.parametrize("target, opts, match", [
    ("sm100_nvfp4_nvfp4_bf16_cutedsl", {"device": "cpu"},
     r"--device cpu: --target sm100_nvfp4_nvfp4_bf16_cutedsl preprocesses on a CUDA device only"),
    ("sm90_fp8_mxfp4_bf16_pull_cutedsl", {"device": "cpu"}, r"--device cpu: .* preprocesses on a CUDA device only"),
    ("flashinfer_moe_ep_mega_cutedsl", {"device": "cpu", "arch": "9.0"},
     r"--arch 9\.0: --target sm100_nvfp4_nvfp4_bf16_cutedsl runs on compute capability 10\.0 or 10\.3"),
    ("sm90_fp8_fp8_bf16_pull_cutedsl", {"params": {"fp8_scale_mode": "rowwise"}},
     r"--param fp8_scale_mode=rowwise: expected one of per_tensor, blockwise"),
    ("sm107_mxfp8_mxfp4_bf16_cutedsl", {"params": {"x": "1"}},
     r"--param x=1: sm107_mxfp8_mxfp4_bf16_cutedsl takes no parameters"),
    ("sm107_mxfp8_mxfp4_bf16_cutedsl", {"ep_size": 3}, r"--ep-size 3: must divide the 8 routed experts"),
])
def test_validation_names_the_flag(tiny_ckpt, tmp_path, target, opts, match):
    with pytest.raises(ValidationError, match=match):
        convert(str(tiny_ckpt), str(tmp_path / "out"), target, **opts)


def test_alias_resolves_and_all_problems_at_once(tiny_ckpt, tmp_path):
    """The flags' problems together, before SRC is opened (the alias resolved in each); SRC's (an --ep-size that does
    not divide its experts) together once it is."""
    with pytest.raises(ValidationError, match=r"^2 problems:\n  - --param nope=1: sm100_fp8_fp4_bf16_deepgemm takes "
                       r"no parameters\n  - --arch 9\.0: --target sm100_fp8_fp4_bf16_deepgemm runs on compute "
                       r"capability 10\.0 or 10\.3"):
        convert(str(tiny_ckpt), str(tmp_path / "out"), "deep_gemm_mega", ep_size=3, arch="9.0", params={"nope": "1"})
    with pytest.raises(ValidationError) as e:
        convert(str(tiny_ckpt), str(tmp_path / "out"), "deep_gemm_mega", ep_size=3, arch="10.0")
    assert "--ep-size 3" in str(e.value) and "sm100_fp8_fp4_bf16_deepgemm" in str(e.value)


def test_deepgemm_is_refused_up_front_naming_the_package_and_the_gpu(tiny_ckpt, tmp_path):
    """Before any tensor is read, not as a ModuleNotFoundError traceback: DeepGEMM is missing here, and its
    preprocessing needs an SM100 GPU (it refuses SM90 and has no CPU path)."""
    import importlib.util
    if importlib.util.find_spec("deep_gemm") is not None:
        pytest.skip("deep_gemm installed")
    with pytest.raises(
        ValidationError,
        match=r"(?s)^2 problems:.*--device cpu: --target sm100_fp8_fp4_bf16_deepgemm "
        r"preprocesses on a CUDA device only.*Python package 'deep_gemm' "
        r"\(needed by --target sm100_fp8_fp4_bf16_deepgemm\): not installed here",
    ):
        convert(str(tiny_ckpt), str(tmp_path / "out"), "sm100_fp8_fp4_bf16_deepgemm")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
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
    k, n = TINY.hidden // 2, 2 * TINY.inter  # FP4 pairs of the hidden dimension; gate and up rows
    assert fc1_w["shape"] == [4, k, n] and fc1_w["stride"] == [k * n, 1, k]  # K-major view kept



CHUNKED = [(t, p) for t, p in CPU_TARGETS if t not in ("sm120_mxfp4_mxfp8_bf16_cake",)]


@pytest.mark.slow
@pytest.mark.parametrize("target, params", CHUNKED, ids=[f"{t}{'-' + p[0] if p else ''}" for t, p in CHUNKED])
def test_expert_chunks_give_the_bytes_of_whole_blocks(kernel_ckpt, tmp_path, target, params):
    """Where the kernel table says a layout splits by expert, units of one expert (--max-memory 2MiB) write the
    same folder as units of whole ranks (each conversion in its own process: FlashInfer's SM90 and SM100 trees)."""
    flags = [a for p in params for a in ("--param", p)]
    outs = {}
    for memory in ("2MiB", "8GiB"):
        out = tmp_path / memory
        r = subprocess.run([sys.executable, "-m", "fimoe_convert", str(kernel_ckpt), str(out), "--target", target,
                            "--ep-size", "2", "--max-memory", memory, "--shard-size", "200KB", "-q", *flags],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        outs[memory] = {p.name: p.read_bytes() for p in out.iterdir()}
    assert outs["2MiB"] == outs["8GiB"]


# A FlashInfer whose per-tensor activation scale (an expert-invariant leaf) changes from one call to the next.
DRIFTING_INVARIANT = """
import sys
from fimoe_convert import convert
from fimoe_convert.targets.moe_ep import MoeEpTarget

real, calls = MoeEpTarget.preprocess, []

def preprocess(self, model, pack, n):
    (fc1, fc2), _ = real(self, model, pack, n), calls.append(n)
    return (fc1[0], fc1[1], fc1[2] * len(calls), fc1[3]), fc2

MoeEpTarget.preprocess = preprocess
convert(sys.argv[1], sys.argv[2], "sm90_fp8_fp8_bf16_pull_cutedsl", max_memory="2MiB")
"""


@pytest.mark.slow
def test_chunks_whose_invariant_leaves_differ_are_refused(kernel_ckpt, tmp_path):
    """The first chunk of a rank writes an expert-invariant leaf; a later chunk that gives other bytes stops the
    run naming the chunk and the leaf (the layout would then not split by expert)."""
    r = subprocess.run([sys.executable, "-c", DRIFTING_INVARIANT, str(kernel_ckpt), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert re.search(r"AssertionError: layers\.0\.ffn\.experts\.ep0\.\d+-\d+: layers\.0\.ffn\.experts\.ep0\.fc1\.2 "
                     r"differs between chunks of the rank's experts; sm90_fp8_fp8_bf16_pull_cutedsl does not split by "
                     r"expert", r.stderr), r.stderr[-3000:]


@pytest.mark.parametrize("target, params, chunks", [
    ("sm100_mxfp8_mxfp4_bf16_cutedsl", {}, True),
    ("sm90_fp8_fp8_bf16_pull_cutedsl", {"fp8_scale_mode": "blockwise"}, True),
    ("sm90_fp8_fp8_bf16_pull_cutedsl", {}, True),  # per_tensor: a scale per expert, activation scales invariant
    ("sm120_mxfp4_mxfp8_bf16_cake", {}, False),  # a part of each leg's scales does not grow with the experts
])
def test_which_layouts_split_by_expert(target, params, chunks):
    from fimoe_convert.checkpoint import model_spec_from_config
    from fimoe_convert.targets import TargetOptions, get_kernel, make_target

    model = model_spec_from_config({"model_type": "deepseek_v4", "expert_dtype": "fp4", "hidden_size": 256,
                                    "moe_intermediate_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
                                    "num_hidden_layers": 1})
    assert make_target(get_kernel(target), model, TargetOptions(params=params)).chunks() is chunks


def test_a_unit_too_big_for_memory_is_refused_with_the_ep_size_that_fits(kernel_ckpt, tmp_path):
    # 600KB: below the unit at --ep-size 2 (1.04 MB), above the one at --ep-size 4, the smallest --ep-size that fits
    with pytest.raises(ValidationError, match=r"^--max-memory 600KB: one unit of work \(layers\.0\.ffn\.experts\.ep0\) "
                                              r"needs about 2\.08 MB \(its output and its inputs\); raise --max-memory "
                                              r"to at least 2\.08 MB, or use --ep-size 4 \(about 519\.17 kB a unit\)$"):
        convert(str(kernel_ckpt), str(tmp_path / "out"), "sm120_mxfp4_mxfp8_bf16_cake", max_memory="600KB")
