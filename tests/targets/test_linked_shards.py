"""A unit whose outputs span shards (a whole-block moe_ep unit at a 2 GB shard size) is read and converted once,
and a lane's budget holds two such units when half of --max-memory has room for them."""

import collections
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from fimoe_convert import convert
from fimoe_convert.budget import IO_BLOCK, READ_AHEAD_MAX, MemoryBudget
from fimoe_convert.pipeline.feeder import KEEP_MAX
from fimoe_convert.pipeline.reads import in_file_order, source_reads
from fimoe_convert.pipeline.schedule import Emit, Run, group_steps, linked_groups
from fimoe_convert.plan import OutShard, OutTensor, Plan, Unit

GB = 10**9


def two_output_unit(key):
    return Unit(key, "layers.0", 0, (0, 1), (), (OutTensor(f"{key}.A", "U8", (9,), key, 0),
                                                 OutTensor(f"{key}.B", "U8", (9,), key, 0)))


def test_shards_sharing_a_unit_are_one_group_and_the_unit_runs_once():
    u, v = two_output_unit("u"), two_output_unit("v")
    s1, s2, s3 = (OutShard("s1", u.outputs[:1], 0), OutShard("s2", u.outputs[1:] + v.outputs[:1], 0),
                  OutShard("s3", v.outputs[1:], 0))
    c = OutShard("c", (OutTensor("C", "U8", (4,)),), None)
    assert linked_groups([c, s1, s2, s3, c]) == [[c], [s1, s2, s3], [c]]
    plan = Plan((s1, s2, s3), {"u": u, "v": v}, 0)
    steps = group_steps([s1, s2, s3], plan.piece_bytes, 16, KEEP_MAX)
    assert steps == [s1, Run("u", ("u.A", "u.B"), ()), Emit(u.outputs[0], "u", True, False),
                     s2, Emit(u.outputs[1], "u", True, False), Run("v", ("v.A", "v.B"), ()),
                     Emit(v.outputs[0], "v", True, False), s3, Emit(v.outputs[1], "v", True, False)]


class _Src:
    """What source_reads asks of SRC: where each tensor lies, {name: (shard, offset, bytes)}."""

    def __init__(self, where: dict):
        self.where = where
        self.weight_map = {n: w[0] for n, w in where.items()}

    def info(self, name):
        return SimpleNamespace(start=self.where[name][1], nbytes=self.where[name][2])


def test_the_reads_a_stream_plans_are_the_feeders_a_unit_spanning_shards_read_once():
    """--stream holds a source piece until every planned read of it is made: a unit whose outputs span two shards
    is read once (its group's run), so it is planned once; a copied tensor is read in IO_BLOCK parts."""
    u, v = (Unit(k, "layers.0", 0, (0, 1), (f"{k}.in1", f"{k}.in2"), two_output_unit(k).outputs) for k in "uv")
    s1, s2, s3 = (OutShard("s1", u.outputs[:1], 0), OutShard("s2", u.outputs[1:] + v.outputs[:1], 0),
                  OutShard("s3", (*v.outputs[1:], OutTensor("C", "U8", (IO_BLOCK + 5,))), 0))
    plan = Plan((s1, s2, s3), {"u": u, "v": v}, 0)
    src = _Src({n: ("a", 7 * i, 7) for i, n in enumerate(["u.in1", "u.in2", "v.in1", "v.in2", "C"])})
    assert source_reads(plan, [s1, s2, s3], src) == [("u.in1", 7), ("u.in2", 7), ("v.in1", 7), ("v.in2", 7),
                                                     ("C", IO_BLOCK), ("C", 5)]


@pytest.mark.parametrize("lanes, order", [
    (1, ["u.in1", "u.in2", "v.in1", "v.in2", "w.in1", "w.in2"]),  # one lane: group after group
    (2, ["u.in1", "v.in1", "v.in2", "w.in1", "w.in2", "u.in2"]),  # w on v's lane, free after 2 bytes, not u's (20)
    (3, ["u.in1", "v.in1", "w.in1", "v.in2", "w.in2", "u.in2"]),  # at 0, 0, 0, then 1, 4, 10 bytes in
])
def test_the_reads_a_stream_plans_interleave_as_the_lanes_read(lanes, order):
    """Lanes write groups side by side, each at its own pace (its bytes): the plan's order is theirs. u's group reads
    10 + 10 bytes, v's 1 + 1, w's 4 + 4."""
    units = {k: Unit(k, "layers.0", 0, (0, 1), (f"{k}.in1", f"{k}.in2"), two_output_unit(k).outputs) for k in "uvw"}
    shards = [OutShard(f"s{k}", units[k].outputs, 0) for k in "uvw"]
    size = {"u": 10, "v": 1, "w": 4}
    src = _Src({f"{k}.in{i}": (f"{k}.safetensors", 100 * i, size[k]) for k in "uvw" for i in (1, 2)})
    got = source_reads(Plan(tuple(shards), units, 0), shards, src, lanes)
    assert [n for n, _ in got] == order and all(n == size[name[0]] for name, n in got)


def test_a_unit_reads_its_inputs_in_the_order_they_lie_in_src():
    """A streamed shard arrives front to back: a unit that lists its inputs otherwise reads them as they lie (shard,
    then offset), so each piece it reads can go at once."""
    u = Unit("u", "layers.0", 0, (0, 1), ("u.w2", "u.w1", "u.w3", "u.s"), two_output_unit("u").outputs)
    s1 = OutShard("s1", u.outputs, 0)
    src = _Src({"u.w1": ("a", 0, 3), "u.w2": ("a", 3, 3), "u.w3": ("a", 6, 3), "u.s": ("b", 0, 1)})
    assert in_file_order(u.inputs, src) == ["u.w1", "u.w2", "u.w3", "u.s"]
    assert source_reads(Plan((s1,), {"u": u}, 0), [s1], src) == [("u.w1", 3), ("u.w2", 3), ("u.w3", 3), ("u.s", 1)]


def test_a_shard_alone_is_its_own_group():
    u = two_output_unit("u")
    s1, s2 = OutShard("s1", u.outputs[:1], 0), OutShard("s2", (OutTensor("C", "U8", (4,)),), None)
    assert linked_groups([s1, s2]) == [[s1], [s2]]
    assert [type(s).__name__ for s in group_steps([s1], Plan((s1,), {"u": u}, 0).piece_bytes, 16, KEEP_MAX)] == [
        "OutShard", "Run", "Emit"]


@pytest.mark.parametrize("memory, unit, budget", [
    (24 * GB, 6_650_000_000, 6 * GB),  # two 6.65 GB units (26.6 GB) need more than half: a quarter, one unit
    (56 * GB, 6_650_000_000, 26_600_000_000),  # half has room for two units: they overlap
    (64 * GB, 1 * GB, 4 * GB),  # a quarter already holds two units
    (8 * GB, 1 << 20, READ_AHEAD_MAX),  # small units: read ahead READ_AHEAD_MAX
])
def test_lane_budget_holds_two_units_where_half_the_memory_has_room(memory, unit, budget):
    assert MemoryBudget(memory).lane_bytes(unit) == budget


def test_whole_block_units_across_shards_run_once_and_write_the_same_tensors(tmp_path, monkeypatch):
    pytest.importorskip("flashinfer.moe_ep")
    from fimoe_convert.targets import moe_ep
    from fimoe_convert.testing import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "src", "tiny", layers=2, hash_layers=1, mtp=1, extreme_scales=False)
    target, params = "sm90_fp8_fp8_bf16_pull_cutedsl", {"fp8_scale_mode": "blockwise"}
    whole = convert(str(ckpt), str(tmp_path / "whole"), target, params=params)
    calls = collections.Counter()
    run = moe_ep.MoeEpTarget.run
    monkeypatch.setattr(moe_ep.MoeEpTarget, "run", lambda self, u, i: calls.update([u.key]) or run(self, u, i))
    split = convert(str(ckpt), str(tmp_path / "split"), target, params=params, shard_size="300KB")
    assert dict(calls) == {f"{b}.ffn.experts.ep0": 1 for b in ("layers.0", "layers.1", "mtp.0")}
    # every block's fc1 weight has a shard of its own at 300 KB: the outputs span shards
    assert split.shards > whole.shards + 3

    def tensors(out):
        got = {}
        for f in sorted(out.glob("model-*.safetensors")):
            got.update(load_file(f))
        return got

    a, b = tensors(tmp_path / "whole"), tensors(tmp_path / "split")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].view(-1).view(torch.uint8).equal(b[k].view(-1).view(torch.uint8)), k


@pytest.mark.parametrize("writers", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_a_lane_writes_two_shards_at_once_and_never_more(tmp_path, monkeypatch, writers):
    """Each shard has its own sha256 stream: a lane opens the next shard while the one before is still being
    finished (here: held open until a second writer of the same lane exists), and at most SHARDS_PER_LANE."""
    import threading

    from fimoe_convert.budget import SHARDS_PER_LANE
    from fimoe_convert.pipeline import lanes
    from fimoe_convert.testing import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "src", "tiny", layers=2, hash_layers=1, mtp=1, extreme_scales=False)
    opened, lock, most = [0], threading.Lock(), []
    second = threading.Event()

    class Tracked(lanes.ShardWriter):
        def __enter__(self):
            with lock:
                opened[0] += 1
                most.append(opened[0])
                if opened[0] >= 2:
                    second.set()
            return super().__enter__()

        def finish(self):
            second.wait(timeout=10)  # under one writer per lane this times out and `most` stays 1 (one lane)
            return super().finish()

        def __exit__(self, *exc):
            with lock:
                opened[0] -= 1
            return super().__exit__(*exc)

    monkeypatch.setattr(lanes, "ShardWriter", Tracked)
    ref = convert(str(ckpt), str(tmp_path / "ref"), "bf16", shard_size="300KB", writers=writers)
    assert ref.shards > 4
    assert 2 <= max(most) <= SHARDS_PER_LANE * writers
    monkeypatch.undo()
    plain = convert(str(ckpt), str(tmp_path / "plain"), "bf16", shard_size="300KB", writers=writers)
    for f in sorted((tmp_path / "ref").glob("model-*.safetensors")):
        assert f.read_bytes() == (tmp_path / "plain" / f.name).read_bytes(), f.name
    assert plain.shards == ref.shards
