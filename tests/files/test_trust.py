"""Trust boundary: names, sizes and hashes read from SRC and OUT are checked, never trusted.

One section per class of docs/RELIABILITY.md's threat model: the JSON loader, the path rule, source identity
and --resume, folder guards (lock, identity of SRC vs OUT, tool-named files, signals, temporaries), bounds from
what is present, damaged or old manifests, exit codes. Every refusal through the CLI gives its exit code, one
`error:` line matched here, no traceback, and leaves the source untouched."""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_reliability import child_env, refused, run_and_signal

import fimoe_convert.cli as cli_mod
import fimoe_convert.conversion as conv_mod
from fimoe_convert import convert
from fimoe_convert.checkpoint import check_counts, model_spec_from_config
from fimoe_convert.errors import InputError, ValidationError
from fimoe_convert.files import hashing, jsonfile
from fimoe_convert.files.jsonfile import parse_json
from fimoe_convert.files.output import atomic
from fimoe_convert.files.output.folder import read_output_tensors
from fimoe_convert.files.output.lock import LOCK_NAME, OutLock
from fimoe_convert.files.output.manifest import MANIFEST_NAME, read_manifest
from fimoe_convert.files.paths import name_problem
from fimoe_convert.files.safetensors import header as st_header, writer as st_writer
from fimoe_convert.files.sources.local import check_config, index_weight_map, open_source
from fimoe_convert.kernels import KERNELS
from fimoe_convert.records import Count, FileRecord, Record, Sha256, Status, read_record
from fimoe_convert.targets.rules import check_params

ROOT = Path(__file__).resolve().parents[2]
INDEX = "model.safetensors.index.json"
SHARD_SIZE = ("--shard-size", "1MB")  # the tiny checkpoint in 9 output shards


def cli(*args, env=None):
    return CliRunner().invoke(cli_mod.main, [str(a) for a in args], env=env)


def digests(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


class _Stop(KeyboardInterrupt):
    pass


def interrupted_run(src: Path, out: Path, at: float = 0.5, hashed: bool = True, **kw) -> None:
    """A conversion of `src` into `out` stopped (as by Ctrl-C) after `at` of its bytes: an incomplete OUT; with
    `hashed`, once the manifest records the sha256 of every input (hashed beside the conversion)."""

    def all_hashed() -> bool:
        files = json.loads((out / MANIFEST_NAME).read_text())["source"]["files"]
        return all(rec["sha256"] for rec in files.values())

    def stop(done, total):
        if done > total * at:
            deadline = time.monotonic() + 30
            while hashed and not all_hashed() and time.monotonic() < deadline:
                time.sleep(0.01)
            raise _Stop

    with pytest.raises(_Stop):
        convert(str(src), str(out), shard_size="1MB", progress=stop, **kw)
    assert json.loads((out / MANIFEST_NAME).read_text())["complete"] is False


# ------------------------------------------------------------------------------------ 2. one safe JSON loader


@pytest.mark.parametrize("raw, match", [
    (b'{"a": ' + b"9" * 5000 + b"}", r"^f\.json: integer 9{24}\.\.\. is out of range"),
    (b'{"a": 99999999999999999999}', r"integer 99999999999999999999 is out of range"),
    (b"[" * 100_000 + b"]" * 100_000, r"^f\.json: not valid JSON \(RecursionError"),
    (b"[" * 70 + b"]" * 70, r"^f\.json: JSON nested deeper than 64 levels"),
    (b'{"a": 1, "a": 2}', r"key 'a' appears twice in one object"),
    (b'{"a": NaN}', r"NaN is not JSON"),
    (b'{"a": -Infinity}', r"-Infinity is not JSON"),
    (b'{"a": 1e999}', r"number 1e999 is out of range"),
    (b'{"a": "\\ud800"}', r"the string '\\ud800' is not valid Unicode \(a lone surrogate\)"),
    (b'{"\\udfff": 1}', r"is not valid Unicode"),
    (b'\xff\xfe{}', r"^f\.json: not UTF-8 text \(byte 0\)"),
    (b'{"a": }', r"^f\.json: not valid JSON \(Expecting value at line 1 column 7\)"),
    (b"", r"not valid JSON \(Expecting value"),
], ids=["5000-digit-int", "int-over-64-bits", "100000-deep", "65-deep", "duplicate-key", "nan", "infinity",
        "float-overflow", "lone-surrogate", "surrogate-key", "utf16-bom", "truncated", "empty"])
def test_the_json_loader_refuses_with_the_file_named(raw, match):
    with pytest.raises(InputError, match=match) as e:
        parse_json(raw, "f.json", "fix it")
    assert str(e.value).endswith("; fix it") and "\n" not in str(e.value)


def test_the_json_loader_caps_bytes_per_kind_and_reads_no_more(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"a": "' + b"x" * 5000 + b'"}')
    monkeypatch.setitem(jsonfile.MAX_BYTES, "config", 4096)
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: larger than 4096 bytes, the most a config file "
                                         r"may have; redo"):
        jsonfile.read_json(path, "config", fix="redo")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(InputError, match=r"dir\.json: cannot read it \(Is a directory\); expected a JSON file"):
        jsonfile.read_json(tmp_path / "dir.json", "config")
    with pytest.raises(InputError, match=r"nope\.json: not found; run it first$"):
        jsonfile.read_json(tmp_path / "nope.json", "config", missing="run it first")


def _field(key, tp):
    """A reader of one field `key` of type `tp`, through the one strict reader."""
    cls = dataclasses.make_dataclass("Rec", [(key, tp)], bases=(Record,))
    return lambda v: read_record(cls, v, "c.json")


@pytest.mark.parametrize("value, read, match", [
    ({"quantization_config": "fp4"}, lambda v: check_config(v, "c.json"),
     r"^c\.json: quantization_config is 'fp4'; expected an object or null$"),
    ({"architectures": ["A", 3]}, lambda v: check_config(v, "c.json"),
     r"^c\.json: architectures\[1\] is 3; expected a string$"),
    ({"text_config": {"quantization_config": []}}, lambda v: check_config(v, "c.json"),
     r"^c\.json: text_config\.quantization_config is a list \(0 items\); expected an object or null$"),
    ([1, 2], lambda v: check_config(v, "c.json"), r"^c\.json: the file is a list \(2 items\); expected an object$"),
    ({}, lambda v: index_weight_map(v, "c.json"), r"^c\.json: weight_map is missing; expected an object$"),
    ({"weight_map": {"a.weight": 5}}, lambda v: index_weight_map(v, "c.json"),
     r"^c\.json: weight_map\['a\.weight'\] is 5; expected a string$"),
    ({"files": [1]}, _field("files", dict[str, int]), r"^c\.json: files is a list \(1 items\); expected an object$"),
    ({"size": -1, "sha256": "0" * 64}, lambda v: read_record(FileRecord, v, "c.json"),
     r"size is -1; expected an integer >= 0"),
    ({"size": True}, _field("size", Count), r"size is True; expected an integer >= 0"),
    ({"sha256": "ABC"}, _field("sha256", Sha256 | None),
     r"sha256 is 'ABC'; expected a sha256 \(64 hex digits\) or null"),
    ({"status": {"x": "done"}}, _field("status", dict[str, Status]),
     r"status\.x is 'done'; expected one of 'pending', 'written'"),
    ({"arch": ["9.0"]}, _field("arch", str | None), r"arch is a list \(1 items\); expected a string or null"),
    ({"r": [[1, "2"]]}, _field("r", tuple[tuple[int, ...], ...]), r"r\[0\]\[1\] is '2'; expected an integer"),
    ({"s": "x" * 100}, _field("s", int), r"s is 'x{50,}\.\.\.; expected an integer"),
    ({"s": 1, "t": 2}, _field("s", int), r"^c\.json: t is 2, a key it does not have; expected only s$"),
])
def test_typed_reading_names_the_field(value, read, match):
    with pytest.raises(InputError, match=match):
        read(value)


CONFIG_EDITS = [
    ({"quantization_config": "fp4"}, r"config\.json: quantization_config is 'fp4'; expected an object or null; the "
                                     r"checkpoint is damaged or not a DeepSeek V4 checkpoint: fetch or copy it again$"),
    ({"model_type": ["deepseek_v4"]}, r"config\.json: model_type is \['deepseek_v4'\]; expected one of deepseek_v4"),
    ({"model_type": {"a": 1}}, r"model_type is \{'a': 1\}; expected one of"),
    ({"architectures": 5}, r"config\.json: architectures is 5; expected a list or null"),
    ({"architectures": [5]}, r"architectures\[0\] is 5; expected a string"),
    ({"text_config": "x"}, r"config\.json: text_config is 'x'; expected an object or null"),
    ({"text_config": {"quantization_config": 3}}, r"text_config\.quantization_config is 3; expected an object"),
    ({"hidden_size": 256.0}, r"hidden_size is 256\.0; expected a positive integer"),
    ({"hidden_size": True}, r"hidden_size is True; expected a positive integer"),
    ({"n_routed_experts": [8]}, r"n_routed_experts is \[8\]; expected a positive integer"),
    ({"expert_dtype": ["fp4"]}, r"expert_dtype is \['fp4'\]; expected 'fp4' or 'fp8'"),
    ({"num_hash_layers": -1}, r"num_hash_layers is -1; expected a non-negative integer"),
    ({"hidden_size": 10**30}, r"config\.json: integer 10{23}\.\.\. is out of range"),
]


@pytest.mark.parametrize("change, match", CONFIG_EDITS, ids=[f"{next(iter(c))}={next(iter(c.values()))!r}"[:40]
                                                            for c, _ in CONFIG_EDITS])
def test_config_fields_of_the_wrong_type_give_one_line(tiny_copy, tmp_path, change, match):
    edit_json(tiny_copy / "config.json", lambda c: c.update(change))
    refused(cli(tiny_copy, tmp_path / "out", "-q"), match)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, match", [
    ('[1, 2]', r"config\.json: the file is a list \(2 items\); expected an object"),
    ('{"model_type": "deepseek_v4", "model_type": "x"}', r"key 'model_type' appears twice"),
    ('{"hidden_size": ' + "1" * 5000 + "}", r"integer 1{24}\.\.\. is out of range"),
    ('{"a":' + "[" * 5000 + "]" * 5000 + "}", r"not valid JSON \(RecursionError|nested deeper than 64 levels"),
    ('{"model_type": "deepseek_v4"', r"not valid JSON \(Expecting ',' delimiter"),
], ids=["list", "duplicate-key", "huge-int", "deep", "truncated"])
def test_a_damaged_config_file_gives_one_line(tiny_copy, tmp_path, text, match):
    (tiny_copy / "config.json").write_text(text)
    refused(cli(tiny_copy, tmp_path / "out", "-q"), match)


def _weight_map_as_list(idx):
    idx["weight_map"] = sorted(idx["weight_map"].items())


@pytest.mark.parametrize("change, match", [
    (_weight_map_as_list, r"index\.json: weight_map is a list \(\d+ items\); expected an object"),
    (lambda i: i["weight_map"].update({"embed.weight": 3}), r"weight_map\['embed\.weight'\] is 3; expected a string"),
    (lambda i: i.pop("weight_map"), r"weight_map is missing; expected an object"),
    (lambda i: i.update(metadata=[1]), r"metadata is a list \(1 items\); expected an object or null"),
    (lambda i: i["weight_map"].update({"embed.weight": "x" * 300}),  # found by fuzz_json: OSError ENAMETOOLONG
     r"index\.json: shard name 'x{300}' is not a plain relative path inside the checkpoint; refusing it"),
], ids=["weight-map-list", "shard-name-int", "no-weight-map", "metadata-list", "name-too-long"])
def test_a_damaged_index_gives_one_line(tiny_copy, tmp_path, change, match):
    edit_json(tiny_copy / INDEX, change)
    refused(cli(tiny_copy, tmp_path / "out", "-q"), match)


@pytest.mark.parametrize("which, match", [
    ("config.json", r"config\.json: cannot read it \(Is a directory\); expected a JSON file"),
    (INDEX, r"index\.json: cannot read it \(Is a directory\)"),
    ("model-00002-of-00004.safetensors", r"model-00002-of-00004\.safetensors: cannot read \(Is a directory\)"),
])
def test_a_directory_where_a_file_belongs(tiny_copy, tmp_path, which, match):
    (tiny_copy / which).unlink()
    (tiny_copy / which).mkdir()
    refused(cli(tiny_copy, tmp_path / "out", "-q"), match)


@pytest.mark.parametrize("value", [None, 0, "x", [], [1], {}, {"model_type": 7}, {"model_type": "deepseek_v41",
                                   "text_config": []}, {"model_type": "deepseek_v41", "text_config": {"hidden_size":
                                   "a"}, "quantization_config": {"weight_block_size": [0, "x"]}},
                                   {"model_type": "deepseek_v4", "architectures": {"a": 1}, "num_nextn_predict_layers":
                                   10**6, "first_k_dense_replace": 5.5, "expert_dtype": {}}])
def test_model_spec_raises_only_validation_errors(value):
    with pytest.raises(ValidationError):
        model_spec_from_config(value)


MANIFEST_EDITS = [
    (lambda m: m.update(files=[]), r"fimoe-manifest\.json: files is a list \(0 items\); expected an object"),
    (lambda m: m.update(files={"x": {"size": "1", "sha256": "0" * 64}}), r"files\.x\.size is '1'; expected an integer"),
    (lambda m: m.update(status={"a": "done"}), r"status\.a is 'done'; expected one of 'pending', 'written'"),
    (lambda m: m["source"].update(files=5), r"source\.files is 5; expected an object"),
    (lambda m: m.update(complete="yes"), r"complete is 'yes'; expected true or false"),
    (lambda m: m["options"].update(params={"a": 1}), r"options\.params\.a is 1; expected a string"),
    (lambda m: m.pop("target"), r"target is missing; expected an object"),
    (lambda m: m.update(layers={"layers.0": 3}), r"layers\['layers\.0'\] is 3; expected an object"),
]


@pytest.mark.parametrize("change, match", MANIFEST_EDITS, ids=range(len(MANIFEST_EDITS)))
def test_a_manifest_with_fields_of_the_wrong_type_gives_one_line(bf16_copy, change, match):
    edit_json(bf16_copy / MANIFEST_NAME, change)
    for args in (("verify", bf16_copy), ("upload", bf16_copy, "me/x", "--dry-run")):
        line = refused(
            cli(*args), match + r".*the manifest is damaged: convert into this folder again with --overwrite"
        )
        assert "verify" not in line.split(";", 1)[1]


def test_a_damaged_rank_status_file_only_means_its_shards_are_redone(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    interrupted_run(tiny_ckpt, out)
    (out / "fimoe-status.rank0.json").write_text('{"rank": 0, "files": {"model-00001-of-00009.safetensors": 1}}')
    (out / "fimoe-status.rank1.json").write_text("[" * 10_000)
    r = cli(tiny_ckpt, out, *SHARD_SIZE, "--resume", "--json")
    assert r.exit_code == 0, r.output
    assert cli("verify", out).exit_code == 0


# --------------------------------------------------------------------------------------------- 3. one path rule


@pytest.mark.parametrize("rel, ok", [
    ("model-00001-of-00002.safetensors", True), ("sub/a.safetensors", True), ("..", False), ("../x", False),
    ("a/../../x", False), ("a/../b", False), ("./a", False), ("a//b", False), ("a/", False), ("/etc/passwd", False),
    ("C:x", False), ("a\\b", False), ("a\0b", False), ("", False), (".", False), (5, False), (None, False),
    ("x" * 255, True), ("x" * 256, False), ("\u00e9" * 128, False), ("a/" * 2048 + "b", False),  # found by fuzz_json
    ("a\nb", False), ("a\x07b", False), ("a\x7fb", False), ("\u00e9t\u00e9.json", True),  # one-line messages: fuzz_json
])
def test_the_path_rule(tmp_path, rel, ok):
    (tmp_path / "sub").mkdir()
    problem = name_problem(rel, tmp_path, "idx.json")
    assert (problem is None) == ok, problem
    if not ok:
        assert problem.startswith(f"idx.json: file name {rel!r} is not a plain relative path inside the folder")


def test_the_path_rule_resolves_links(tmp_path):
    folder, outside = tmp_path / "f", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (folder / "up").symlink_to(outside)
    (folder / "loop").symlink_to(folder / "loop")
    (folder / "in").symlink_to(folder / "sub")
    assert re.match(r"w: file 'up/x' is a link to .*/outside/x, outside the folder \(.*/f\); refusing it",
                    name_problem("up/x", folder, "w"))
    assert re.match(r"w: file 'loop' cannot be resolved", name_problem("loop", folder, "w"))
    assert name_problem("in/x", folder, "w") is None


@pytest.fixture
def bf16_copy(bf16_out_of, tmp_path) -> Path:
    return Path(shutil.copytree(bf16_out_of("1MB"), tmp_path / "out"))


def _name_outside(out: Path, victim: Path, rel: str) -> None:
    """The manifest of `out` lists `rel` (a name reaching `victim` outside OUT) with victim's true size and hash."""
    edit_json(out / MANIFEST_NAME, lambda m: (m["files"].update({rel: {"size": victim.stat().st_size,
                                                                      "sha256": hashing.sha256_file(victim)}}),
                                              m["status"].update({rel: "written"})))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "linked-folder"])
def test_overwrite_deletes_nothing_outside_out(bf16_copy, tiny_ckpt, tmp_path, how):
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"precious")
    rel = {"dotdot": "../victim.safetensors", "absolute": str(victim), "linked-folder": "up/victim.safetensors"}[how]
    if how == "linked-folder":
        (bf16_copy / "up").symlink_to(tmp_path)
    _name_outside(bf16_copy, victim, rel)
    r = cli(tiny_ckpt, bf16_copy, *SHARD_SIZE, "--overwrite", "-q")
    assert r.exit_code == 0, r.output
    assert victim.read_bytes() == b"precious"
    assert cli("verify", bf16_copy).exit_code == 0


@pytest.mark.parametrize("how", ["dotdot", "absolute", "linked-folder"])
def test_verify_and_upload_follow_no_name_out_of_out(bf16_copy, tmp_path, how):
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    rel = {"dotdot": "../victim.json", "absolute": str(victim), "linked-folder": "up/victim.json"}[how]
    if how == "linked-folder":
        (bf16_copy / "up").symlink_to(tmp_path)
    _name_outside(bf16_copy, victim, rel)
    want = re.escape(f"file name {rel!r} is not a plain relative path inside OUT" if how != "linked-folder" else
                     f"file {rel!r} is a link to {victim}, outside OUT")
    refused(cli("verify", bf16_copy), want)
    refused(cli("upload", bf16_copy, "me/x", "--dry-run"), want + r".*refusing to upload an OUT that does not verify")


def test_the_runtime_loader_follows_no_index_name_out_of_out(bf16_copy, tmp_path):
    outside = tmp_path / "x.safetensors"
    shard = sorted(bf16_copy.glob("model-*.safetensors"))[0]
    shutil.copy(shard, outside)
    name = next(iter(st_header.read_header(shard).tensors))
    edit_json(bf16_copy / INDEX, lambda i: i["weight_map"].update({name: "../x.safetensors"}))
    with pytest.raises(InputError, match=r"index\.json: shard name '\.\./x\.safetensors' is not a plain relative path "
                                         r"inside OUT; refusing it; the output is damaged: convert into it again"):
        read_output_tensors(bf16_copy, [name])


def test_resume_ignores_names_outside_out(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    interrupted_run(tiny_ckpt, out)
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"precious")
    _name_outside(out, victim, "../victim.safetensors")
    r = cli(tiny_ckpt, out, *SHARD_SIZE, "--resume", "-q")
    assert r.exit_code == 0, r.output
    assert victim.read_bytes() == b"precious" and cli("verify", out).exit_code == 0


# ------------------------------------------------------------------------------ 4. source identity, --resume


def test_the_first_manifest_records_every_input_before_any_shard(tiny_ckpt, tmp_path, monkeypatch):
    seen = {}
    real = st_writer.ShardWriter.__init__

    def first_shard(self, *a, **kw):
        if not seen:
            seen.update(json.loads((tmp_path / "out" / MANIFEST_NAME).read_text()))
        real(self, *a, **kw)

    monkeypatch.setattr(st_writer.ShardWriter, "__init__", first_shard)
    convert(str(tiny_ckpt), str(tmp_path / "out"), shard_size="1MB")
    files = seen["source"]["files"]
    assert set(files) == {p.name for p in tiny_ckpt.iterdir()}
    for rel, rec in files.items():
        st = (tiny_ckpt / rel).stat()
        assert (rec["size"], rec["mtime_ns"], rec["inode"], rec["dev"]) == (st.st_size, st.st_mtime_ns, st.st_ino,
                                                                             st.st_dev)
    # the complete manifest keeps size and sha256 only: copies of SRC elsewhere give the same output
    done = {
        rel: rec.to_json() for rel, rec in read_manifest(tmp_path / "out", require_complete=True).source.files.items()
    }
    assert all(set(rec) == {"size", "sha256"} and rec["sha256"] for rec in done.values())


def test_input_hashes_are_added_to_the_manifest_as_they_finish(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    interrupted_run(tiny_ckpt, out, at=0.5)  # waits until the manifest holds every hash: else it fails
    files = json.loads((out / MANIFEST_NAME).read_text())["source"]["files"]
    assert {rel: rec["sha256"] for rel, rec in files.items()} == {
        rel: hashing.sha256_file(tiny_ckpt / rel) for rel in files
    }


def _flip_same_size(path: Path, keep_mtime: bool = False) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _forget(rel: str):
    return lambda m: m["source"]["files"][rel].update(sha256=None)


SHARD = "model-00002-of-00004.safetensors"
RESUME_REFUSALS = [
    ("byte-flipped, sha256 recorded", lambda s: _flip_same_size(s / SHARD), None,
     rf"--resume: .*/{SHARD}: sha256 [0-9a-f]{{16}}\.\.\. differs from the [0-9a-f]{{16}}\.\.\. recorded when"),
    ("byte-flipped, no sha256", lambda s: _flip_same_size(s / SHARD), _forget(SHARD),
     rf"--resume: .*/{SHARD}: changed since .* was started \(modified .*, recorded .*\) and no sha256 was recorded"),
    ("touched only, no sha256", lambda s: os.utime(s / "config.json", ns=(0, 10**18)), _forget("config.json"),
     r"config\.json: changed since .* \(modified 2001-09-09"),
    ("grown", lambda s: (s / "tokenizer.json").write_text("{}" * 100), None,
     r"tokenizer\.json: changed since .* \(size \d+ -> 200 bytes"),
    ("file added", lambda s: (s / "vocab.txt").write_text("a"), None,
     r"--resume: SRC .* now has 'vocab\.txt', which .* was not converted from"),
    ("file removed", lambda s: (s / "generation_config.json").unlink(), None,
     r"--resume: SRC .* no longer has 'generation_config\.json'"),
]


@pytest.mark.parametrize("change, forget, match", [c[1:] for c in RESUME_REFUSALS], ids=[c[0] for c in RESUME_REFUSALS])
def test_resume_refuses_a_changed_source_and_never_weakens_the_manifest(tiny_copy, tmp_path, change, forget, match):
    out = tmp_path / "out"
    interrupted_run(tiny_copy, out)
    if forget:
        edit_json(out / MANIFEST_NAME, forget)
    change(tiny_copy)
    before = digests(out)
    for _ in range(2):  # a refused --resume rewrites nothing: the same command refuses again
        line = refused(cli(tiny_copy, out, *SHARD_SIZE, "--resume", "-q"), match)
        assert line.endswith("the shards kept would mix old and new source bytes: run with --overwrite in place of "
                             "--resume to convert again from the current source")
        assert digests(out) == before
    r = cli(tiny_copy, out, *SHARD_SIZE, "--overwrite", "-q")
    assert r.exit_code == 0 and cli("verify", out).exit_code == 0


def test_resume_accepts_the_same_bytes_in_a_new_file(tiny_copy, tmp_path):
    """A copied-back input (new inode and mtime, same bytes) is compared by its recorded sha256 and kept."""
    out = tmp_path / "out"
    interrupted_run(tiny_copy, out)
    rel = SHARD
    data = (tiny_copy / rel).read_bytes()
    (tiny_copy / rel).unlink()
    (tiny_copy / rel).write_bytes(data)
    r = cli(tiny_copy, out, *SHARD_SIZE, "--resume", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["shards_kept"] > 0 and cli("verify", out).exit_code == 0


def test_a_change_that_keeps_size_and_mtime_is_caught_by_the_final_hash(tiny_copy, tmp_path):
    """Size, mtime and inode kept: the input passes as the same file before the run, and its hash at the end of
    the run refuses to finish it, without recording the new hash (the next --resume refuses again)."""
    out = tmp_path / "out"
    interrupted_run(tiny_copy, out)
    recorded = json.loads((out / MANIFEST_NAME).read_text())["source"]["files"][SHARD]["sha256"]
    _flip_same_size(tiny_copy / SHARD, keep_mtime=True)
    for _ in range(2):
        refused(
            cli(tiny_copy, out, *SHARD_SIZE, "--resume", "-q"),
            rf"--resume: .*/{SHARD}: sha256 [0-9a-f]{{16}}\.\.\. differs from the {recorded[:16]}\.\.\. recorded when "
            r".* was started; the shards kept would mix old and new source bytes",
        )
        m = json.loads((out / MANIFEST_NAME).read_text())
        assert m["complete"] is False and m["source"]["files"][SHARD]["sha256"] == recorded


def test_a_source_changed_during_the_run_is_refused(tiny_copy, tmp_path, monkeypatch):
    def change_midway(done, total):
        if done > total // 2 and not (tiny_copy / "tokenizer.json").read_text().startswith("{}"):
            (tiny_copy / "tokenizer.json").write_text("{}")

    real = conv_mod.convert
    monkeypatch.setattr(conv_mod, "convert", lambda *a, **kw: real(*a, **{**kw, "progress": change_midway}))
    refused(cli(tiny_copy, tmp_path / "out", *SHARD_SIZE, "-q"),
            r"tokenizer\.json: changed while the conversion ran \(size \d+ -> 2 bytes.*convert again with --overwrite")
    assert json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["complete"] is False


# -------------------------------------------------------------------------------------------- 5. folder guards


@pytest.mark.parametrize("flag", ["--resume", "--overwrite", None])
def test_a_folder_without_our_manifest_is_never_touched(tiny_ckpt, tmp_path, flag):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "draft.fimoe-tmp").write_text("mine too")
    before = digests(out)
    what = {"--resume": "--resume continues", "--overwrite": "--overwrite replaces", None: None}[flag]
    match = (rf"OUT .*: {what} only a fimoe-convert output, and this folder holds no fimoe-manifest\.json but 2 other "
             r"entries \(draft\.fimoe-tmp, notes\.txt\); choose an empty folder" if what else
             r"OUT .*: is not empty \(draft\.fimoe-tmp, notes\.txt\); choose an empty folder")
    refused(cli(tiny_ckpt, out, *([flag] if flag else []), "-q"), match)
    assert digests(out) == before


def test_what_a_run_leaves_before_its_first_manifest_counts_as_empty(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text("pid 1 on gone, started long ago\n")  # a SIGKILLed run's lock: no flock held
    (out / (MANIFEST_NAME + ".fimoe-tmp")).write_text("{")
    r = cli(tiny_ckpt, out, "-q")
    assert r.exit_code == 0, r.output
    assert not (out / LOCK_NAME).exists() and not list(out.glob("*.fimoe-tmp"))
    assert cli("verify", out).exit_code == 0


@pytest.mark.parametrize("alias", ["symlink", pytest.param("bind-mount", marks=pytest.mark.slow)])
def test_out_reaching_src_through_an_alias_is_refused(tiny_copy, tmp_path, alias):
    if alias == "symlink":
        (tmp_path / "alias").symlink_to(tiny_copy)
        before = digests(tiny_copy)
        refused(cli(tiny_copy, tmp_path / "alias" / "out", "-q"), r"OUT .*/alias/out: lies inside SRC")
        assert digests(tiny_copy) == before
        return
    # a bind mount: same (st_dev, st_ino), unrelated path; in a private mount namespace, as root
    code = (
        f"import os, subprocess, sys; m = {str(tmp_path / 'mnt')!r}; os.makedirs(m);"
        f"subprocess.run(['mount', '--bind', {str(tiny_copy)!r}, m], check=True);"
        f"from click.testing import CliRunner; from fimoe_convert.cli import main;"
        f"r = CliRunner().invoke(main, [{str(tiny_copy)!r}, m + '/out', '-q']); print(r.exit_code); print(r.stderr)"
    )
    p = subprocess.run(["unshare", "-m", sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                       timeout=120)
    if p.returncode:
        pytest.skip(f"no private bind mount here: {p.stderr.strip()[-200:]}")
    exit_code, line = p.stdout.splitlines()[:2]
    assert exit_code == "1" and re.match(r"error: OUT .*/mnt/out: lies inside SRC .*bind mount", line), p.stdout
    assert not (tiny_copy / "out").exists()


def test_files_of_src_named_like_the_tools_own_are_not_copied(tiny_copy, tmp_path):
    (tiny_copy / MANIFEST_NAME).write_text('{"schema": "fimoe-manifest/1", "complete": true, "files": {}}')
    (tiny_copy / "fimoe-status.rank0.json").write_text("{}")
    (tiny_copy / "weights.fimoe-tmp").write_text("x")
    out = tmp_path / "out"
    r = cli(tiny_copy, out, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["skipped"] == ["fimoe-manifest.json", "fimoe-status.rank0.json", "weights.fimoe-tmp"]
    assert not (out / "fimoe-status.rank0.json").exists() and not (out / "weights.fimoe-tmp").exists()
    assert read_manifest(out, require_complete=True).files  # our manifest, not SRC's
    assert cli("verify", out).exit_code == 0
    r = cli(tiny_copy, tmp_path / "out2")
    assert r.exit_code == 0 and ("not copied from SRC (named like fimoe-convert's own files): fimoe-manifest.json, "
                                 "fimoe-status.rank0.json, weights.fimoe-tmp") in r.stdout


def test_a_second_run_into_one_out_fails_at_once_naming_the_first(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    first = OutLock(out)
    first.acquire()
    try:
        t0 = time.monotonic()
        line = refused(cli(tiny_ckpt, out, "-q"), rf"OUT .*: another fimoe-convert run is writing into it \(pid "
                                                  rf"{os.getpid()} on .*, started .* UTC \(fimoe-convert .*\)\); wait")
        assert time.monotonic() - t0 < 10, line
        # --resume and --overwrite as well; verify and upload ignore the lock
        refused(cli(tiny_ckpt, out, "--overwrite", "-q"), r"another fimoe-convert run is writing into it")
    finally:
        first.release()
    assert not out.exists()  # the first 'run' created OUT and wrote nothing: its release removed it
    assert cli(tiny_ckpt, out, "-q").exit_code == 0
    assert not (out / LOCK_NAME).exists()


def test_the_lock_is_held_for_the_whole_run_and_taken_again_after_a_kill(tiny_ckpt, tmp_path, monkeypatch):
    out = tmp_path / "out"
    seen = []
    real = st_writer.ShardWriter.finish

    def finish(self):
        second = OutLock(out)
        with pytest.raises(InputError, match="another fimoe-convert run is writing into it"):
            second.acquire()
        seen.append(1)
        return real(self)

    monkeypatch.setattr(st_writer.ShardWriter, "finish", finish)
    convert(str(tiny_ckpt), str(out), shard_size="1MB")
    assert seen and not (out / LOCK_NAME).exists()


def test_a_run_that_fails_before_writing_leaves_no_folder(tiny_ckpt, tmp_path, monkeypatch):
    import fimoe_convert.conversion as conv

    monkeypatch.setattr(conv, "free_disk", lambda out: (out, 1000))
    out = tmp_path / "new" / "out"
    refused(cli(tiny_ckpt, out, "-q"), r"OUT .*: needs \d+ bytes \(shards and copied files\), 1000 free on")
    assert not out.exists()


def test_copied_files_count_in_the_free_space_check(tiny_copy, tmp_path, monkeypatch):
    import fimoe_convert.conversion as conv

    with open(tiny_copy / "tokenizer.model", "wb") as f:
        f.truncate(10**10)  # sparse: 10 GB that take no disk
    monkeypatch.setattr(conv, "free_disk", lambda out: (out, 10**10))
    refused(cli(tiny_copy, tmp_path / "out", "-q"), r"needs 100\d{8} bytes \(shards and copied files\)")


def test_copied_files_are_streamed(tmp_path):
    import tracemalloc

    from fimoe_convert.files.output.folder import copy_file

    big = tmp_path / "tokenizer.model"
    big.write_bytes(os.urandom(1 << 20) * 64)  # 64 MiB
    tracemalloc.start()
    try:
        copy_file(big, tmp_path / "copy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, peak  # one 16 MiB block at a time, not the whole file
    assert hashing.sha256_file(tmp_path / "copy") == hashing.sha256_file(big)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, word", [(signal.SIGTERM, "interrupted (SIGTERM)"), (signal.SIGHUP, "interrupted (SIGHUP)")]
)
def test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does(tiny_ckpt, tmp_path, signum, word):
    out = tmp_path / "out"
    code, stdout, stderr = run_and_signal(tiny_ckpt, out, signum)
    assert code == 128 + signum, (code, stderr)
    assert stderr == f"error: {word}; finished shards are kept: run the same command with --resume\n" and stdout == ""
    assert not list(out.glob("*.fimoe-tmp")) and not (out / LOCK_NAME).exists() and not (out / INDEX).exists()
    r = cli(tiny_ckpt, out, *SHARD_SIZE, "--resume", "-q")
    assert r.exit_code == 0 and cli("verify", out).exit_code == 0


def test_a_second_ctrl_c_during_the_clean_up_is_ignored(tiny_ckpt, tmp_path, monkeypatch, signal_handlers):
    """The first SIGINT stops the run; another one while the lanes clean up changes nothing: the temporary files
    go, one line, exit 130, no traceback."""
    from fimoe_convert.pipeline import lanes

    real_abort, real_next = st_writer.ShardWriter.abort, lanes._ShardJob._next
    aborted, half, sent = [], [], []

    def abort(self):
        aborted.append(self.tmp)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C again, while cleaning up
        real_abort(self)

    def next_then_ctrl_c(self):
        """Past half the bytes, a shard writer asks for its next chunk: Ctrl-C, and the chunk is asked for once the
        clean-up has reached this shard (so its writer is aborted, not finished)."""
        if half and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))
            deadline = time.monotonic() + 10
            while not self.stopping and time.monotonic() < deadline:
                pass
        return real_next(self)

    def with_progress(*a, **kw):
        return real(*a, **{**kw, "progress": lambda done, total: done > total // 2 and half.append(True)})

    real = conv_mod.convert
    monkeypatch.setattr(st_writer.ShardWriter, "abort", abort)
    monkeypatch.setattr(lanes._ShardJob, "_next", next_then_ctrl_c)
    monkeypatch.setattr(conv_mod, "convert", with_progress)
    out = tmp_path / "out"
    r = cli(tiny_ckpt, out, *SHARD_SIZE, "-q")
    assert aborted
    refused(
        r, r"^error: interrupted \(SIGINT\); finished shards are kept: run the same command with --resume$", code=130
    )
    assert not list(out.glob("*.fimoe-tmp")) and not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("where", ["after-open", "staging", "metadata-file"])
def test_a_ctrl_c_right_after_a_temporary_is_created_leaves_none(tiny_ckpt, tmp_path, monkeypatch, where):
    out = tmp_path / "out"
    if where == "after-open":  # the file exists, open() has not returned
        real_opener = st_writer._direct_opener

        def opener(path, flags):
            real_opener(path, flags)
            raise KeyboardInterrupt

        monkeypatch.setattr(st_writer, "_direct_opener", opener)
    elif where == "staging":
        monkeypatch.setattr(st_writer, "_StagedFile", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    else:
        real_copy = shutil.copyfileobj

        def copy(*a):
            real_copy(*a)
            raise KeyboardInterrupt

        monkeypatch.setattr(shutil, "copyfileobj", copy)
    refused(
        cli(tiny_ckpt, out, *SHARD_SIZE, "-q"), r"^error: interrupted \(SIGINT\); finished shards are kept", code=130
    )
    assert not list(out.glob("*.fimoe-tmp")), sorted(p.name for p in out.iterdir())
    assert not atomic._TEMPS


# ------------------------------------------------------------------------------- 6. bounds from what is present


@pytest.mark.parametrize("change, match", [
    ({"n_routed_experts": 10**7}, r"n_routed_experts is 10000000; expected a positive integer of at most 65536"),
    ({"n_routed_experts": 60000}, r"n_routed_experts is 60000, but the index holds 8 routed experts \(experts\.0 to "
                                  r"experts\.7\); the checkpoint is incomplete or config\.json declares more"),
    ({"num_hidden_layers": 10**9}, r"num_hidden_layers is 1000000000; expected a positive integer of at most 4096"),
    ({"num_hidden_layers": 4000},
     r"num_hidden_layers is 4000, but the index holds 3 layers \(layers\.0 to layers\.2\)"),
    ({"num_nextn_predict_layers": 64}, r"num_nextn_predict_layers is 64, but the index holds 1 MTP blocks"),
    ({"first_k_dense_replace": 10**8}, r"first_k_dense_replace is 100000000; expected a non-negative integer of at "
                                       r"most 4096"),
    ({"hidden_size": 2**40}, r"hidden_size is 1099511627776; expected a positive integer of at most 1048576"),
    ({"quantization_config": {"weight_block_size": [1, 2**40]}}, r"weight_block_size is \[1, 1099511627776\]"),
], ids=["experts-1e7", "experts-6e4", "layers-1e9", "layers-4000", "mtp-64", "dense-1e8", "hidden-2^40", "block"])
def test_declared_counts_are_checked_against_the_index_at_once(tiny_copy, tmp_path, change, match):
    edit_json(tiny_copy / "config.json", lambda c: c.update(change))
    t0 = time.monotonic()
    refused(cli(tiny_copy, tmp_path / "out", "-q"), match)
    assert time.monotonic() - t0 < 10  # it used to hang, growing by 130 MB/s
    refused(cli("inspect", tiny_copy), match)


def test_check_counts_counts_what_is_present(tiny_ckpt):
    src = open_source(str(tiny_ckpt))
    assert check_counts(src.model, src.weight_map) == []
    dense = model_spec_from_config({"model_type": "deepseek_v4", "hidden_size": 64, "moe_intermediate_size": 64,
                                    "n_routed_experts": 999, "num_experts_per_tok": 1, "num_hidden_layers": 2,
                                    "first_k_dense_replace": 2})
    assert check_counts(dense, ["layers.0.attn.x", "layers.1.attn.x"]) == []  # no MoE block: no experts needed
    assert check_counts(dense, ["layers.0.attn.x"], "c") == [
        "c: num_hidden_layers is 2, but the index holds 1 layers (layers.0 to layers.0); the checkpoint is incomplete "
        "or config.json declares more than it holds"]


# ------------------------------------------------------------------------------ 7. damaged or old manifests


DAMAGES = {
    "garbled": lambda p: p.write_bytes(b"\x00garbage{"),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:100]),
    "old-schema": lambda p: edit_json(p, lambda m: m.update(schema="fimoe-manifest/0")),
    "other-json": lambda p: p.write_text('{"hello": "world"}'),
    "files-as-list": lambda p: edit_json(p, lambda m: m.update(files=[])),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_or_old_manifest_says_what_to_do(tiny_ckpt, tmp_path, damage):
    out = tmp_path / "out"
    interrupted_run(tiny_ckpt, out)
    DAMAGES[damage](out / MANIFEST_NAME)
    before = digests(out)
    line = refused(cli(tiny_ckpt, out, *SHARD_SIZE, "--resume", "-q"),
                   r"fimoe-manifest\.json: .*--resume cannot continue from it: run the command with --overwrite in "
                   r"place of --resume \(it replaces this folder's conversion\), or choose an empty OUT$")
    assert "run the same command with --resume" not in line
    line = refused(
        cli(tiny_ckpt, out, *SHARD_SIZE, "-q"),
        r"OUT .*: is not empty; it holds an earlier conversion whose "
        r"manifest cannot be used \(.*\); pass --overwrite to replace",
    )
    refused(cli("verify", out), r"convert into this folder again with --overwrite")
    assert digests(out) == before
    r = cli(tiny_ckpt, out, *SHARD_SIZE, "--overwrite", "-q")  # takes the folder over
    assert r.exit_code == 0, r.output
    assert cli("verify", out).exit_code == 0


def test_the_runtime_loader_imports_no_module_a_manifest_names():
    from fimoe_convert.numerics.structure import unflatten

    with pytest.raises(ValueError, match=r"dataclass 'os:system' is not one this target's kernel returns"):
        unflatten({"dataclass": "os:system", "fields": {}}, {})


# ---------------------------------------------------------------------------------------------- 8. exit codes


FLAG_ERRORS = [
    (["--target", "nope"], r"--target nope: unknown target"),
    (["--ep-size", "0"], r"--ep-size 0: must be 1 or more \(the number of expert-parallel ranks\)"),
    (["--ep-size", "-2"], r"--ep-size -2: must be 1 or more"),
    (["--ep-size", "abc"], r"Invalid value for '--ep-size'"),
    (["--device", "tpu"], r"Invalid value for '--device'"),
    (["--arch", "nine"], r"--arch nine: expected a compute capability"),
    (["--max-memory", "lots"], r"--max-memory: cannot read size 'lots'"),
    (["--max-memory", "0"], r"--max-memory: size '0' must be positive"),
    (["--shard-size", "0.1B"], r"--shard-size: size '0\.1B' must be positive"),
    (["--writers", "0"], r"--writers 0: expected 1 or more"),
    (["--param", "novalue"], r"--param novalue: expected KEY=VALUE"),
    (["--param", "nope=1"], r"--param nope=1: bf16 takes dense \(fp8\|bf16\)"),
    (["--target", "megamoe_sm90_mxfp4", "--arch", "9.0", "--param", "nope=1"], r"--param nope=1: megamoe_sm90_mxfp4 "
                                                                                  r"takes"),
    (["--target", "fp8_block", "--param", "scale_dtype=f16"], r"--param scale_dtype=f16: expected one of"),
    (["--param", "a=b\nc"], r"--param 'a'='b\\nc': keys and values are letters, digits"),
    (["--param", "a=b;rm -rf"], r"--param 'a'='b;rm -rf': keys and values are letters"),
    (["--resume", "--overwrite"], r"--resume and --overwrite: pass one of them"),
    (["--revision", "main"], r"--revision main: SRC .* is a local folder"),
    (["--config", "/nonexistent.toml"], r"--config /nonexistent\.toml: no such preset or file"),
]


@pytest.mark.parametrize("args, match", FLAG_ERRORS, ids=[" ".join(a)[:40] for a, _ in FLAG_ERRORS])
def test_every_flag_error_exits_2_with_one_line(tiny_ckpt, tmp_path, args, match):
    r = cli(tiny_ckpt, tmp_path / "out", *args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "Traceback" not in r.output and re.search(match, r.stderr), r.stderr
    if not match.startswith("Invalid value"):  # click's own usage text has its usage lines
        assert len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_every_target_rejects_unknown_param_keys_naming_what_it_takes(kernel):
    problems = check_params(kernel, {"no_such_key": "1"})
    assert len(problems) == 1 and problems[0].startswith(f"--param no_such_key=1: {kernel.name} takes ")
    for key, values in kernel.params.items():
        assert check_params(kernel, {key: values[0]}) == []


@pytest.mark.parametrize("raise_it, match", [
    (RuntimeError("boom\nsecond line"), r"^error: RuntimeError: boom second line; this is not a known input problem: "
                                        r"run again with FIMOE_DEBUG=1 for the traceback and report it$"),
    (KeyError("k"), r"^error: KeyError: 'k'; this is not a known input problem"),
    (MemoryError(), r"^error: MemoryError; this is not a known input problem"),
])
def test_an_unexpected_exception_is_one_line_unless_debugging(tiny_ckpt, tmp_path, monkeypatch, raise_it, match):
    def broken(*a, **kw):
        raise raise_it

    monkeypatch.setattr(conv_mod, "convert", broken)
    refused(cli(tiny_ckpt, tmp_path / "out", env={"FIMOE_DEBUG": None}), match)
    r = cli(tiny_ckpt, tmp_path / "out", env={"FIMOE_DEBUG": "1"})
    assert r.exception is raise_it


@pytest.mark.parametrize("env, match", [
    ({"WORLD_SIZE": "2", "RANK": "0"}, r"WORLD_SIZE=2 asks for a distributed run, but MASTER_ADDR and MASTER_PORT are "
                                       r"not set; launch with torchrun"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}, r"but MASTER_PORT is not set"),
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, r"but RANK 5 is not in 0\.\.1"),
    ({"WORLD_SIZE": "two"}, r"WORLD_SIZE='two': expected an integer \(torchrun sets it\)"),
])
def test_torchrun_variables_without_a_launcher_give_one_line(tiny_ckpt, tmp_path, env, match):
    full = {"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None, "MASTER_ADDR": None, "MASTER_PORT": None, **env}
    refused(cli(tiny_ckpt, tmp_path / "out", "-q", env=full), match)


@pytest.mark.parametrize("command", [["verify"], ["verify", "--deep"], ["upload", None, "me/x", "--dry-run"]])
def test_verify_and_upload_pointed_at_a_file(tiny_ckpt, command):
    args = [a if a is not None else tiny_ckpt / "config.json" for a in command]
    if command[0] == "verify":
        args.append(tiny_ckpt / "config.json")
    refused(cli(*args), r"OUT .*config\.json: is a file; expected a folder written by fimoe-convert")


@pytest.mark.parametrize("change, match", [
    (lambda m: m.update(files={}, status={}), r"lists 0 files, no index and 0 shards"),
    (lambda m: m["files"].pop(INDEX), r"lists \d+ files, no index and 18 shards"),
    (lambda m: [m["files"].pop(f) for f in list(m["files"]) if f.endswith(".safetensors")],
     r"lists \d+ files, an index and 0 shards"),
    (lambda m: m["status"].update({"model-00001-of-00009.safetensors": "pending"}),
     r"shard 'model-00001-of-00009\.safetensors' is not recorded as written, yet complete is true"),
], ids=["nothing", "no-index", "no-shards", "pending"])
def test_verify_fails_a_manifest_that_lists_too_little(bf16_copy, change, match):
    edit_json(bf16_copy / MANIFEST_NAME, change)
    refused(cli("verify", bf16_copy), match)
    refused(cli("upload", bf16_copy, "me/x", "--dry-run"), match)


# ------------------------------------------------------------------------------------------------ fuzzing


@pytest.mark.slow
def test_fuzz_json_short():
    """The CI version of scripts/reliability/fuzz_json.py: 1,500 config, index, manifest and status inputs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_fimoe_fuzz_json", ROOT / "scripts" / "reliability" / "fuzz_json.py")
    fz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fz)
    r = fz.run_hypothesis(1500, seed=2, log=lambda *a: None)
    assert r["escapes"] == 0, r["examples"]
    assert r["inputs"] >= 1500 and r["accepted"] > 0 and r["rejected"] > 0
