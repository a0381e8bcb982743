"""The typed manifest (records.py, read and written by files/output/manifest.py): what is read is what was written,
byte for byte; optional fields stay optional; every field the code relies on is checked, naming the file and the
field; a key a record does not have is refused."""

from __future__ import annotations

import copy
import json

import pytest

from fimoe_convert import convert
from fimoe_convert.errors import InputError
from fimoe_convert.files.output.manifest import MANIFEST_NAME, dumps, read_manifest, read_rank_status, write_rank_status
from fimoe_convert.records import FileRecord, Manifest, TargetReport, WindowReport


@pytest.fixture(scope="module")
def written(tiny_ckpt, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("manifest") / "out"
    convert(str(tiny_ckpt), str(out), "fp8_block", ep_size=2)
    return json.loads((out / MANIFEST_NAME).read_bytes())


def test_a_written_manifest_reads_back_to_the_same_bytes(written):
    m = Manifest.from_json(copy.deepcopy(written), "m.json")
    assert dumps(m.to_json()) == dumps(written)
    assert m.complete is True and m.ep_size == 2 and m.ep.expert_ranges == ((0, 4), (4, 8))
    assert m.target.name == "fp8_block" and m.target.kernel_name is None and m.report.fp8_block.tensors > 0


@pytest.mark.parametrize("drop, attr, default", [("complete", "complete", None), ("report", "report", None)])
def test_optional_fields_stay_out_when_absent(written, drop, attr, default):
    data = copy.deepcopy(written)
    del data[drop]
    m = Manifest.from_json(data, "m.json")
    assert getattr(m, attr) is default and drop not in m.to_json()


def test_identity_fields_of_a_source_file_are_written_only_while_known():
    assert FileRecord(3, None, mtime_ns=7, inode=8, dev=9).to_json() == {"size": 3, "sha256": None, "mtime_ns": 7,
                                                                          "inode": 8, "dev": 9}
    assert FileRecord(3, "a" * 64).to_json() == {"size": 3, "sha256": "a" * 64}
    assert FileRecord(1, "b" * 64).to_json() == {"size": 1, "sha256": "b" * 64}
    report = TargetReport(mxfp4_window=WindowReport(groups=2))
    assert FileRecord(1, "b" * 64, report).to_json() == {"size": 1, "sha256": "b" * 64, "report": {"mxfp4_window": {
        "groups": 2, "clamped_groups": 0, "lossy_experts": 0, "worst_rel_l2": 0.0}}}


@pytest.mark.parametrize("change, match", [
    (lambda m: m["tool"].pop("version"), r"^m\.json: tool\.version is missing; expected a string; fix it$"),
    (lambda m: m["model"].update(hidden_size="256"), r"model\.hidden_size is '256'; expected an integer >= 0"),
    (lambda m: m["target"].update(capabilities=[9]), r"target\.capabilities\[0\] is 9; expected a string"),
    (lambda m: m["target"].update(needs_nvshmem=1), r"target\.needs_nvshmem is 1; expected true or false"),
    (lambda m: m["ep"].update(expert_ranges=[[0, "4"]]), r"ep\.expert_ranges\[0\]\[1\] is '4'; expected an integer"),
    (lambda m: m["source"]["files"]["config.json"].update(sha256="x"),
     r"source\.files\['config\.json'\]\.sha256 is 'x'; expected a sha256 \(64 hex digits\) or null"),
    (lambda m: m["files"]["README.md"].update(report=[]), r"files\['README\.md'\]\.report is a list \(0 items\); "
                                                          r"expected an object"),
    (lambda m: m.update(report=3), r"^m\.json: report is 3; expected an object; fix it$"),
    (lambda m: m["report"]["fp8_block"].update(tiles=-1), r"^m\.json: report\.fp8_block\.tiles is -1; expected an "
                                                         r"integer >= 0; fix it$"),
    (lambda m: m["report"]["fp8_block"].update(worst_abs_err="0"), r"report\.fp8_block\.worst_abs_err is '0'; "
                                                                  r"expected a number"),
    (lambda m: m["report"].update(other={}), r"report\.other is an object \(0 keys\), a key it does not have; "
                                             r"expected only fp8_block, mxfp4_window"),
    (lambda m: m["layers"]["layers.0"].update(scale_dtype=5), r"layers\['layers\.0'\]\.scale_dtype is 5; expected "
                                                             r"a string"),
    (lambda m: m["layers"].update(x=[]), r"layers\.x is a list \(0 items\); expected an object with the keys "
                                         r"format, tensors, experts or an object"),
    (lambda m: m.update(complete=None), r"^m\.json: complete is None; expected true or false; fix it$"),
    (lambda m: m["files"]["README.md"].update(sha256=None),
     r"files\['README\.md'\]\.sha256 is None; expected a sha256 \(64 hex digits\); fix it$"),
    (lambda m: m["status"].update(x="done"), r"status\.x is 'done'; expected one of 'pending', 'written'"),
    (lambda m: m["tool"].update(extra=1), r"^m\.json: tool\.extra is 1, a key it does not have; expected only "
                                          r"name, version, torch, safetensors, flashinfer; fix it$"),
    (lambda m: m.update(notes="x"), r"^m\.json: notes is 'x', a key it does not have; expected only schema, tool, "),
])
def test_a_field_of_the_wrong_type_is_named(written, change, match):
    data = copy.deepcopy(written)
    change(data)
    with pytest.raises(InputError, match=match):
        Manifest.from_json(data, "m.json", "fix it")


def test_rank_status_files_hold_file_records_and_a_damaged_one_is_skipped(tmp_path):
    report = TargetReport(mxfp4_window=WindowReport(groups=1))
    write_rank_status(tmp_path, 0, {"a.safetensors": FileRecord(5, "c" * 64, report)})
    (tmp_path / "fimoe-status.rank1.json").write_text('{"rank": 1, "files": {"b.safetensors": {"size": -1}}}')
    assert read_rank_status(tmp_path) == {"a.safetensors": FileRecord(5, "c" * 64, report)}


def test_read_manifest_remembers_its_folder(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    convert(str(tiny_ckpt), str(out), "bf16")
    m = read_manifest(out, require_complete=True)
    assert m.out_dir == out and dumps(m.to_json()) == (out / MANIFEST_NAME).read_bytes()
    with pytest.raises(InputError, match=r"no MoE block 'layers\.9' in this output"):
        m.layer_record("layers.9", 0)
