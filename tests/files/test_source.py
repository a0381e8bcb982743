"""Source validation before any tensor data is read: headers, index, paths, experts, config."""

import json
import os
import struct
from pathlib import Path

import pytest

from fimoe_convert.errors import InputError, UsageError, ValidationError
from fimoe_convert.files.sources.local import open_source
from fimoe_convert.testing import PRESETS

INDEX = "model.safetensors.index.json"
TINY = PRESETS["tiny"]
W1_BYTES = TINY.inter * TINY.hidden // 2  # an FP4 gate weight: two values a byte


def _index(src: Path) -> dict:
    return json.loads((src / INDEX).read_text())


def _write_index(src: Path, index: dict) -> None:
    (src / INDEX).write_text(json.dumps(index))


def _shard_of(src: Path, name: str) -> Path:
    return src / _index(src)["weight_map"][name]


def _rewrite_header(shard: Path, edit) -> None:
    data = shard.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    edit(header)
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    shard.write_bytes(struct.pack("<Q", len(body)) + body + data[8 + n:])


def _config(src: Path, **changes) -> None:
    cfg = json.loads((src / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (src / "config.json").write_text(json.dumps(cfg))


EXPERT = "layers.1.ffn.experts.3.w1"


def truncate(src):
    p = src / "model-00002-of-00004.safetensors"
    p.write_bytes(p.read_bytes()[:-100])


def header_past_end(src):
    p = src / "model-00002-of-00004.safetensors"
    p.write_bytes(struct.pack("<Q", 10**7) + p.read_bytes()[8:])


def header_too_big(src):
    p = src / "model-00002-of-00004.safetensors"
    p.write_bytes(struct.pack("<Q", 200_000_000) + p.read_bytes()[8:])


def header_not_json(src):
    p = src / "model-00002-of-00004.safetensors"
    data = bytearray(p.read_bytes())
    data[8:12] = b"\xff{{{"
    p.write_bytes(bytes(data))


def overlapping(src):
    def edit(h):
        first = min((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        second = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])[1]
        b, e = h[second]["data_offsets"]
        h[second]["data_offsets"] = [b - 1, e - 1]
        del first
    _rewrite_header(src / "model-00002-of-00004.safetensors", edit)


def bytes_vs_shape(src):
    def edit(h):
        h[f"{EXPERT}.weight"]["shape"] = [128, 64]
    _rewrite_header(_shard_of(src, f"{EXPERT}.weight"), edit)


def missing_shard(src):
    _shard_of(src, f"{EXPERT}.weight").unlink()


def index_names_absent_tensor(src):
    idx = _index(src)
    idx["weight_map"]["layers.0.attn.ghost.weight"] = "model-00001-of-00004.safetensors"
    _write_index(src, idx)


def tensor_in_two_shards(src):
    idx = _index(src)
    a, b = sorted(set(idx["weight_map"].values()))[:2]
    name = next(n for n, s in idx["weight_map"].items() if s == a)
    import torch

    from fimoe_convert.files.safetensors.header import PlannedTensor, read_header
    from fimoe_convert.files.safetensors.writer import write_file
    info = read_header(src / a).tensors[name]
    hb = read_header(src / b)
    tensors = []
    for t in sorted(hb.tensors.values(), key=lambda t: t.start):
        data = (src / b).read_bytes()[t.start:t.end]
        tensors.append((PlannedTensor(t.name, t.dtype, t.shape), data))
    tensors.append((PlannedTensor(name, info.dtype, info.shape), (src / a).read_bytes()[info.start:info.end]))
    write_file(src / b, tensors)
    del torch


def missing_expert(src):
    idx = _index(src)
    del idx["weight_map"][f"{EXPERT}.weight"]
    shard = _shard_of(src, f"{EXPERT}.scale")
    _write_index(src, idx)
    _drop_tensor(shard, f"{EXPERT}.weight")


def missing_scale(src):
    shard = _shard_of(src, f"{EXPERT}.scale")
    idx = _index(src)
    del idx["weight_map"][f"{EXPERT}.scale"]
    _write_index(src, idx)
    _drop_tensor(shard, f"{EXPERT}.scale")


def _drop_tensor(shard: Path, name: str) -> None:
    from fimoe_convert.files.safetensors.header import PlannedTensor, read_header
    from fimoe_convert.files.safetensors.writer import write_file
    h = read_header(shard)
    data = shard.read_bytes()
    write_file(shard, [(PlannedTensor(t.name, t.dtype, t.shape), data[t.start:t.end])
                       for t in sorted(h.tensors.values(), key=lambda t: t.start) if t.name != name])


def scale_wrong_shape(src):
    def edit(h):  # as many bytes as the real [inter, hidden / 32], another shape
        h[f"{EXPERT}.scale"]["shape"] = [TINY.inter // 2, TINY.hidden // 32 * 2]
    _rewrite_header(_shard_of(src, f"{EXPERT}.scale"), edit)


def traversal(src):
    idx = _index(src)
    idx["weight_map"]["embed.weight"] = "../x.safetensors"
    _write_index(src, idx)


def absolute(src):
    idx = _index(src)
    idx["weight_map"]["embed.weight"] = "/etc/passwd"
    _write_index(src, idx)


def symlink_out(src):
    shard = src / "model-00004-of-00004.safetensors"
    outside = src.parent / "outside.safetensors"
    shard.rename(outside)
    os.symlink(outside, shard)


CASES = [
    (truncate, r"model-00002-of-00004\.safetensors: data ends at byte \d+ but the file has \d+ bytes"),
    (header_past_end, r"model-00002-of-00004\.safetensors: header length 10000000 bytes runs past the end"),
    (header_too_big, r"header length 200000000 bytes exceeds the 100000000-byte limit"),
    (header_not_json, r"model-00002-of-00004\.safetensors: header is not valid JSON"),
    (overlapping, r"at data offset \d+ overlaps the previous tensor"),
    (
        bytes_vs_shape,
        rf"tensor 'layers\.1\.ffn\.experts\.3\.w1\.weight': {W1_BYTES} bytes in the file, "
        r"but I8 \[128, 64\] needs 8192",
    ),
    (missing_shard, r"names shard 'model-0000\d-of-00004\.safetensors', which does not exist"),
    (
        index_names_absent_tensor,
        r"names tensor 'layers\.0\.attn\.ghost\.weight' in shard 'model-00001-of-00004\.safetensors', "
        r"which does not hold it",
    ),
    (tensor_in_two_shards, r"is in two shards"),
    (missing_expert, r"layers\.1: 1 routed-expert tensors missing, e\.g\. layers\.1\.ffn\.experts\.3\.w1\.weight"),
    (missing_scale, r"layers\.1: 1 routed-expert tensors missing, e\.g\. layers\.1\.ffn\.experts\.3\.w1\.scale"),
    (
        scale_wrong_shape,
        rf"tensor 'layers\.1\.ffn\.experts\.3\.w1\.scale': F8_E8M0 \[{TINY.inter // 2}, {TINY.hidden // 32 * 2}\], "
        rf"expected F8_E8M0 \[{TINY.inter}, {TINY.hidden // 32}\]",
    ),
    (traversal, r"shard name '\.\./x\.safetensors' is not a plain relative path"),
    (absolute, r"shard name '/etc/passwd' is not a plain relative path"),
    (
        symlink_out,
        r"shard 'model-00004-of-00004\.safetensors' is a link to .*outside\.safetensors, outside the checkpoint",
    ),
]


@pytest.mark.parametrize("damage, match", CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_checkpoint_is_refused_with_a_named_problem(tiny_copy, damage, match):
    damage(tiny_copy)
    with pytest.raises((InputError, ValidationError), match=match):
        open_source(str(tiny_copy))


@pytest.mark.parametrize("changes, match", [
    ({"model_type": "llama"}, r"model_type is 'llama'; expected one of deepseek_v4, deepseek_v41"),
    ({"hidden_size": None}, r"hidden_size is None; expected a positive integer"),
    ({"hidden_size": None, "n_routed_experts": "8"},
     r"2 problems:\n  - .*hidden_size is None.*\n  - .*n_routed_experts is '8'"),
    ({"n_routed_experts": 4},
     r"8 routed-expert tensors|routed-expert tensors lie outside the 4 MoE blocks x 4 experts"),
    ({"num_hidden_layers": 4}, r"num_hidden_layers is 4, but the index holds 3 layers \(layers\.0 to layers\.2\); "
                               r"the checkpoint is incomplete"),
    ({"moe_intermediate_size": 2 * TINY.inter}, rf"expected I8 \[{2 * TINY.inter}, {TINY.hidden // 2}\]"),
    ({"expert_dtype": None}, rf"expected F8_E4M3 \[{TINY.inter}, {TINY.hidden}\] \(expert_dtype fp8"),
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok is 9; expected at most n_routed_experts \(8\)"),
])
def test_config_missing_or_contradicting_tensors(tiny_copy, changes, match):
    _config(tiny_copy, **changes)
    with pytest.raises(ValidationError, match=match):
        open_source(str(tiny_copy))


def test_all_problems_reported_at_once(tiny_copy):
    truncate(tiny_copy)
    traversal(tiny_copy)
    with pytest.raises(ValidationError, match=r"2 problems:") as e:
        open_source(str(tiny_copy))
    assert len(e.value.problems) == 2


@pytest.mark.parametrize("spec, match, exc", [
    ("no/such/folder/here", r"^SRC 'no/such/folder/here': no such folder \('no' is not in this folder\); ",
     UsageError),
    ("nosuchfolder", r"no such folder, and not a Hub repo id", UsageError),
    ("config.json", r"is a file; expected a checkpoint folder", UsageError),
])
def test_bad_src(tiny_ckpt, monkeypatch, spec, match, exc):
    monkeypatch.chdir(tiny_ckpt)
    with pytest.raises(exc, match=match):
        open_source(spec)


@pytest.mark.parametrize("spec, match", [
    ("demo-out/scr", r"^SRC 'demo-out/scr': no such folder \('scr' is not in demo-out/; with the folder 'demo-out' "
                     r"here, SRC is a path, not a Hub repo id\); did you mean 'demo-out/src'\?$"),
    ("demo-out/zzz", r"^SRC 'demo-out/zzz': no such folder .*\); demo-out/ has out-bf16, src$"),
    ("./demo-out/scr", r"^SRC './demo-out/scr': no such folder \('scr' is not in demo-out/\); did you mean "
                       r"'demo-out/src'\?$"),
])
def test_a_typo_in_a_local_path_is_no_hub_request(tmp_path, monkeypatch, spec, match):
    """org/name whose org is a folder here is a path: its absence is said, with the closest name, and the Hub is not
    asked (it would say it cannot be reached, offline)."""
    from fimoe_convert.files.sources import hub

    (tmp_path / "demo-out" / "src").mkdir(parents=True)
    (tmp_path / "demo-out" / "out-bf16").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub, "reach_hub", lambda *a: pytest.fail("the Hub was asked"))
    with pytest.raises(UsageError, match=match):
        hub.check_source(spec, None, False)
    with pytest.raises(UsageError, match=match):
        open_source(spec)


def test_valid_source_reads_by_name_across_shards(tiny_ckpt):
    s = open_source(str(tiny_ckpt))
    shards = {s.weight_map[f"layers.1.ffn.experts.{j}.w1.weight"] for j in range(8)}
    assert len(shards) == 2  # the fixture spreads one layer's experts over two shards
    t = s.read("layers.1.ffn.experts.7.w2.scale")
    assert t.shape == (TINY.hidden, TINY.inter // 32) and str(t.dtype) == "torch.float8_e8m0fnu"
    assert s.model.moe_blocks == ["layers.0", "layers.1", "layers.2", "mtp.0"]
