"""The one memory budget (--max-memory): unit size, the unit check, the writer lanes; and the version parser."""

import os
import re

import pytest

from fimoe_convert import versions
from fimoe_convert.budget import IO_BLOCK, STAGE_BLOCKS, MemoryBudget
from fimoe_convert.errors import ValidationError

MiB, GiB = 2**20, 2**30


@pytest.mark.parametrize("total, unit", [(8 * GiB, 64 * MiB), (2 * GiB, 64 * MiB), (1 * GiB, 32 * MiB),
                                         (32 * MiB, 1 * MiB), (31, 0)])
def test_unit_bytes_is_64_mib_or_a_32nd_of_the_budget(total, unit):
    assert MemoryBudget(total).unit_bytes == unit


@pytest.mark.parametrize("total, out_bytes, by_rank, match", [
    (100 * MiB, 60 * MiB, True, r"^--max-memory 100MiB: one unit of work \(u\) needs about 125.83 MB \(its output "
                                r"and its inputs\); raise --max-memory to at least 125.83 MB, or use --ep-size 2 "
                                r"\(about 62.91 MB a unit\)$"),
    (100 * MiB, 60 * MiB, False, r"^--max-memory 100MiB: .* raise --max-memory to at least 125.83 MB$"),
])
def test_a_unit_that_does_not_fit_is_refused_naming_memory_and_ep_size(total, out_bytes, by_rank, match):
    budget = MemoryBudget(total, "100MiB")
    budget.check_unit("u", 50 * MiB, ep_size=1, experts=8, by_rank=by_rank)  # 100 MiB needed: fits exactly
    with pytest.raises(ValidationError) as e:
        budget.check_unit("u", out_bytes, ep_size=1, experts=8, by_rank=by_rank)
    assert re.match(match, e.value.problems[0]), e.value.problems[0]


@pytest.mark.parametrize("total, biggest, lane", [
    (8 * GiB, 1 * MiB, 128 * MiB),  # read-ahead
    (8 * GiB, 64 * MiB, 256 * MiB),  # two units in, two out
    (256 * MiB, 64 * MiB, 64 * MiB),  # a quarter of the budget
    (32 * MiB, 1 * MiB, IO_BLOCK),  # at least one I/O block
])
def test_lane_bytes(total, biggest, lane):
    assert MemoryBudget(total).lane_bytes(biggest) == lane


@pytest.mark.parametrize("cores, writers, shards, total, lanes", [
    (16, None, 10, 8 * GiB, 4),  # a lane per 4 cores, at most 4
    (64, None, 10, 8 * GiB, 4),
    (8, None, 10, 8 * GiB, 2),
    (2, None, 10, 8 * GiB, 1),
    (16, None, 2, 8 * GiB, 2),  # no more lanes than shards
    (16, None, 10, 1 * GiB, 1),  # a quarter of 1 GiB holds one lane of 128 MiB and its 48 MiB of write buffers
    (16, 3, 10, 64 * MiB, 3),  # --writers as given
])
def test_lane_count(monkeypatch, cores, writers, shards, total, lanes):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    budget = MemoryBudget(total)
    assert budget.lane_count(writers, shards, budget.lane_bytes(1 * MiB)) == lanes
    assert 48 * MiB == STAGE_BLOCKS * IO_BLOCK


@pytest.mark.parametrize("text, parsed", [("0.7.4", (0, 7, 4)), ("0.7.4.post1", (0, 7, 4)), ("2.13.0+cpu", (2, 13, 0)),
                                          ("0.8.0rc1", (0, 8, 0)), ("1.2", (1, 2)), ("1.2.3.4", (1, 2, 3)),
                                          ("not a version", ())])
def test_version_parse(text, parsed):
    assert versions.parse(text) == parsed


@pytest.mark.parametrize("total, lanes, lane, unit, hold", [
    (8 * GiB, 0, 0, 0, 2 * GiB),  # before the plan: a quarter
    (8 * GiB, 4, 256 * MiB, 64 * MiB, 8 * GiB - 4 * (256 + 96 + 128) * MiB - 1 * GiB),  # what the lanes leave
    (8 * GiB, 1, 128 * MiB, 1 * MiB, 8 * GiB - (128 + 96 + 2) * MiB - 1 * GiB),
    (2 * GiB, 4, 256 * MiB, 64 * MiB, 512 * MiB),  # the lanes take more than three quarters: a quarter
])
def test_stream_bytes_is_what_the_lanes_leave_or_a_quarter(total, lanes, lane, unit, hold):
    assert MemoryBudget(total).stream_bytes(lanes, lane, unit) == hold


@pytest.mark.parametrize("hold", [1 * MiB, 300 * MiB, 1 * GiB, 5 * GiB, 12 * GiB])
@pytest.mark.parametrize("lanes, lane, unit", [(4, 256 * MiB, 64 * MiB), (1, 128 * MiB, 1 * MiB)])
def test_stream_need_is_the_least_budget_that_holds(hold, lanes, lane, unit):
    need = MemoryBudget(0).stream_need(hold, lanes, lane, unit)
    assert MemoryBudget(need).stream_bytes(lanes, lane, unit) >= hold
    assert MemoryBudget(need - 1).stream_bytes(lanes, lane, unit) < hold
