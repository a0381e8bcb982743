"""The time estimates: --dry-run's samples are units of real size (the largest and smallest of each kind, never only
a 16-byte dense rewrite), its model of a kind's time is a line through them, the one-time costs (opening SRC and
planning, FlashInfer's import included; first calls; the model card) are measured and added, and the progress
line's rate counts from its first call (the start-up before it does not make 20 s of work look like 3000 s).
The model is tested on injected timings (a fake clock), so no test depends on how busy the machine is."""

from __future__ import annotations

import io
import re
import time
import types
from dataclasses import dataclass

import pytest

from fimoe_convert import console, conversion, eta
from fimoe_convert.files.output.space import small_write_seconds, write_rate


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
    assert eta.unit_seconds(units, {u: timed[u.key] for u in units if u.key in timed}) == pytest.approx(want, rel=1e-12)


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
    assert p.line() == "converting: 11.00 MB of 100.00 MB (11%), 10.00 MB/s, about 8.9 s left"
    for second in range(1, 21):  # then 2 MB/s for 20 s: the window forgets the fast second
        now[0] = 111.0 + second
        p(11_000_000 + second * 2_000_000, 100_000_000)
    assert p.line() == "converting: 51.00 MB of 100.00 MB (51%), 2.00 MB/s, about 24 s left"


MB = 1_000_000
COPY_MB, UNIT_MB = 200, 100  # a conversion's copies, then its units' outputs
COPY_MB_S, UNIT_MB_S = 200.0, 10.0  # copies written at I/O rate; units at their (far lower) conversion rate
RUN_S = COPY_MB / COPY_MB_S + UNIT_MB / UNIT_MB_S  # 11 s


def copies_then_units():
    """(seconds since the start, {part: (done, total)}) of each written 1 MB: the copies first, then the units."""
    t, done = 0.0, {console.COPIES: 0, console.UNITS: 0}
    for part, mb, mb_s in ((console.COPIES, COPY_MB, COPY_MB_S), (console.UNITS, UNIT_MB, UNIT_MB_S)):
        for _ in range(mb):
            t += 1 / mb_s
            done[part] += MB
            yield t, {console.COPIES: (done[console.COPIES], COPY_MB * MB), console.UNITS: (done[console.UNITS],
                                                                                          UNIT_MB * MB)}


def progress_at(monkeypatch, share: float, parts: bool):
    """A Progress fed copies_then_units() on a fake clock up to the first 1 MB past `share` of the run: (it, the
    seconds left then)."""
    now = [0.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    p = console.Progress("converting", enabled=False)
    p.enabled = True
    monkeypatch.setattr(p, "line", lambda: "")  # only the estimate is under test here, not the printing
    for t, done in copies_then_units():
        now[0] = t
        p(sum(d for d, _ in done.values()), (COPY_MB + UNIT_MB) * MB, parts=done if parts else None)
        if t >= share * RUN_S:
            break
    return p, RUN_S - now[0]


@pytest.mark.parametrize("parts, within_2x", [
    (True, True),  # copies and units each at its own seconds per byte: 9.7 s left said of 9.7 s
    (False, False),  # one byte rate, the copies' mostly: 0.5 s said of 9.7 s
])
def test_the_time_left_at_12_percent_is_within_2x_when_copies_and_units_are_rated_apart(monkeypatch, parts,
                                                                                        within_2x):
    p, truth = progress_at(monkeypatch, 0.115, parts)
    # the copies are done by then, and three units' MB: the first is the pipeline's fill, the next two have a cost
    assert p.done == (COPY_MB + 3) * MB
    said = p.seconds_left()
    assert (0.5 <= said / truth <= 2.0) is within_2x, (said, truth)


def test_the_time_left_counts_the_units_once_they_have_a_rate(monkeypatch):
    p, truth = progress_at(monkeypatch, 0.05, parts=True)  # copies under way, no unit written yet
    assert p.seconds_left() is None
    assert not console.Progress.line(p).endswith("s left")
    p, truth = progress_at(monkeypatch, 0.10, parts=True)  # one unit MB written: the pipeline's fill
    assert p.seconds_left() is None
    p, truth = progress_at(monkeypatch, 0.115, parts=True)
    assert console.Progress.line(p) == "converting: 203.00 MB of 300.00 MB (68%), 155.98 MB/s, about 9.7 s left"
    assert p.seconds_left() == pytest.approx(truth, rel=1e-9)


def test_the_write_probes_measure_and_leave_nothing(tmp_path):
    out = tmp_path / "not" / "yet"  # OUT need not exist: the probe goes to the nearest folder above it
    rate = write_rate(out, 2 << 20)
    assert rate is not None and rate > 0
    each = small_write_seconds(out)
    assert each is not None and each > 0
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_of_a_16_byte_median_estimates_seconds_not_minutes(tiny_ckpt, tmp_path):
    """scale_dtype=f32 adds 35 dense 16-byte units: timing one of them told "about 19.5 min" of a 1 s job."""
    from fimoe_convert.conversion import convert

    res = convert(str(tiny_ckpt), str(tmp_path / "out"), target="fp8_block", params={"scale_dtype": "f32"},
                  dry_run=True)
    m = re.match(r"ETA: about ([0-9.]+) s ", res.estimate)
    assert m and float(m.group(1)) < 10, res.estimate


@pytest.mark.parametrize("costs, want", [
    # one-time 1.5 + 0.25 + 0.25 s, then the stages: the longest (4 s) or their sum (8 s) over the free cores
    (eta.Costs(1.5, 0.25, 0.25, convert=4.0, read=1.0, hash=2.0, write=1.0, parallel=2.0), 2.0 + 4.0),
    (eta.Costs(1.5, 0.25, 0.25, convert=4.0, read=1.0, hash=2.0, write=1.0, parallel=1.0), 2.0 + 8.0),
    (eta.Costs(1.5, 0.25, 0.25, convert=4.0, read=1.0, hash=2.0, write=1.0, parallel=4.0), 2.0 + 4.0),
    (eta.Costs(0.0, 0.0, 0.0, convert=1.0, read=1.0, hash=1.0, write=5.0, parallel=2.0), 5.0),
    (eta.Costs(8.0, 0.0, 0.0, convert=0.5, read=0.0, hash=0.0, write=0.0, parallel=0.5), 8.5),  # never < 1 core
    (eta.Costs(1.0, 0.0, 0.0, convert=2.0, read=0.0, hash=0.0, write=0.0, parallel=1.0, metadata=0.5), 3.5),
])
def test_the_one_time_costs_come_on_top_of_the_overlapping_stages(costs, want):
    assert costs.total() == want


class FakeClock:
    """perf_counter for the module under test: moves only when the fakes below say how long their work took."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    thread_time = perf_counter


@dataclass(frozen=True)
class TimedUnit(FakeUnit):
    inputs: tuple[str, ...] = ()


class FakeTarget:
    """Converts a unit in 0.5 s + 1 s per 100 output bytes; a unit's first run takes FIRST_EXTRA_S more, and every
    unit's third run stalls (another process took the core): the median of the warm runs leaves that out."""

    FIRST_EXTRA_S = 5.0
    STALL_S = 1000.0
    opts = types.SimpleNamespace(device="cpu")
    kernel = types.SimpleNamespace(name="fake")

    def __init__(self, clock: FakeClock):
        self.clock, self.runs = clock, {}

    def run(self, unit, inputs):
        n = self.runs[unit.key] = self.runs.get(unit.key, 0) + 1
        self.clock.now += 0.5 + unit.out_bytes / 100 + (self.FIRST_EXTRA_S if n == 1 else 0.0) + \
            (self.STALL_S if n == 3 else 0.0)


@dataclass
class FakeSource:
    """Each input is as large as its unit's output, read at 1000 bytes/s."""

    clock: FakeClock
    sizes: dict

    def is_local(self, name):
        return True

    def info(self, name):
        return types.SimpleNamespace(nbytes=self.sizes[name])

    def read(self, name):
        self.clock.now += self.sizes[name] / 1000
        return name


def test_the_estimate_adds_the_measured_one_time_costs_to_the_units_and_stages(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(eta, "time", clock)  # eta's clock only: hashing and the free cores measure 0 s (1 core)
    monkeypatch.setattr(eta, "WARM_BUDGET_S", 1e9)  # every sample's WARM_RUNS warm runs, the stall among them
    units = [TimedUnit(f"u{b}", b, inputs=(f"in{b}",)) for b in (100, 200, 300)]
    plan = types.SimpleNamespace(units={u.key: u for u in units}, read_bytes=600,
                                 shards=[types.SimpleNamespace(nbytes=600)])
    source = FakeSource(clock, {f"in{b}": b for b in (100, 200, 300)})
    line, secs = eta.estimate(source, FakeTarget(clock), plan, setup_s=100.0)
    # one-time: setup 100 s + the two samples' first-run excess (2 x 5 s); card 0 s on the fake clock
    # stages: units 1.5 + 2.5 + 3.5 s (a line through u100 and u300), reading 600 bytes at 1000 bytes/s 0.6 s,
    # hashing about 0 s, OUT not measured; summed on the one free core
    assert secs == pytest.approx(100.0 + 10.0 + 7.5 + 0.6, abs=1e-6)
    assert re.match(r"ETA: about 118 s \(estimate, measured here: one-time costs about 110\.0 s \(opening SRC and "
                    r"planning 100\.0 s, first calls 10\.0 s, the model card's imports 0\.0 s\); 3 units convert in "
                    r"about 7\.5 s on cpu \(largest sample u300, 300 B in 3\.5 s\); reading 600 B at ", line), line


def test_a_dry_run_counts_the_seconds_before_its_plan_as_a_conversion_pays_them(tiny_ckpt, tmp_path, monkeypatch):
    """FlashInfer's import happens while a kernel target plans its units: 1.4 s of a 1.6 s demo conversion, left
    out of the estimate it made 7.5x too short. Here the plan takes 50 s on the conversion's (fake) clock."""
    late = [0.0]
    monkeypatch.setattr(conversion, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + late[0]))
    build_plan = conversion.build_plan

    def slow_plan(*args):
        late[0] += 50.0
        return build_plan(*args)

    monkeypatch.setattr(conversion, "build_plan", slow_plan)
    res = conversion.convert(str(tiny_ckpt), str(tmp_path / "out"), target="bf16", dry_run=True)
    assert re.search(r"opening SRC and planning 5\d\.\d s", res.estimate), res.estimate
    assert 50.0 < res.estimate_seconds < 50.0 + 60.0, res.estimate  # the rest: seconds of real work, measured


def fake_progress(monkeypatch):
    """A Progress on a fake clock (`now[0]`, seconds) that shows lines (the rank check passed)."""
    now = [0.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    p = console.Progress("converting", enabled=False)
    p.enabled = True
    return p, now


def copies_done_units_none(copied_mb: int) -> dict:
    return {console.COPIES: (copied_mb * MB, COPY_MB * MB), console.UNITS: (0, UNIT_MB * MB)}


def test_the_time_left_is_known_from_the_first_unit_run_before_any_output_is_written(monkeypatch, capsys):
    """A whole-block unit's outputs come after many seconds of copies and runs: the units' cost is that of their
    runs until then, and the first line with a time left is printed at once (not PLAIN_EVERY_S later)."""
    p, now = fake_progress(monkeypatch)
    total = (COPY_MB + UNIT_MB) * MB
    now[0] = 1.0
    p(1 * MB, total, parts=copies_done_units_none(1))
    now[0] = 1.5
    p(101 * MB, total, parts=copies_done_units_none(101))  # copies: 100 MB in 0.5 s
    assert p.seconds_left() is None and p.left() == ""  # no unit run yet: the units' cost is not known
    now[0] = 2.0
    p(101 * MB, total, parts=copies_done_units_none(101), runs_left=10.0)  # a unit run, none written
    assert p.seconds_left() == pytest.approx(99 * 0.005 + 10.0, rel=1e-12)  # copies: 99 MB left at 5 ms/MB
    assert capsys.readouterr().err.splitlines()[-1] == ("converting: 101.00 MB of 300.00 MB (34%), 100.00 MB/s, "
                                                        "about 10 s left")


@pytest.mark.parametrize("writes, runs_left, want_s", [
    # the first unit's 10 MB written 3.1 s after the copies: the pipeline's fill (its read, its first run), not
    # charged; the next 10 MB 1.1 s later: 0.11 s/MB for the 80 MB left, more than the runs' 8 s
    ([(4.1, 10), (5.2, 10)], 8.0, 80 * 0.11),
    ([(4.1, 10), (5.2, 10)], 24.0, 24.0),  # runs slower than what was written: their seconds
    # a unit's 24-byte scale written 0.1 s after its weight: its cost per byte counts once 10 MB are charged
    ([(4.1, 10), (4.2, 24e-6)], 8.0, 8.0),
    ([(4.1, 10), (4.2, 24e-6), (5.3, 10)], 8.0, (UNIT_MB - 20 - 24e-6) * 1.2 / (10 + 24e-6)),
])
def test_the_units_time_left_is_the_larger_of_their_runs_and_their_writes_after_the_pipelines_fill(monkeypatch,
                                                                                                   writes, runs_left,
                                                                                                   want_s):
    p, now = fake_progress(monkeypatch)
    total = (COPY_MB + UNIT_MB) * MB
    units = 0

    def parts() -> dict:
        return {console.COPIES: (COPY_MB * MB, COPY_MB * MB), console.UNITS: (units, UNIT_MB * MB)}

    now[0] = 1.0
    p(COPY_MB * MB, total, parts=parts())
    now[0] = 4.0
    p(COPY_MB * MB, total, parts=parts(), runs_left=27.0)  # the first unit run
    for t, mb in writes:
        now[0], units = t, units + round(mb * MB)
        p(COPY_MB * MB + units, total, parts=parts(), runs_left=runs_left)
    assert p.seconds_left() == pytest.approx(want_s, rel=1e-9)


def test_the_first_time_left_and_the_first_from_warm_runs_are_printed_at_once_then_every_few_seconds(monkeypatch,
                                                                                                     capsys):
    p, now = fake_progress(monkeypatch)
    total = (COPY_MB + UNIT_MB) * MB
    printed = []
    for t, copied, runs_left, warm in [
        (1.0, 1, None, False),
        (1.5, 101, None, False),  # no time left known yet
        (2.0, 101, 30.0, False),  # the first unit run: its time left at once
        (2.1, 102, 30.0, False),
        (2.2, 102, 10.0, True),  # a second run of its kind: at once again
        (2.3, 103, 10.0, True),  # then one every PLAIN_EVERY_S
        (7.1, 103, 10.0, True),  # 4.9 s after the last line: none
        (7.3, 103, 10.0, True),
    ]:
        now[0] = t
        p(copied * MB, total, parts=copies_done_units_none(copied), runs_left=runs_left, runs_warm=warm)
        printed += [(t, line.rpartition(", ")[2]) for line in capsys.readouterr().err.splitlines()]
    # copies: 99 MB left at 5 ms/MB, then 98 and 97 MB at 6 and 6.9 ms/MB
    assert printed == [(2.0, "about 30 s left"), (2.2, "about 11 s left"), (7.3, "about 11 s left")]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_terminals_bar_shows_the_time_left_of_the_plain_line_not_tqdms(monkeypatch):
    """tqdm's own time left comes from its byte rate (copies at disk speed): the bar shows ours instead."""
    p, now = fake_progress(monkeypatch)
    monkeypatch.setattr(console.sys, "stderr", Terminal())
    monkeypatch.setattr(console, "terminal_columns", lambda: 120)
    total = (COPY_MB + UNIT_MB) * MB
    now[0] = 1.0
    p(1 * MB, total, parts=copies_done_units_none(1))
    now[0] = 1.5
    p(101 * MB, total, parts=copies_done_units_none(101))
    now[0] = 2.0
    p(101 * MB, total, parts=copies_done_units_none(101), runs_left=10.0)
    try:
        bar = str(p.bar)
        assert p.left() == "about 10 s left" and p.line().endswith(", about 10 s left")
        assert re.fullmatch(r"converting:  34%\|.*\| 101M/300M \[00:0\d, [0-9.]+[kMGT]?B/s, about 10 s left\]",
                            bar), bar  # tqdm's own time left would follow the elapsed time as `00:00<00:05`
    finally:
        p.close()


def test_a_conversion_tells_of_a_unit_run_before_its_outputs_are_written(tiny_ckpt, tmp_path):
    calls = []

    def progress(done, total, parts=None, runs_left=None, runs_warm=False):
        calls.append((parts[console.UNITS][0], runs_left, runs_warm))

    progress.takes_parts = True
    conversion.convert(str(tiny_ckpt), str(tmp_path / "out"), target="bf16", progress=progress)
    first_run = next(i for i, (_, left, _) in enumerate(calls) if left is not None)
    assert calls[first_run][0] == 0 and calls[first_run][1] > 0  # a time left before a unit's byte is written
    assert calls[first_run][2] is False and calls[-1][1:] == (0.0, True)  # every unit run, kinds run twice


L1 = [FakeUnit(f"l1.{i}", 100, leg="l1") for i in range(4)]
L2 = [FakeUnit(f"l2.{i}", 50, leg="l2") for i in range(2)]


@pytest.mark.parametrize("ran, left_s, warm", [
    # one run: l1 at its 0.03 s/byte (first call included), l2 not run yet at the same
    ([(L1[0], 3.0)], 3 * 100 * 0.03 + 2 * 50 * 0.03, False),
    ([(L1[0], 3.0), (L2[0], 1.0)], 3 * 100 * 0.03 + 50 * 0.02, False),  # a first run of each kind
    # a second l1 run: 0.01 s/byte from it alone (the first paid compiles and warm-ups)
    ([(L1[0], 3.0), (L1[1], 1.0)], 2 * 100 * 0.01 + 2 * 50 * 0.01, True),
    # l2's first run: its own 0.02 s/byte (one run of a kind counts until it has a second)
    ([(L1[0], 3.0), (L1[1], 1.0), (L2[0], 1.0)], 2 * 100 * 0.01 + 50 * 0.02, True),
    ([(u, 1.0) for u in L1 + L2], 0.0, True),  # every unit run
])
def test_the_units_runs_left_are_timed_by_kind_from_the_runs_so_far_less_each_kinds_first_run(ran, left_s, warm):
    runs = eta.UnitRuns(L1 + L2)
    assert runs.seconds_left is None
    for unit, seconds in ran:
        runs.ran(unit, seconds)
    assert runs.seconds_left == pytest.approx(left_s, rel=1e-12, abs=1e-12)
    assert runs.warm is warm


L1_MANY = [FakeUnit(f"l1.{i}-{i + 1}", 100, leg="l1") for i in range(10)] + [FakeUnit("l1.10-11", 20, leg="l1")]


def _l1(*seconds) -> list:
    return [(L1_MANY[i], s) for i, s in enumerate(seconds)]


@pytest.mark.parametrize("ran, left_s", [
    # runs 2 and 3 still warming up (1.6 s, 1.5 s), then warm (1.0 s): the median of a size's latest 3 runs, not the
    # mean since the second run (1.28 s a unit), nor the first timed of the size by key order
    (_l1(3.0, 1.6, 1.5, 1.0, 1.0), 5 * 1.0 + 20 * 0.01),
    # the smallest size runs: a line through each size's (0.2 s at 20 bytes, 1.0 s at 100)
    (_l1(3.0, 1.6, 1.5, 1.0, 1.0) + [(L1_MANY[10], 0.2)], 5 * 0.2 + (500 - 5 * 20) * 0.01),
    (_l1(3.0, 1.0, 1.0, 1.0, 1.6), 5 * 1.0 + 20 * 0.01),  # one slow run among warm ones: not alone
    (_l1(3.0, 1.0, 1.0, 1.2, 1.2), 5 * 1.2 + 20 * 0.012),  # a slowdown that lasts: counted
])
def test_a_kinds_seconds_rest_on_its_latest_runs_of_each_size(ran, left_s):
    runs = eta.UnitRuns(L1_MANY)
    for unit, seconds in ran:
        runs.ran(unit, seconds)
    assert runs.seconds_left == pytest.approx(left_s, rel=1e-12)


@pytest.mark.parametrize("written_mb, want_s", [
    (5, 8.0),  # 5 of 100 MB written, at a warm-up pace (1 s/MB): the warm runs' 8 s alone
    (21, (UNIT_MB - 21) * 0.11),  # a tenth and more written: the larger of the two (0.11 s/MB past the fill)
])
def test_the_units_first_bytes_written_do_not_outweigh_warm_runs(monkeypatch, written_mb, want_s):
    p, now = fake_progress(monkeypatch)
    total = (COPY_MB + UNIT_MB) * MB

    def parts(units: int) -> dict:
        return {console.COPIES: (COPY_MB * MB, COPY_MB * MB), console.UNITS: (units, UNIT_MB * MB)}

    now[0] = 1.0
    p(COPY_MB * MB, total, parts=parts(0))
    now[0] = 4.0
    p(COPY_MB * MB, total, parts=parts(0), runs_left=27.0)
    now[0] = 4.1
    p(COPY_MB * MB + 1 * MB, total, parts=parts(1 * MB), runs_left=27.0)  # the pipeline's fill
    if written_mb < 10:
        now[0] = 8.1
        p(COPY_MB * MB + 5 * MB, total, parts=parts(5 * MB), runs_left=8.0, runs_warm=True)
    else:
        now[0] = 5.2
        p(COPY_MB * MB + 11 * MB, total, parts=parts(11 * MB), runs_left=8.0, runs_warm=True)
        now[0] = 6.3
        p(COPY_MB * MB + 21 * MB, total, parts=parts(21 * MB), runs_left=8.0, runs_warm=True)
    assert p.seconds_left() == pytest.approx(want_s, rel=1e-9)
