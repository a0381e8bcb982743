"""End-to-end BF16 conversion: bit-exact experts, byte-identical copies, manifest, verify, resume,
determinism, refusals."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from reference import load_all, same_bits, seed_dequant
from safetensors import safe_open

from fimoe_convert import convert, verify
from fimoe_convert.errors import CorruptTensorError, UsageError, ValidationError
from fimoe_convert.files.output.manifest import MANIFEST_NAME, dumps, read_manifest
from fimoe_convert.testing import make_checkpoint


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def bf16_out(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16") / "out"
    convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB")
    return out


def test_experts_bit_identical_to_seed_formula(tiny_ckpt, bf16_out):
    src, dst = load_all(tiny_ckpt), load_all(bf16_out)
    experts = [n for n in src if ".ffn.experts." in n and n.endswith(".weight")]
    assert len(experts) == 4 * 8 * 3  # 3 layers + 1 MTP block, 8 experts, 3 legs
    for name in experts:
        want = seed_dequant(src[name], src[name.removesuffix(".weight") + ".scale"])
        assert dst[name].dtype == torch.bfloat16
        assert same_bits(dst[name], want), name


def test_fixture_covers_extreme_scale_bytes_and_negative_zero(tiny_ckpt):
    src = load_all(tiny_ckpt)
    scales = torch.cat(
        [t.view(torch.uint8).flatten() for n, t in src.items() if n.endswith(".scale") and ".experts." in n]
    )
    codes = torch.cat(
        [t.view(torch.uint8).flatten() for n, t in src.items() if n.endswith(".weight") and ".experts." in n]
    )
    assert {1, 254} <= set(scales.unique().tolist())
    assert bool(((codes & 0xF) == 8).any()) and bool(((codes >> 4) == 8).any())


def test_other_tensors_copied_byte_for_byte_and_scales_dropped(tiny_ckpt, bf16_out):
    src, dst = load_all(tiny_ckpt), load_all(bf16_out)
    for name, t in src.items():
        if ".ffn.experts." in name:
            if name.endswith(".scale"):
                assert name not in dst
            continue
        assert dst[name].dtype == t.dtype and dst[name].shape == t.shape, name
        assert same_bits(dst[name], t), name
    assert set(dst) == {n for n in src if not (".ffn.experts." in n and n.endswith(".scale"))}


def test_config_has_no_expert_dtype_skips_experts_and_small_files_copied(tiny_ckpt, bf16_out):
    cfg = json.loads((bf16_out / "config.json").read_text())
    assert "expert_dtype" not in cfg  # transformers and vLLM accept only fp4/fp8
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    assert {"lm_head", "layers.0.ffn.experts", "layers.0.mlp.experts", "mtp.0.ffn.experts"} <= \
        set(cfg["quantization_config"]["ignored_layers"])
    # vLLM matches its own module names exactly; the MTP block is its layer num_hidden_layers + k
    vllm_names = {"model.layers.0.ffn.experts", "model.layers.3.ffn.experts"}
    assert vllm_names <= set(cfg["quantization_config"]["ignored_layers"])
    # SGLang's MTP draft model matches its own module name exactly: the block is model.decoder
    assert "model.decoder.mlp.experts" in cfg["quantization_config"]["ignored_layers"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (bf16_out / name).read_bytes() == (tiny_ckpt / name).read_bytes()


def test_shards_bounded_by_shard_size_and_index_sorted(bf16_out):
    index = json.loads((bf16_out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    assert list(index["weight_map"]) == sorted(index["weight_map"])
    for s in shards:  # every shard holds at most 3 MB of tensors unless one tensor alone is larger
        with safe_open(str(bf16_out / s), "pt") as f:
            sizes = [f.get_tensor(k).nbytes for k in f.keys()]  # noqa: SIM118 - safe_open is not a dict
        assert sum(sizes) <= 3_000_000 or len(sizes) == 1
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in load_all(bf16_out).values())


def test_manifest_records_everything(tiny_ckpt, bf16_out):
    m = read_manifest(bf16_out, require_complete=True)
    assert m.schema == "fimoe-manifest/1" and m.complete is True
    assert m.tool.name == "fimoe-convert" and m.tool.torch
    assert m.model.hidden_size == 256 and m.model.moe_blocks == 4
    assert m.target.name == "bf16"
    src_files = {p.name for p in tiny_ckpt.iterdir()}
    assert set(m.source.files) == src_files
    assert {k: v.sha256 for k, v in m.source.files.items()} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tiny_ckpt.iterdir()}
    out_files = {p.name for p in bf16_out.iterdir()} - {MANIFEST_NAME}
    assert set(m.files) == out_files
    assert set(m.status.values()) == {"written"}
    # what is read is what was written
    assert dumps(m.to_json()) == (bf16_out / MANIFEST_NAME).read_bytes()


def test_verify_passes_then_fails_on_a_flipped_byte(bf16_out, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(bf16_out, out)
    assert verify(str(out)).problems == []
    shard = sorted(out.glob("model-*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = verify(str(out)).problems
    assert len(problems) == 1 and shard.name in problems[0] and "sha256" in problems[0]


def test_verify_deep_rederives_from_source(bf16_out, tiny_ckpt):
    r = verify(str(bf16_out), deep=True, src=str(tiny_ckpt))
    assert r.problems == [] and r.deep_checked == 8


def test_two_runs_are_byte_identical(tiny_ckpt, bf16_out, tmp_path):
    out = tmp_path / "again"
    convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB")
    assert folder_bytes(out) == folder_bytes(bf16_out)


@pytest.mark.parametrize("writers", [2, 3, 7])
def test_any_number_of_writers_gives_the_same_folder(tiny_ckpt, bf16_out, tmp_path, writers):
    """Shards written at once in lanes (each unit split between lanes is converted in each): same bytes."""
    out = tmp_path / "lanes"
    convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB", writers=writers)
    assert folder_bytes(out) == folder_bytes(bf16_out)


def test_writers_must_be_positive(tiny_ckpt, tmp_path):
    with pytest.raises(UsageError, match=r"^--writers 0: expected 1 or more shards written at once \(or leave it out: "
                                         r"auto\)$"):
        convert(str(tiny_ckpt), str(tmp_path / "o"), "bf16", writers=0)


class _Interrupt(KeyboardInterrupt):
    pass


def test_resume_after_interrupt_gives_identical_output(tiny_ckpt, bf16_out, tmp_path):
    out = tmp_path / "out"

    def stop_after_the_first_written_shard(done, total):
        """Stopped at the first chunk after the manifest records a shard as written: not at a share of the bytes,
        which the shards written side by side may reach before any of them is finished."""
        manifest = out / MANIFEST_NAME
        if manifest.exists() and "written" in json.loads(manifest.read_text())["status"].values():
            raise _Interrupt

    with pytest.raises(_Interrupt):
        convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB", progress=stop_after_the_first_written_shard)
    m = read_manifest(out)
    assert m.complete is False and "written" in m.status.values() and "pending" in m.status.values()
    assert not list(out.glob("*.fimoe-tmp")) and not (out / "model.safetensors.index.json").exists()
    assert verify(str(out)).problems  # a torn OUT never verifies
    res = convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB", resume=True)
    assert 0 < res.shards_kept < res.shards
    assert folder_bytes(out) == folder_bytes(bf16_out)


@pytest.mark.parametrize("kwargs, match", [
    ({}, r"OUT .*: is not empty; it holds a complete conversion \(--target bf16, \d+ files\); pass --overwrite"),
    ({"resume": True, "shard_size": "2MB"}, r"--resume: .* other options \(shard_size differ"),
    ({"resume": True, "overwrite": True}, r"--resume and --overwrite: pass one of them"),
])
def test_refusals_on_existing_out(tiny_ckpt, bf16_out, tmp_path, kwargs, match):
    out = tmp_path / "out"
    shutil.copytree(bf16_out, out)
    kwargs.setdefault("shard_size", "3MB")
    with pytest.raises((UsageError, ValidationError), match=match):
        convert(str(tiny_ckpt), str(out), "bf16", **kwargs)


def test_overwrite_replaces_and_resume_of_complete_keeps_all(tiny_ckpt, bf16_out, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(bf16_out, out)
    res = convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB", resume=True)
    assert res.shards_kept == res.shards and res.bytes_written == 0
    res = convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB", overwrite=True)
    assert res.shards_kept == 0
    assert folder_bytes(out) == folder_bytes(bf16_out)


@pytest.mark.parametrize("where", ["inside", "same"])
def test_out_inside_or_equal_to_src_is_refused(tiny_copy, where):
    out = tiny_copy / "out" if where == "inside" else tiny_copy
    with pytest.raises(ValidationError, match=r"OUT .*: lies inside SRC"):
        convert(str(tiny_copy), str(out), "bf16")


def test_scale_byte_255_names_the_tensor_and_leaves_nothing_complete(tmp_path):
    src = make_checkpoint(tmp_path / "src", "tiny")
    name = "layers.2.ffn.experts.5.w2.scale"
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    shard = src / index[name]
    from fimoe_convert.files.safetensors.header import read_header

    info = read_header(shard).tensors[name]
    data = bytearray(shard.read_bytes())
    data[info.start + 3] = 255
    shard.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(
        CorruptTensorError, match=r"tensor 'layers\.2\.ffn\.experts\.5\.w2\.scale': 1 scale bytes are 255"
    ):
        convert(str(src), str(out), "bf16")
    assert read_manifest(out).complete is False
    assert not (out / "model.safetensors.index.json").exists()
    assert not list(out.glob("*.fimoe-tmp"))


def test_dry_run_writes_nothing(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    res = convert(str(tiny_ckpt), str(out), "bf16", dry_run=True, shard_size="3MB")
    assert res.dry_run and not out.exists()
    assert res.bytes_written == sum(r.bytes for r in res.plan) and res.free_disk > 0
    assert res.bytes_read == sum(p.stat().st_size for p in tiny_ckpt.glob("*.safetensors")) - sum(
        8 + int.from_bytes(p.read_bytes()[:8], "little") for p in tiny_ckpt.glob("*.safetensors"))


def test_ep_size_puts_each_rank_in_its_own_shards(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    convert(str(tiny_ckpt), str(out), "bf16", ep_size=2)
    m = read_manifest(out)
    assert m.ep.to_json() == {"world_size": 2, "expert_ranges": [[0, 4], [4, 8]]}
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    shard_of_rank = {0: set(), 1: set()}
    for name, shard in index.items():
        if ".ffn.experts." in name:
            shard_of_rank[int(name.split(".experts.")[1].split(".")[0]) // 4].add(shard)
    assert shard_of_rank[0] and shard_of_rank[1] and not (shard_of_rank[0] & shard_of_rank[1])
    others = {s for n, s in index.items() if ".ffn.experts." not in n}
    assert not (others & (shard_of_rank[0] | shard_of_rank[1]))


def test_output_pool_reuses_only_its_own_tensors():
    """CPU dequant outputs come back from the writer for reuse; a tensor the pool did not hand out is
    never taken in, and at most `keep` idle tensors of a shape are kept."""
    from fimoe_convert.targets.base import OutputPool

    pool = OutputPool(keep=1)
    a = pool.take((2, 3), torch.bfloat16)
    pool.give(a)
    assert pool.take((2, 3), torch.bfloat16) is a
    foreign = torch.empty(2, 3, dtype=torch.bfloat16)
    pool.give(foreign)
    got = pool.take((2, 3), torch.bfloat16)
    assert got is not foreign and got is not a
    b = pool.take((2, 3), torch.bfloat16)
    pool.give(got)
    pool.give(b)
    assert pool.take((2, 3), torch.bfloat16) is got  # b was over the limit: dropped
    fresh = pool.take((2, 3), torch.bfloat16)
    assert fresh is not got and fresh is not b
    assert pool.take((3, 2), torch.bfloat16).shape == (3, 2)


def test_dense_bf16_dequantizes_every_fp8_linear_and_drops_quantization_config(tiny_ckpt, tmp_path):
    out = tmp_path / "dense"
    convert(str(tiny_ckpt), str(out), "bf16", params={"dense": "bf16"})
    src, dst = load_all(tiny_ckpt), load_all(out)
    fp8 = [n for n, t in src.items() if t.dtype == torch.float8_e4m3fn and ".ffn.experts." not in n]
    assert fp8
    for name in fp8:
        s = src[name.removesuffix(".weight") + ".scale"].float()
        want = (src[name].float() * s.repeat_interleave(128, 0)[:src[name].shape[0]]
                .repeat_interleave(128, 1)[:, :src[name].shape[1]]).to(torch.bfloat16)
        assert dst[name].dtype == torch.bfloat16 and same_bits(dst[name], want), name
        assert name.removesuffix(".weight") + ".scale" not in dst
    assert not any(t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu) for t in dst.values())
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and "expert_dtype" not in cfg
    assert verify(str(out), deep=True, src=str(tiny_ckpt)).problems == []


def test_bf16_refuses_an_unknown_param(tiny_ckpt, tmp_path):
    with pytest.raises(ValidationError, match=r"^--param dense=fp16: expected one of fp8, bf16$"):
        convert(str(tiny_ckpt), str(tmp_path / "x"), "bf16", params={"dense": "fp16"})
    with pytest.raises(ValidationError, match=r"^--param shape=x: bf16 takes dense \(fp8\|bf16\)$"):
        convert(str(tiny_ckpt), str(tmp_path / "x"), "bf16", params={"shape": "x"})
