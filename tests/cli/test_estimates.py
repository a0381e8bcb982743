"""The time estimates: --dry-run's samples are units of real size (the largest and smallest of each kind, never only
a 16-byte dense rewrite), its model of a kind's time is a line through them, and the progress line's rate counts
from its first call (the start-up before it does not make 20 s of work look like 3000 s)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from fimoe_convert import console, eta
from fimoe_convert.files.output.space import write_rate


@dataclass(frozen=True)
class FakeUnit:
    key: str
    out_bytes: int
    dense: bool = False
    leg: str | None = None


EXPERTS = [FakeUnit(f"layers.{i}.ffn.experts.0", 25_000_000) for i in range(4)]
DENSE = [FakeUnit("dense:mtp.0.e_proj", 16, dense=True), FakeUnit("dense:layers.0.attn.wo_a", 4096, dense=True)]
LEGS = [FakeUnit("l1.0", 278_560, leg="l1"), FakeUnit("l1.1", 278_560, leg="l1"), FakeUnit("l2.0", 139_296, leg="l2")]


@pytest.mark.parametrize("units, want", [
    (EXPERTS + DENSE, ["layers.0.ffn.experts.0", "dense:layers.0.attn.wo_a", "dense:mtp.0.e_proj"]),
    (DENSE, ["dense:layers.0.attn.wo_a", "dense:mtp.0.e_proj"]),  # only dense units: still the largest first
    (LEGS, ["l1.0", "l2.0"]),  # one per leg: their work per byte differs
])
def test_samples_are_the_largest_and_smallest_of_each_kind(units, want):
    assert [u.key for u in eta.samples(units)] == want


@pytest.mark.parametrize("units, timed, want", [
    # four experts of one size: 4 x their time; dense: 2 units, 1 ms fixed + (4096-16) bytes at 1 ms per 4080 bytes
    (EXPERTS + DENSE, {"layers.0.ffn.experts.0": 0.5, "dense:mtp.0.e_proj": 0.001, "dense:layers.0.attn.wo_a": 0.002},
     4 * 0.5 + 2 * 0.001 + 0.001),
    (LEGS, {"l1.0": 0.03, "l2.0": 0.4}, 2 * 0.03 + 0.4),
])
def test_unit_seconds_is_a_line_through_the_samples_of_each_kind(units, timed, want):
    assert eta.unit_seconds(units, timed) == pytest.approx(want, rel=1e-12)


def test_the_progress_rate_is_that_of_the_last_seconds(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    p = console.Progress("converting", enabled=False)
    p.enabled = True  # the rank check passed; no terminal under pytest: plain lines
    now[0] = 110.0  # 10 s of start-up before the first bytes
    p(1_000_000, 100_000_000)
    assert p.line() == "converting: 1.00 MB of 100.00 MB (1%), 100.00 kB/s"  # one point: no time left yet
    now[0] = 111.0
    p(11_000_000, 100_000_000)  # 10 MB in the second since the first call
    assert p.line() == "converting: 11.00 MB of 100.00 MB (11%), 10.00 MB/s, about 9 s left"
    for second in range(1, 21):  # then 2 MB/s for 20 s: the window forgets the fast second
        now[0] = 111.0 + second
        p(11_000_000 + second * 2_000_000, 100_000_000)
    assert p.line() == "converting: 51.00 MB of 100.00 MB (51%), 2.00 MB/s, about 24 s left"


def test_the_write_probe_measures_and_leaves_nothing(tmp_path):
    out = tmp_path / "not" / "yet"  # OUT need not exist: the probe goes to the nearest folder above it
    rate = write_rate(out, 2 << 20)
    assert rate is not None and rate > 0
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_of_a_16_byte_median_estimates_seconds_not_minutes(tiny_ckpt, tmp_path):
    """scale_dtype=f32 adds 35 dense 16-byte units: timing one of them told "about 19.5 min" of a 1 s job."""
    from fimoe_convert.conversion import convert

    res = convert(str(tiny_ckpt), str(tmp_path / "out"), target="fp8_block", params={"scale_dtype": "f32"},
                  dry_run=True)
    m = re.match(r"ETA: about ([0-9.]+) s ", res.estimate)
    assert m and float(m.group(1)) < 10, res.estimate
