"""Planning of pieces: tensors written by several units (row ranges), and where each unit runs in a lane."""

from types import SimpleNamespace

import pytest

from fimoe_convert.convert import KEEP_MAX, _Producer
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
    plan_units = {u.key: u for u in units}
    merged = {t.name: t for t in merge_outputs(units)}
    shard = OutShard("s", tuple(merged[n] for n in order), 0)
    plan = Plan((shard,), plan_units, 0)
    fake = SimpleNamespace(plan=plan)
    seq = _Producer._pieces(shard)
    runs, kept = _Producer._schedule(fake, seq)
    return [(seq[i][2], names) for i, names in sorted(runs.items())], sorted((seq[i][1].name, seq[i][2]) for i in kept)


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
    units = [Unit("u", "layers.0", 0, (0, 1), (), (OutTensor("A", "U8", (9,), "u", 0), OutTensor("B", "U8", (9,), "u", 0)))]
    assert schedule(units, ["A", "B"], 0) == ([("u", [("A", False), ("B", False)])], [])
