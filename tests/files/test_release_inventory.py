"""The fixtures' tensor inventory is the releases': `inventory()` lists (name, dtype, shape, shard) without writing
data, and the v4-flash / v4-pro presets give the numbers of the released indexes (DeepSeek-V4-Flash revision
60d8d70770c6776ff598c94bb586a859a38244f1: 46 shards, 69,187 tensors, total_size 159,609,485,896; DeepSeek-V4-Pro:
64 shards, 145,116 tensors, total_size 864,704,792,696), as several public projects that read those indexes record."""

import json
import math
from collections import Counter

import pytest

from fimoe_convert.files.sources.local import open_source
from fimoe_convert.testing import fixture_spec, inventory, make_checkpoint

BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}

RELEASES = {  # preset: (shards, tensors, total_size, MTP tensors, layers with an indexer, with a compressor)
    "v4-flash": (46, 69_187, 159_609_485_896, 1_575, 21, 41),
    "v4-pro": (64, 145_116, 864_704_792_696, 2_343, 30, 61),
}


def _count(inv, pattern):
    return sum(name.endswith(pattern) for name, *_ in inv)


@pytest.mark.slow
@pytest.mark.parametrize("preset", list(RELEASES))
def test_release_presets_reproduce_the_released_inventory(preset):
    shards, count, total, mtp, indexers, compressors = RELEASES[preset]
    inv = inventory(fixture_spec(preset))
    assert len({shard for *_, shard in inv}) == shards
    assert len(inv) == len({name for name, *_ in inv}) == count
    assert sum(BYTES[dtype] * math.prod(shape) for _, dtype, shape, _ in inv) == total
    assert sum(name.startswith("mtp.0.") for name, *_ in inv) == mtp
    assert _count(inv, ".attn.indexer.wq_b.scale") == _count(inv, ".attn.indexer.compressor.ape") == indexers
    assert _count(inv, ".attn.compressor.wkv.weight") == compressors
    assert _count(inv, ".ffn.gate.tid2eid") == 3 and "mtp.0.hc_head_fn" in {name for name, *_ in inv}


def test_v4_flash_dtypes_shapes_and_shards_are_the_released_ones():
    inv = inventory(fixture_spec("v4-flash"))
    assert Counter(dtype for _, dtype, _, _ in inv) == {"F8_E8M0": 34_167, "I8": 33_792, "BF16": 433, "F32": 417,
                                                         "F8_E4M3": 375, "I64": 3}
    table = {name: (dtype, shape, shard) for name, dtype, shape, shard in inv}
    for name, dtype, shape in [("layers.0.attn.wo_a.weight", "F8_E4M3", (8192, 4096)),
                               ("layers.0.attn.wo_a.scale", "F8_E8M0", (64, 32)),
                               ("layers.2.attn.compressor.ape", "F32", (4, 1024)),
                               ("layers.3.attn.compressor.wkv.weight", "BF16", (512, 4096)),
                               ("layers.3.attn.compressor.ape", "F32", (128, 512)),
                               ("layers.2.attn.indexer.wq_b.weight", "F8_E4M3", (8192, 1024)),
                               ("layers.2.attn.indexer.weights_proj.weight", "BF16", (64, 4096)),
                               ("layers.2.attn.indexer.compressor.wgate.weight", "BF16", (256, 4096)),
                               ("layers.2.attn.indexer.compressor.norm.weight", "BF16", (128,)),
                               ("layers.2.ffn.gate.tid2eid", "I64", (129280, 6)),
                               ("layers.42.ffn.experts.255.w2.scale", "F8_E8M0", (4096, 64))]:
        assert table[name][:2] == (dtype, shape), name
    assert "layers.1.attn.compressor.wkv.weight" not in table and "layers.3.attn.indexer.wq_b.weight" not in table
    shard = {name: s for name, (_, _, s) in table.items()}
    assert shard["embed.weight"] == "model-00001-of-00046.safetensors"
    assert shard["layers.0.attn.wq_a.weight"] == "model-00002-of-00046.safetensors"
    assert shard["layers.42.ffn.experts.0.w1.weight"] == "model-00044-of-00046.safetensors"
    assert shard["head.weight"] == shard["norm.weight"] == shard["hc_head_fn"] == "model-00045-of-00046.safetensors"
    assert {s for n, s in shard.items() if n.startswith("mtp.")} == {"model-00046-of-00046.safetensors"}


@pytest.mark.slow
def test_sparse_v4_flash_checkpoint_holds_the_inventory(tmp_path):
    src = make_checkpoint(tmp_path / "flash", "v4-flash", sparse=True)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    inv = inventory(fixture_spec("v4-flash"))
    assert index["metadata"]["total_size"] == 159_609_485_896
    assert index["weight_map"] == {name: shard for name, _, _, shard in inv}
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["compress_ratios"] == [0, 0] + [4, 128] * 20 + [4, 0] and cfg["o_groups"] == 8
    source = open_source(str(src))
    assert (source.model.num_hidden_layers, source.model.n_routed_experts) == (43, 256)


@pytest.mark.parametrize("layer, ratio, compressor, indexer", [(0, 0, None, False), (1, 4, (4, 256), True),
                                                               (2, 128, (128, 128), False)])
def test_tiny_has_every_layer_kind_of_the_release(layer, ratio, compressor, indexer):
    """tiny (head_dim 128, index_head_dim 128): one sliding-window, one CSA and one HCA layer, as compress_ratios
    says."""
    spec = fixture_spec("tiny")
    assert spec.config_ratios() == [0, 4, 128, 0] and spec.ratio(layer) == ratio
    table = {name: (dtype, shape) for name, dtype, shape, _ in inventory(spec)}
    p = f"layers.{layer}.attn"
    assert table.get(f"{p}.compressor.ape", (None, None))[1] == compressor
    assert (f"{p}.indexer.wq_b.scale" in table) == (f"{p}.indexer.compressor.ape" in table) == indexer
    if indexer:
        # a ratio-4 compressor: 2 x index_head_dim rows
        assert table[f"{p}.indexer.compressor.wkv.weight"] == ("BF16", (2 * spec.index_head_dim, spec.hidden))
        assert table[f"{p}.indexer.weights_proj.weight"] == ("BF16", (2, 256))
    assert table[f"{p}.wo_a.weight"] == ("F8_E4M3", (256, 256))  # o_groups 2 x o_lora 128, 4 x 128 / 2
    assert {"mtp.0.hc_head_fn", "mtp.0.e_proj.scale", "layers.0.ffn.gate.tid2eid"} <= set(table)
