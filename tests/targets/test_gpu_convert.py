"""On a GPU, conversion with --device cuda writes exactly the folder --device cpu writes, with the outputs waiting
on the device for the writer (copied straight into its pinned buffers) and in pinned host memory (a budget too
big for the device). A target that FlashInfer requantizes from BF16 is FlashInfer's arithmetic on the device it
runs on (its CUDA output is compared with FlashInfer's CUDA call by tests/targets/test_targets_moe_ep.py run on the
GPU): the two ways of holding outputs must give the same folder. Run on an H200; skipped without CUDA."""

import subprocess
import sys

import pytest

from fimoe_convert.budget import MemoryBudget
from fimoe_convert.sizes import parse_size
from fimoe_convert.testing import make_checkpoint

pytestmark = pytest.mark.gpu

CASES = [("bf16", []), ("fp8_block", []), ("megamoe_sm90_mxfp4", []), ("sm90_fp8_fp8_bf16_pull_cutedsl", []),
         ("sm90_fp8_fp8_bf16_pull_cutedsl", ["--param", "fp8_scale_mode=blockwise"])]
ON_DEVICE, ON_HOST = "8GiB", "100GiB"  # --max-memory: within half an H200's memory; more than half of it
OTHER = {ON_DEVICE: ON_HOST, ON_HOST: ON_DEVICE}


def folder(p):
    return {f.name: f.read_bytes() for f in sorted(p.iterdir())}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("g") / "src", "tiny", layers=2, hash_layers=1, mtp=1,
                           extreme_scales=False)


def cli(src, out, target, flags, device, max_memory):
    """One conversion in a process of its own (FlashInfer's SM90 trees are imported once per process)."""
    r = subprocess.run([sys.executable, "-m", "fimoe_convert", str(src), str(out), "--target", target, "--device",
                        device, "--arch", "9.0", "--ep-size", "2", "--shard-size", "1MB", "--max-memory", max_memory,
                        "-q", *flags], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("max_memory", [ON_DEVICE, ON_HOST])
@pytest.mark.parametrize("target, flags", CASES, ids=[t + "".join(f[1:]) for t, f in CASES])
def test_cuda_output_equals_cpu_output(src, tmp_path, target, flags, max_memory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if target not in ("bf16", "fp8_block"):
        pytest.importorskip("flashinfer.megamoe" if target.startswith("megamoe") else "flashinfer.moe_ep")
    device_bytes = torch.cuda.get_device_properties(0).total_memory
    fits = MemoryBudget(parse_size(max_memory, "--max-memory")).fits_device(device_bytes)
    assert fits is (max_memory == ON_DEVICE), f"{device_bytes} bytes of device memory: pick other budgets"
    ours = not target.startswith("sm90_fp8_fp8")  # our numerics, or FlashInfer's exact repacking
    cli(src, tmp_path / "ref", target, flags, "cpu" if ours else "cuda", max_memory if ours else OTHER[max_memory])
    cli(src, tmp_path / "cuda", target, flags, "cuda", max_memory)
    assert folder(tmp_path / "ref") == folder(tmp_path / "cuda")


def test_runtime_load_to_cuda_equals_cpu(src, tmp_path):
    """The runtime's parallel read into pinned memory, each chunk copied on to the GPU: same objects as on CPU."""
    pytest.importorskip("flashinfer.megamoe")
    from fimoe_convert.numerics.structure import same_object
    from fimoe_convert.runtime import load_megamoe_weights

    out = tmp_path / "out"
    cli(src, out, "megamoe_sm90_mxfp4", [], "cuda", ON_DEVICE)
    for layer in ("layers.0", "mtp.0"):
        for rank in (0, 1):
            got = load_megamoe_weights(out, layer, rank, "cuda")
            assert all(t.device.type == "cuda" for t in got)
            assert same_object(got, load_megamoe_weights(out, layer, rank, "cpu"))
