"""On a GPU, conversion with --device cuda writes exactly the folder --device cpu writes (run on the
lent H200; skipped without CUDA)."""

import pytest

from fimoe_convert import convert
from fimoe_convert.testing import make_checkpoint

pytestmark = pytest.mark.gpu


def folder(p):
    return {f.name: f.read_bytes() for f in sorted(p.iterdir())}


@pytest.mark.parametrize("target", ["bf16", "fp8_block", "megamoe_sm90_mxfp4"])
def test_cuda_output_equals_cpu_output(tmp_path, target):
    if target.startswith("megamoe"):
        pytest.importorskip("flashinfer.megamoe")
    src = make_checkpoint(tmp_path / "src", "tiny")
    a, b = tmp_path / "cpu", tmp_path / "cuda"
    convert(str(src), str(a), target, device="cpu", arch="9.0", ep_size=2, shard_size="1MB")
    convert(str(src), str(b), target, device="cuda", arch="9.0", ep_size=2, shard_size="1MB")
    assert folder(a) == folder(b)


def test_runtime_load_to_cuda_equals_cpu(tmp_path):
    """The runtime's parallel read into pinned memory, each chunk copied on to the GPU: same objects as on CPU."""
    pytest.importorskip("flashinfer.megamoe")
    from fimoe_convert.numerics.structure import same_object
    from fimoe_convert.runtime import load_megamoe_weights

    src = make_checkpoint(tmp_path / "src", "tiny")
    out = tmp_path / "out"
    convert(str(src), str(out), "megamoe_sm90_mxfp4", device="cuda", arch="9.0", ep_size=2, shard_size="1MB")
    for layer in ("layers.0", "mtp.0"):
        for rank in (0, 1):
            got = load_megamoe_weights(out, layer, rank, "cuda")
            assert all(t.device.type == "cuda" for t in got)
            assert same_object(got, load_megamoe_weights(out, layer, rank, "cpu"))
