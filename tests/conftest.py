import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fimoe_convert.testing import make_checkpoint, seed_hub_cache  # noqa: E402
from reference import HUB_COMMIT, HUB_REPO  # noqa: E402


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


@pytest.fixture
def hub_cache(tiny_ckpt, tmp_path, monkeypatch) -> Path:
    """The tiny checkpoint as HUB_REPO@HUB_COMMIT in a Hugging Face cache, resolved offline."""
    cache = tmp_path / "hub"
    seed_hub_cache(tiny_ckpt, cache, HUB_REPO, HUB_COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the lent H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
