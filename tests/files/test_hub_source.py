"""SRC as a Hub repo id, resolved by the real huggingface_hub code from a pre-seeded cache, offline."""

import json

import pytest
from reference import HUB_COMMIT as COMMIT, HUB_REPO as REPO

from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError, ValidationError


def test_hub_repo_converts_offline_and_pins_revision(hub_cache, tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    convert(REPO, str(out), "bf16", offline=True)
    m = json.loads((out / "fimoe-manifest.json").read_text())
    assert m["source"]["repo_id"] == REPO and m["source"]["revision"] == COMMIT
    # Hub blobs are named by their sha256: recorded without re-hashing, and right.
    import hashlib
    for name, rec in m["source"]["files"].items():
        assert rec["sha256"] == hashlib.sha256((tiny_ckpt / name).read_bytes()).hexdigest()
    assert verify(str(out)).problems == []
    card = (out / "README.md").read_text()
    assert f"base_model: {REPO}" in card and COMMIT in card


def test_output_matches_local_folder_conversion(hub_cache, tiny_ckpt, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    convert(REPO, str(a), "bf16", offline=True)
    convert(str(tiny_ckpt), str(b), "bf16")
    shards = sorted(p.name for p in a.glob("*.safetensors"))
    assert shards and all((a / s).read_bytes() == (b / s).read_bytes() for s in shards)


def test_repo_missing_from_cache(hub_cache, tmp_path):
    with pytest.raises(
        InputError, match=r"SRC 'deepseek-ai/Nope' \(revision main\): not in the local Hugging Face cache"
    ):
        convert("deepseek-ai/Nope", str(tmp_path / "out"), offline=True)


def test_incomplete_snapshot(hub_cache, tmp_path):
    snap = next(hub_cache.glob("models--*/snapshots/*"))
    (snap / "model-00003-of-00004.safetensors").unlink()
    with pytest.raises(ValidationError, match=r"names shard 'model-00003-of-00004\.safetensors', which does not exist; "
                                         r"the Hub snapshot is incomplete"):
        convert(REPO, str(tmp_path / "out"), offline=True)


def test_local_dir_download_hashes_are_taken_from_its_metadata_unless_the_file_changed(
    tiny_ckpt, tmp_path, monkeypatch
):
    """A folder from `hf download --local-dir` records each LFS file's sha256; the manifest takes it instead of
    reading the file again, unless the file changed after the download (or the etag is not a sha256)."""
    import hashlib
    import os
    import shutil
    import time

    from huggingface_hub._local_folder import write_download_metadata

    import fimoe_convert.files.sources.local as source_mod

    src = tmp_path / "src"
    shutil.copytree(tiny_ckpt, src)
    real = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir() if p.is_file()}
    shards = sorted(n for n in real if n.endswith(".safetensors"))
    for name in shards:
        write_download_metadata(src, name, COMMIT, real[name])  # huggingface_hub's own writer
    write_download_metadata(src, "config.json", COMMIT, "0" * 40)  # a small file: git sha1 etag, not a sha256
    hashed = []
    monkeypatch.setattr(source_mod, "sha256_file", lambda p: hashed.append(p.name) or real[p.name])
    changed = shards[1]
    stamp = time.time() + 5  # modified after the download
    os.utime(src / changed, (stamp, stamp))
    before = {p: p.stat().st_mtime_ns for p in src.rglob("*")}
    convert(str(src), str(tmp_path / "out"), "bf16")
    assert {p: p.stat().st_mtime_ns for p in src.rglob("*")} == before  # SRC is only read: no lock, no cleanup
    m = json.loads((tmp_path / "out" / "fimoe-manifest.json").read_text())
    assert {k: v["sha256"] for k, v in m["source"]["files"].items()} == {k: real[k] for k in m["source"]["files"]}
    assert sorted(hashed) == sorted(["config.json", changed, *(n for n in m["source"]["files"] if n not in shards
                                                               and n != "config.json")])
