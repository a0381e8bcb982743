"""SRC as a Hub repo id, resolved by the real huggingface_hub code from a pre-seeded cache, offline."""

import json

import pytest

from fimoe_convert.convert import convert, verify
from fimoe_convert.errors import InputError, ValidationError
from seed import HUB_COMMIT as COMMIT, HUB_REPO as REPO



def test_hub_repo_converts_offline_and_pins_revision(hub_cache, tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    convert(REPO, str(out), "bf16", offline=True)
    m = json.loads((out / "fimoe-manifest.json").read_text())
    assert m["source"]["repo_id"] == REPO and m["source"]["revision"] == COMMIT
    # Hub blobs are named by their sha256: recorded without re-hashing, and right.
    import hashlib
    for name, rec in m["source"]["files"].items():
        assert rec["sha256"] == hashlib.sha256((tiny_ckpt / name).read_bytes()).hexdigest()
    assert verify(str(out))["problems"] == []
    card = (out / "README.md").read_text()
    assert f"base_model: {REPO}" in card and COMMIT in card


def test_output_matches_local_folder_conversion(hub_cache, tiny_ckpt, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    convert(REPO, str(a), "bf16", offline=True)
    convert(str(tiny_ckpt), str(b), "bf16")
    shards = sorted(p.name for p in a.glob("*.safetensors"))
    assert shards and all((a / s).read_bytes() == (b / s).read_bytes() for s in shards)


def test_repo_missing_from_cache(hub_cache, tmp_path):
    with pytest.raises(InputError, match=r"SRC 'deepseek-ai/Nope' \(revision main\): not in the local Hugging Face cache"):
        convert("deepseek-ai/Nope", str(tmp_path / "out"), offline=True)


def test_incomplete_snapshot(hub_cache, tmp_path):
    snap = next(hub_cache.glob("models--*/snapshots/*"))
    (snap / "model-00003-of-00004.safetensors").unlink()
    with pytest.raises(ValidationError, match=r"names shard 'model-00003-of-00004\.safetensors', which does not exist; "
                                         r"the Hub snapshot is incomplete"):
        convert(REPO, str(tmp_path / "out"), offline=True)
