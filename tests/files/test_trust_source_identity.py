"""The inputs' identity: --resume and verify --deep catch an input rewritten in place with its size and mtime
kept, and input hashes are recorded in batches, a kill before they are written costing nothing but a re-hash."""

import json
import os
import shutil
from pathlib import Path

import pytest
from test_reliability import cli, refused
from test_trust import edit_json, interrupted_run

from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError
from fimoe_convert.files.names import MANIFEST_NAME

# ----------------------------------------------------------- 1. --resume and an input rewritten in place


def _rewrite_in_place(path: Path, chmod_only: bool = False) -> None:
    """Other bytes of the same size in the same inode, mtime set back (what `cp -p` of a same-size copy does)."""
    st = path.stat()
    if chmod_only:
        os.chmod(path, st.st_mode)  # changes nothing but ctime
    elif path.suffix == ".json":  # still valid JSON of the same size: one space becomes a tab
        data = path.read_bytes()
        assert b": " in data
        path.write_bytes(data.replace(b": ", b":\t", 1))
    else:
        with open(path, "r+b") as f:
            f.seek(st.st_size - 64)
            tail = f.read(64)
            f.seek(st.st_size - 64)
            f.write(bytes(b ^ 0x5A for b in tail))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


RESUMES = [  # (input, bytes changed, sha256 recorded, ctime in the manifest, refusal or None)
    ("model-00001-of-00004.safetensors", True, False, True, r"changed since .* \(written or its attributes changed"),
    ("config.json", True, False, True, r"changed since .* no sha256 was recorded"),
    ("model-00002-of-00004.safetensors", True, True, True, r"sha256 [0-9a-f]{16}\.\.\. differs from the"),
    ("model-00002-of-00004.safetensors", False, True, True, None),  # only ctime moved, bytes the same: kept
    ("model-00002-of-00004.safetensors", False, False, True, r"written or its attributes changed"),
    ("model-00003-of-00004.safetensors", False, False, False, r"its change time \(ctime\) was not recorded"),
    ("model-00003-of-00004.safetensors", False, True, False, None),  # an older manifest: hashed, and it matches
]


@pytest.mark.parametrize("rel, changed, hashed, ctime, refusal", RESUMES)
def test_resume_catches_an_input_rewritten_with_size_and_mtime_kept(tiny_copy, tmp_path, rel, changed, hashed, ctime,
                                                                    refusal):
    out = tmp_path / "out"
    interrupted_run(tiny_copy, out, hashed=True)

    def forget(m):
        rec = m["source"]["files"][rel]
        if not hashed:
            rec["sha256"] = None
        if not ctime:
            for r in m["source"]["files"].values():
                r.pop("ctime_ns")
    edit_json(out / MANIFEST_NAME, forget)
    _rewrite_in_place(tiny_copy / rel, chmod_only=not changed)
    r = cli(tiny_copy, out, "--shard-size", "1MB", "--resume", "-q")
    if refusal is None:
        assert r.exit_code == 0, r.output
        assert cli("verify", out).exit_code == 0
    else:
        refused(r, rf"^error: --resume: {tiny_copy / rel}: .*{refusal}.*run with --overwrite in place of --resume")
        assert json.loads((out / MANIFEST_NAME).read_text())["complete"] is False


# ------------------------------------------------------------ 2. verify --deep blames a changed source


@pytest.mark.parametrize("rel", ["model-00001-of-00004.safetensors", "model-00004-of-00004.safetensors", "config.json",
                                 None])
def test_verify_deep_blames_a_source_rewritten_in_place(tiny_copy, tmp_path, rel):
    out = tmp_path / "out"
    convert(str(tiny_copy), str(out), "bf16", shard_size="1MB")
    if rel is None:
        assert verify(str(out), deep=True, src=str(tiny_copy)).problems == []
        return
    _rewrite_in_place(tiny_copy / rel)
    with pytest.raises(
        InputError,
        match=rf"^--src {tiny_copy}: is not the checkpoint {out} was converted from "
        rf"\({rel.replace('.', chr(92) + '.')}: \d+ bytes, sha256 [0-9a-f]{{16}}; the "
        r"output was converted from \d+ bytes, sha256 [0-9a-f]{16}\); pass the original",
    ):
        verify(str(out), deep=True, src=str(tiny_copy))
    refused(cli("verify", out, "--deep", "--src", tiny_copy), r"is not the checkpoint .* pass the original with --src")


# ------------------------------------------------------------- 3. input hashes are recorded in batches


@pytest.fixture
def many_inputs(tiny_ckpt, tmp_path) -> Path:
    """The tiny checkpoint with 300 small extra files: 309 inputs, each hashed and recorded."""

    src = tmp_path / "src"
    shutil.copytree(tiny_ckpt, src)
    for i in range(300):
        (src / f"extra_{i:03d}.txt").write_text(f"extra file {i}\n")
    return src


@pytest.mark.slow
@pytest.mark.parametrize("defer_s, most_writes", [
    (5.0, 10),  # the default: the first manifest, one per shard (4), the last hash; not one per input
    (0.0, 300),  # no batching: a write per input, as the count catches
])
def test_input_hashes_are_recorded_in_batches(many_inputs, tmp_path, monkeypatch, defer_s, most_writes):
    from fimoe_convert import convert
    from fimoe_convert.files import hashing
    from fimoe_convert.files.output import manifest as manifest_mod
    from fimoe_convert.files.output.manifest import LiveManifest, read_manifest

    monkeypatch.setattr(LiveManifest, "DEFER_S", defer_s)
    writes = []
    real = manifest_mod.write_manifest
    monkeypatch.setattr(manifest_mod, "write_manifest", lambda *a: writes.append(1) or real(*a))
    out = tmp_path / "out"
    convert(str(many_inputs), str(out), "bf16")
    if defer_s:
        assert len(writes) <= most_writes, len(writes)
    else:
        assert len(writes) > most_writes, len(writes)
    recorded = read_manifest(out).source.files
    assert len(recorded) == 309 and all(r.sha256 == hashing.sha256_file(many_inputs / k) for k, r in recorded.items())


@pytest.mark.slow
@pytest.mark.parametrize("at", [0.05, 0.5, 0.9])
def test_a_kill_with_hashes_not_yet_recorded_resumes_correctly(many_inputs, tmp_path, monkeypatch, at):
    """Hashes deferred for an hour: the interrupted manifest records only hashes of the bytes on disk (or none), and
    --resume of it gives the same folder as one uninterrupted run."""
    from test_trust import interrupted_run

    from fimoe_convert import convert
    from fimoe_convert.files import hashing
    from fimoe_convert.files.names import MANIFEST_NAME
    from fimoe_convert.files.output.manifest import LiveManifest

    monkeypatch.setattr(LiveManifest, "DEFER_S", 3600.0)
    out, ref = tmp_path / "out", tmp_path / "ref"
    interrupted_run(many_inputs, out, at=at, hashed=False)
    files = json.loads((out / MANIFEST_NAME).read_text())["source"]["files"]
    recorded = {k: r["sha256"] for k, r in files.items() if r["sha256"]}
    assert recorded == {k: hashing.sha256_file(many_inputs / k) for k in recorded}
    convert(str(many_inputs), str(out), "bf16", shard_size="1MB", resume=True)
    convert(str(many_inputs), str(ref), "bf16", shard_size="1MB")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in ref.iterdir()}
