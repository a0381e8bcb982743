import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from reference import HUB_COMMIT, HUB_REPO  # noqa: E402

from fimoe_convert.testing import make_checkpoint, seed_hub_cache  # noqa: E402


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    """The tiny preset: read-only for tests (copy it before damaging it)."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", "tiny")


@pytest.fixture
def tiny_copy(tiny_ckpt, tmp_path) -> Path:
    """A private copy of the tiny checkpoint that a test may damage."""
    dst = tmp_path / "src"
    shutil.copytree(tiny_ckpt, dst)
    return dst


@pytest.fixture(scope="session")
def bf16_out_of(tiny_ckpt, tmp_path_factory):
    """`bf16_out_of(shard_size)`: a finished bf16 OUT of the tiny checkpoint, made once per shard size (read-only
    for tests: copy it before damaging it)."""
    from fimoe_convert import convert

    made: dict[str, Path] = {}

    def get(shard_size: str) -> Path:
        if shard_size not in made:
            made[shard_size] = tmp_path_factory.mktemp("bf16") / "out"
            convert(str(tiny_ckpt), str(made[shard_size]), "bf16", shard_size=shard_size)
        return made[shard_size]

    return get


@pytest.fixture
def hub_cache(tiny_ckpt, tmp_path, monkeypatch) -> Path:
    """The tiny checkpoint as HUB_REPO@HUB_COMMIT in a Hugging Face cache, resolved offline."""
    cache = tmp_path / "hub"
    seed_hub_cache(tiny_ckpt, cache, HUB_REPO, HUB_COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def signal_handlers():
    """For a test that stops a command in this process with a real signal: Python's own handlers while it runs (a
    test run started in the background, `pytest &`, ignores SIGINT, and a command keeps ignored signals ignored),
    and this process's handlers put back after it (a stop leaves them ignored)."""
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {s: signal.getsignal(s) for s in stops}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in stops[1:]:
        signal.signal(s, signal.SIG_DFL)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (the GPU tests run on an H200)")
    for item in items:
        if item.get_closest_marker("gpu"):  # not `in item.keywords`: that also matches a folder named gpu
            item.add_marker(skip)
