"""Trust boundary, fourth pass: what verify passes, the loader loads, and what the loader refuses, verify refuses;
a structure that names one tensor over and over; shard headers and manifests edited consistently."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import fimoe_convert.runtime.loader as loader
from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError

MEGAMOE = "megamoe_sm90_mxfp4"


@pytest.fixture(scope="module")
def mega_out(tiny_ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mega") / "out"
    convert(str(tiny_ckpt), str(out), MEGAMOE)
    return out


@pytest.fixture
def mega(mega_out, tmp_path) -> Path:
    return Path(shutil.copytree(mega_out, tmp_path / "out"))


def edit_manifest(out: Path, edit) -> None:
    path = out / "fimoe-manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def first_block(data: dict) -> dict:
    return data["layers"]["layers.0"]["0"]


def test_the_loader_reads_each_tensor_once_however_often_it_is_named(mega, monkeypatch):
    edit_manifest(mega, lambda d: first_block(d)["structure"]["tuple"].append(first_block(d)["structure"]["tuple"][0]))
    assert verify(str(mega))["problems"] == []
    read = []
    real = loader.read_output_tensors
    monkeypatch.setattr(loader, "read_output_tensors", lambda out, names, device="cpu": (read.extend(names),
                                                                                         real(out, names, device))[1])
    got = loader.load_transformed_weights(mega, "layers.0")
    assert len(got) == 5 and got[4].data_ptr() == got[0].data_ptr()  # one read, one buffer
    assert sorted(read) == sorted(set(read)) and len(read) == 4


def test_a_structure_naming_one_tensor_over_and_over_is_refused_by_verify_and_the_loader(mega, monkeypatch):
    def repeat(d):
        node = first_block(d)["structure"]["tuple"][0]  # 278,528 bytes
        first_block(d)["structure"]["tuple"] = [node] * 30

    edit_manifest(mega, repeat)
    want = (r"block 'layers\.0' rank 0: structure: its tensor nodes come to 8355840 bytes, more than the \d+ tensor "
            r"bytes of the 1 shard\(s\) they name; a tensor is named over and over")
    problems = verify(str(mega))["problems"]
    assert len(problems) == 1 and re.search(want, problems[0]), problems
    monkeypatch.setattr(loader, "read_output_tensors", lambda *a, **k: pytest.fail("read before the check"))
    with pytest.raises(InputError, match=want):
        loader.load_transformed_weights(mega, "layers.0")
