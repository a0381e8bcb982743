"""The time a conversion is estimated to take, printed by `--dry-run` and labeled as an estimate.

Measured, not assumed, on samples of real size: for each kind of unit (routed experts, each leg of them; dense
rewrites), the largest and the smallest unit are read and converted on a thread of their own, as the pipeline
converts, then converted again (up to WARM_RUNS times, the median kept), which gives a cost per unit and per byte
and the first call's excess (kernel compiles, torch's first use). The one-time costs a conversion pays before and
after its units are measured too: the seconds the caller took to open SRC and plan (FlashInfer's import, for a
kernel target: most of a small conversion's time), the first calls' excess, the model card's imports and, given
OUT, its small files (each fsynced: a probe of one). SRC's read rate comes from reading at least SAMPLE_READ_BYTES of
inputs, the sha256 rate from hashing HASH_SAMPLE_BYTES (a conversion hashes every input and every output), and,
given OUT, its disk's write rate from a probe file written as shards are. The stages overlap in the pipeline but
share the cores: their part is the larger of the longest stage and their sum spread over the cores free now (the
speed-up of hashing on several threads at once); the one-time costs come on top. For a Hub repo whose weights are
not downloaded, the units are zeros of the same dtypes and shapes (the conversion's time does not depend on the
values), and only the conversion's share is estimated."""

from __future__ import annotations

import collections
import hashlib
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass

from .errors import FimoeError
from .files.output.space import small_write_seconds, write_rate as write_rate_of
from .sizes import duration, human

SAMPLE_READ_BYTES = 64 * 1000**2  # bytes of SRC read to measure its read rate (all of SRC if it is smaller)
HASH_SAMPLE_BYTES = 8 * 1000**2  # bytes hashed (best of three) to measure sha256's rate
WRITE_SAMPLE_BYTES = 32 << 20  # bytes written to a probe file in OUT to measure its disk's write rate
PARALLEL_PROBES = 5  # probes of the free cores, the median kept
WARM_RUNS = 3  # warm runs of each sample unit at most, the median kept: a busy machine stalls one now and then
WARM_BUDGET_S = 0.5  # seconds of warm runs per sample unit after which no more are started
LATEST_RUNS = 3  # runs of a size whose median times it during a conversion (eta.UnitRuns)


@dataclass(frozen=True)
class Costs:
    """Seconds a conversion is estimated to take, by part. Paid once, one after the other: `setup` (opening SRC and
    planning, FlashInfer's import included for a kernel target), `first_calls` (the sample units' first runs'
    excess over their warm runs), `card` (the model card's imports), `metadata` (OUT's small files). Stages over
    the whole conversion, overlapping in the pipeline: `convert` (every unit), `read`, `hash`, `write`, with
    `parallel` cores' worth of them at once."""

    setup: float
    first_calls: float
    card: float
    convert: float
    read: float
    hash: float
    write: float
    parallel: float
    metadata: float = 0.0  # the manifest, index, config, model card and copied files, each written and fsynced

    @property
    def once(self) -> float:
        return self.setup + self.first_calls + self.card + self.metadata

    def total(self) -> float:
        """The one-time costs, then the stages: the longest of them, or their sum spread over the free cores."""
        stages = (self.convert, self.read, self.hash, self.write)
        return self.once + max(*stages, sum(stages) / max(self.parallel, 1.0))


def _secs(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.1f} s"


def _kind(u) -> tuple:
    """Units of one kind do the same work per byte: dense rewrites, and each leg of the experts' (a megamoe l2 unit
    takes ten times an l1 unit half its size)."""
    return (u.dense, u.leg or "")


def _ends(units, kind) -> tuple:
    """The largest and the smallest unit of `kind` (one unit twice when they are all of a size)."""
    same = sorted((u for u in units if _kind(u) == kind), key=lambda u: (u.out_bytes, u.key))
    return (same[-1] if same[-1].out_bytes > same[0].out_bytes else same[0]), same[0]


def samples(units) -> list:
    """The units timed: the largest and the smallest of each kind, largest first."""
    picked = {u for kind in {_kind(u) for u in units} for u in _ends(units, kind)}
    return sorted(picked, key=lambda u: (-u.out_bytes, u.key))


def unit_seconds(units, timed: dict) -> float:
    """The seconds `units` take to convert, from `timed` {unit: seconds}: the dry run's samples(units), or the units
    a conversion ran so far (UnitRuns). Per kind, a line through its smallest and largest timed unit (a fixed cost
    per unit and a cost per byte), or where its timed units are of one size their seconds per byte; a kind with
    none timed at the seconds per byte of all the timed units."""
    ends: dict[tuple, _Timed] = {}
    for u, secs in timed.items():
        ends.setdefault(_kind(u), _Timed()).add(u, secs)
    return _kinds_seconds(_kind_totals(units), ends)


def _kind_totals(units) -> dict[tuple, list[int]]:
    """{kind: [units, their output bytes]}."""
    kinds: dict[tuple, list[int]] = {}
    for u in units:
        count_bytes = kinds.setdefault(_kind(u), [0, 0])
        count_bytes[0] += 1
        count_bytes[1] += u.out_bytes
    return kinds


class _Timed:
    """A kind's timed units: the smallest and the largest (by output bytes) with their seconds (the median of the
    latest runs of that size)."""

    def __init__(self):
        self.small = self.big = None
        self.t_small = self.t_big = 0.0

    def add(self, unit, seconds: float) -> None:
        # the smallest and the largest size each timed by the median of its latest LATEST_RUNS runs: warm ones, not
        # the first timed (a kind's second run can still pay warm-ups: 1.6x a warm one, measured), and not one
        # run's noise alone
        if self.small is None or unit.out_bytes <= self.small.out_bytes:
            if self.small is None or unit.out_bytes < self.small.out_bytes:
                self.small_runs = collections.deque(maxlen=LATEST_RUNS)
            self.small_runs.append(seconds)
            self.small, self.t_small = unit, statistics.median(self.small_runs)
        if self.big is None or unit.out_bytes >= self.big.out_bytes:
            if self.big is None or unit.out_bytes > self.big.out_bytes:
                self.big_runs = collections.deque(maxlen=LATEST_RUNS)
            self.big_runs.append(seconds)
            self.big, self.t_big = unit, statistics.median(self.big_runs)


def _kinds_seconds(kinds: dict[tuple, list[int]], timed: dict[tuple, _Timed]) -> float:
    """unit_seconds of {kind: [units, their output bytes]}, from {kind: its timed units}."""
    # seconds per byte from each kind's latest run of its largest size: a mean over every run so far keeps the
    # warm-ups of the first ones for long (1.5x the truth a fifth into a megamoe run, measured)
    per_byte_all = sum(t.t_big for t in timed.values()) / max(sum(t.big.out_bytes for t in timed.values()), 1)
    total = 0.0
    for kind, (count, nbytes) in kinds.items():
        t = timed.get(kind)
        if t is None:
            total += nbytes * per_byte_all
        elif t.big.out_bytes > t.small.out_bytes:
            per_byte = max(t.t_big - t.t_small, 0.0) / (t.big.out_bytes - t.small.out_bytes)
            total += count * t.t_small + (nbytes - count * t.small.out_bytes) * per_byte
        else:  # one size timed: its latest run's seconds per byte for all of the kind
            total += nbytes * t.t_big / max(t.big.out_bytes, 1)
    return total


class UnitRuns:
    """The units' runs as a conversion's lanes report them, and the seconds the units not yet run will take
    (unit_seconds through the runs so far, kept up to date run by run: it is read at every written chunk, and a
    model has thousands of units). A kind's first run pays compiles and warm-ups once (the dry run's first
    calls): it counts only until that kind has a second run. Seconds are those of the lanes at once."""

    def __init__(self, units):
        self.todo = {u.key for u in units}
        self.kinds = _kind_totals(units)  # {kind: [units not yet run, their output bytes]}
        self.runs: dict[tuple, int] = {}  # {kind: its units run}
        self.timed: dict[tuple, _Timed] = {}  # {kind: its runs that count}
        self.seconds_left: float | None = None  # None before any unit has run
        self.warm = False  # a kind has run twice: seconds_left rests on a run past the compiles and warm-ups

    def ran(self, unit, seconds: float) -> None:
        kind = _kind(unit)
        if unit.key in self.todo:
            self.todo.discard(unit.key)
            self.kinds[kind][0] -= 1
            self.kinds[kind][1] -= unit.out_bytes
        self.runs[kind] = self.runs.get(kind, 0) + 1
        if self.runs[kind] <= 2:  # the kind's first run, or its second, which replaces the first
            self.timed[kind] = _Timed()
        self.warm = self.warm or self.runs[kind] > 1
        self.timed[kind].add(unit, seconds)
        self.seconds_left = _kinds_seconds(self.kinds, self.timed)


def _cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _parallelism(cores: int) -> float:
    """How many of the cores this process gets now (other processes may hold some): the speed-up of sha256 over
    the same bytes on up to four threads at once (hashlib lets go of the GIL), between 1 and that count; the
    median of PARALLEL_PROBES (one probe of a few ms read 2.0 free cores of a machine at load 8, then 1.0)."""
    n = min(cores, 4)
    if n < 2:
        return 1.0
    data = bytes(HASH_SAMPLE_BYTES // 2)

    def probe() -> float:
        t0 = time.perf_counter()
        hashlib.sha256(data).digest()
        one = time.perf_counter() - t0
        threads = [threading.Thread(target=lambda: hashlib.sha256(data).digest()) for _ in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return min(max(n * one / max(time.perf_counter() - t0, 1e-6), 1.0), float(n))

    return statistics.median(probe() for _ in range(PARALLEL_PROBES))


def _card_seconds() -> float:
    """Seconds to import what the model card is made with (huggingface_hub's ModelCard), which a conversion pays
    once at its end (1-2 s on a busy 2-core machine); 0 where this process has it already."""
    if "huggingface_hub.repocard" in sys.modules:
        return 0.0
    t0 = time.perf_counter()
    from huggingface_hub import ModelCard  # noqa: F401 - imported to be timed

    return time.perf_counter() - t0


def _hash_rate() -> float:
    """sha256's bytes per second on one core, from this thread's CPU time: the core's speed, not how often other
    processes took it during a few ms (that read 219 MB/s of a 1.5 GB/s core at load 6); how many cores are free
    is _parallelism's measure."""
    data, best = bytes(HASH_SAMPLE_BYTES), float("inf")  # sha256 takes as long for any bytes
    for _ in range(3):
        t0 = time.thread_time()
        hashlib.sha256(data).digest()
        best = min(best, time.thread_time() - t0)
    return len(data) / max(best, 1e-6)


def time_unit(target, unit, inputs) -> tuple[float, float]:
    """(seconds of the first run, median seconds of the warm runs after it) of `target` converting `unit`, on a
    thread of its own as the pipeline converts (on the main thread, torch's intra-op threads stalled a 3 ms unit
    for 400 ms on a busy machine); the first run counts the thread's start."""
    got: dict = {}

    def runs() -> None:
        try:
            target.run(unit, inputs)
            got["first"] = time.perf_counter() - t0
            warm: list[float] = []
            while len(warm) < WARM_RUNS and sum(warm) < WARM_BUDGET_S:
                t1 = time.perf_counter()
                target.run(unit, inputs)
                warm.append(time.perf_counter() - t1)
            got["warm"] = statistics.median(warm)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            got["error"] = e

    thread = threading.Thread(target=runs, name="fimoe-eta", daemon=True)
    t0 = time.perf_counter()
    thread.start()
    thread.join()
    if "error" in got:
        raise got["error"]
    return got["first"], got["warm"]


def estimate(source, target, plan, notice=None, out_dir=None, setup_s: float = 0.0) -> tuple[str, float | None]:
    """(one line for the user, seconds or None); `notice(line)` is told first what is timed (it takes seconds).
    With `out_dir`, its disk's write rate is measured too (a probe file, removed at once). `setup_s`: the seconds
    the caller took to open SRC and make `plan` (a conversion pays them too: FlashInfer's import for a kernel
    target, which makes most of a small conversion's time)."""
    if not plan.units:
        return "ETA: not estimated (nothing to convert)", None
    units = list(plan.units.values())
    picked = samples(units)
    local = all(source.is_local(n) for u in picked for n in u.inputs)
    device = target.opts.device
    if notice is not None:
        notice(f"timing {len(picked)} sample unit{'s' if len(picked) > 1 else ''} ("
               + ", ".join(f"{u.key}, {human(u.out_bytes)}" for u in picked)
               + f") of --target {target.kernel.name} on {device} to estimate the conversion's time...")
    timed, read_s, in_bytes, first_calls_s = {}, 0.0, 0, 0.0
    try:
        for u in picked:
            t0 = time.perf_counter()
            inputs = {n: source.read(n) if local else source.zeros(n) for n in u.inputs}
            read_s += time.perf_counter() - t0
            in_bytes += sum(source.info(n).nbytes for n in u.inputs)
            first_s, timed[u.key] = time_unit(target, u, inputs)
            first_calls_s += max(first_s - timed[u.key], 0.0)  # compiles and warm-ups: a conversion pays them too
    except FimoeError as e:
        return f"ETA: not estimated (converting a sample unit failed: {e})", None
    card_s = _card_seconds()
    units_s = unit_seconds(units, {u: timed[u.key] for u in picked})
    big = picked[0]
    sample = f"{big.key}, {human(big.out_bytes)} in {_secs(timed[big.key])}"
    if not local:  # nothing of SRC was read, so no read rate: the conversion's own share only
        convert_s = setup_s + first_calls_s + card_s + units_s
        return (f"ETA: converting takes about {convert_s:.0f} s after the download of {human(plan.read_bytes)} "
                f"(estimate: {len(picked)} sample units of zeros with the checkpoint's shapes converted on {device}, "
                f"the largest {sample}; the weights are not in the local cache, so neither the download nor the "
                "read rate is measured)"), None
    # More of SRC, largest units first, until the read rate comes from SAMPLE_READ_BYTES (or all of SRC).
    for u in sorted(units, key=lambda u: -u.out_bytes):
        if in_bytes >= min(SAMPLE_READ_BYTES, plan.read_bytes):
            break
        if u in picked:
            continue
        t0 = time.perf_counter()
        for n in u.inputs:
            source.read(n)
        read_s += time.perf_counter() - t0
        in_bytes += sum(source.info(n).nbytes for n in u.inputs)
    read_rate = in_bytes / max(read_s, 1e-6)
    hash_rate = _hash_rate()
    write_bytes = sum(s.nbytes for s in plan.shards)
    write_rate = write_rate_of(out_dir, WRITE_SAMPLE_BYTES) if out_dir is not None else None
    # Written one by one, each fsynced: the first and the last manifest, a manifest update per shard, the index,
    # config.json, the model card and SRC's small files.
    meta_each = small_write_seconds(out_dir) if out_dir is not None else None
    meta_files = 5 + len(plan.shards) + len([r for r in source.extra_files if r != "README.md"]) if meta_each else 0
    cores = _cores()
    c = Costs(setup=setup_s, first_calls=first_calls_s, card=card_s, convert=units_s,
              read=plan.read_bytes / read_rate, hash=(plan.read_bytes + write_bytes) / hash_rate,
              write=write_bytes / write_rate if write_rate else 0.0, parallel=_parallelism(cores),
              metadata=meta_files * meta_each if meta_each else 0.0)
    meta = f", {meta_files} metadata files {c.metadata:.1f} s" if meta_each else ""
    secs = c.total()
    writes = (f"writing {human(write_bytes)} at {human(write_rate)}/s about {c.write:.1f} s" if write_rate else
              "writing OUT not measured")
    line = (f"ETA: {duration(secs)} (estimate, measured here: one-time costs about {c.once:.1f} s (opening SRC and "
            f"planning {c.setup:.1f} s, first calls {c.first_calls:.1f} s, the model card's imports {c.card:.1f} s"
            f"{meta}); "
            f"{len(units)} units convert in about {c.convert:.1f} s on {device} (largest sample {sample}); reading "
            f"{human(plan.read_bytes)} at {human(read_rate)}/s about {c.read:.1f} s; hashing "
            f"{human(plan.read_bytes + write_bytes)} in and out at {human(hash_rate)}/s about {c.hash:.1f} s; "
            f"{writes}; they overlap on {cores} core{'s' if cores > 1 else ''}, {c.parallel:.1f} of them free now)")
    return line, secs
