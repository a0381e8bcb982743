"""Planning of pieces: tensors written by several units (row ranges), and where each unit runs in a lane."""

import pytest

from fimoe_convert.pipeline.schedule import KEEP_MAX, Copy, Emit, Run, shard_steps
from fimoe_convert.plan import OutShard, OutTensor, Plan, Unit, merge_outputs, piece_rows


def chunk(key, rows, big=1000, small=2):
    """A unit writing `rows` rows of tensor W (`big` bytes a row) and of tensor S (`small` bytes a row)."""
    return Unit(key, "layers.0", 0, (0, rows), (), (OutTensor("W", "U8", (rows, big), key, 0),
                                                    OutTensor("S", "U8", (rows, small), key, 0)))


def test_merge_outputs_joins_pieces_in_unit_order_and_piece_rows_places_them():
    units = [chunk("a", 3), chunk("b", 1), Unit("c", "layers.1", 0, (0, 1), (), (OutTensor("X", "F32", (5,), "c", 0),))]
    merged = {t.name: t for t in merge_outputs(units)}
    assert merged["W"] == OutTensor("W", "U8", (4, 1000), None, 0, ("a", "b"))
    assert merged["S"].shape == (4, 2) and merged["S"].producers == ("a", "b")
    assert merged["X"] == units[2].outputs[0] and merged["X"].producers == ("c",)
    assert piece_rows(units) == {("a", "W"): (0, 3), ("a", "S"): (0, 3), ("b", "W"): (3, 4), ("b", "S"): (3, 4),
                                 ("c", "X"): (0, 5)}


def schedule(units, order, small):
    """(runs as (unit, [(tensor, kept)]), kept pieces as (tensor, unit)) of the steps of one shard."""
    merged = {t.name: t for t in merge_outputs(units)}
    shard = OutShard("s", tuple(merged[n] for n in order), 0)
    plan = Plan((shard,), {u.key: u for u in units}, 0)
    steps = shard_steps(shard, plan.piece_bytes, 16, KEEP_MAX)
    runs = [
        (s.unit, [(n, False) for n in s.writes] + [(n, True) for n in s.keeps]) for s in steps if isinstance(s, Run)
    ]
    return runs, sorted((s.tensor.name, s.unit) for s in steps if isinstance(s, Emit) and s.kept)


@pytest.mark.parametrize("small, runs, kept", [
    # S comes after all of W: each unit runs once and keeps its small S piece
    (2, [("a", [("W", False), ("S", True)]), ("b", [("W", False), ("S", True)])], [("S", "a"), ("S", "b")]),
    # an S piece over KEEP_MAX would hold the budget: its unit runs again for it
    (KEEP_MAX + 1, [("a", [("W", False)]), ("b", [("W", False)]), ("a", [("S", False)]), ("b", [("S", False)])], []),
])
def test_a_unit_runs_once_per_lane_unless_a_large_piece_comes_later(small, runs, kept):
    units = [chunk("a", 3, small=small), chunk("b", 1, small=small)]
    assert schedule(units, ["W", "S"], small) == (runs, kept)


def test_consecutive_outputs_of_one_unit_share_a_run():
    units = [
        Unit("u", "layers.0", 0, (0, 1), (), (OutTensor("A", "U8", (9,), "u", 0), OutTensor("B", "U8", (9,), "u", 0)))
    ]
    assert schedule(units, ["A", "B"], 0) == ([("u", [("A", False), ("B", False)])], [])


def test_copies_are_read_in_blocks_and_every_piece_is_emitted_after_its_run():
    """A copied tensor of 40 bytes in blocks of 16: [0,16) [16,32) [32,40), the last one marked; each Emit
    follows the Run of its unit; an empty copied tensor is one empty block."""
    units = [Unit("u", "layers.0", 0, (0, 1), (), (OutTensor("A", "U8", (9,), "u", 0),))]
    shard = OutShard("s", (OutTensor("C", "U8", (40,)), units[0].outputs[0], OutTensor("E", "U8", (0,))), 0)
    steps = shard_steps(shard, Plan((shard,), {"u": units[0]}, 0).piece_bytes, 16, KEEP_MAX)
    assert [(type(s).__name__, getattr(s, "start", None), getattr(s, "end", None), getattr(s, "last", None))
            for s in steps] == [("Copy", 0, 16, False), ("Copy", 16, 32, False), ("Copy", 32, 40, True),
                                ("Run", None, None, None), ("Emit", None, None, True), ("Copy", 0, 0, True)]
    assert isinstance(steps[0], Copy) and steps[3] == Run("u", ("A",), ())
