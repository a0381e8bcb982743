"""The time a conversion is estimated to take, printed by `--dry-run` and labeled as an estimate.

Measured, not assumed: one unit of the target's own work is read and converted (twice: the second run is timed,
so one-time costs such as kernel compiles stay out), and SRC's read rate is taken from reading that unit's inputs.
Reading, converting and writing overlap in the pipeline, so the estimate is the larger of the two totals. For a Hub
repo whose weights are not downloaded, the unit is zeros of the same dtypes and shapes (the conversion's time does
not depend on the values), and only the conversion's share is estimated."""

from __future__ import annotations

import time

from .errors import FimoeError
from .sizes import human


def _secs(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.1f} s"


def estimate(source, target, plan, notice=None) -> tuple[str, float | None]:
    """(one line for the user, seconds or None); `notice(line)` is told first what is timed (it takes seconds)."""
    if not plan.units:
        return "ETA: not estimated (nothing to convert)", None
    units = sorted(plan.units.values(), key=lambda u: u.out_bytes)
    unit = units[len(units) // 2]  # a typical unit (the median by output bytes)
    local = all(source.is_local(n) for n in unit.inputs)
    if notice is not None:
        notice(f"timing one unit ({unit.key}, {human(unit.out_bytes)}) of --target {target.kernel.name} on "
               f"{target.opts.device} to estimate the conversion's time...")
    try:
        t0 = time.perf_counter()
        inputs = {n: source.read(n) if local else source.zeros(n) for n in unit.inputs}
        read_s = time.perf_counter() - t0
        target.run(unit, inputs)
        t0 = time.perf_counter()
        target.run(unit, inputs)
        run_s = time.perf_counter() - t0
    except FimoeError as e:
        return f"ETA: not estimated (converting a sample unit, {unit.key}, failed: {e})", None
    in_bytes = sum(source.info(n).nbytes for n in unit.inputs)
    unit_out = sum(u.out_bytes for u in plan.units.values())
    convert_s = run_s * unit_out / max(unit.out_bytes, 1)
    if not local:  # nothing of SRC was read, so no read rate: the conversion's own share only
        return (f"ETA: converting takes about {convert_s:.0f} s after the download of {human(plan.read_bytes)} "
                f"(estimate: a sample unit, {unit.key}, of zeros with the checkpoint's shapes, converted "
                f"{human(unit.out_bytes)} in {_secs(run_s)} on {target.opts.device}; the weights are not in the local "
                "cache, so neither the download nor the read rate is measured)"), None
    read_rate = in_bytes / max(read_s, 1e-6)
    io_bytes = plan.read_bytes + sum(s.nbytes for s in plan.shards)
    io_s = io_bytes / read_rate
    secs = max(convert_s, io_s)
    when = ("under 1 s" if secs < 1 else f"about {secs:.0f} s" if secs < 120
            else f"about {secs / 60:.1f} min" if secs < 7200 else f"about {secs / 3600:.1f} h")
    return (f"ETA: {when} (estimate: a sample unit, {unit.key}, converted {human(unit.out_bytes)} in {_secs(run_s)} on "
            f"{target.opts.device}, so {len(plan.units)} units take about {convert_s:.0f} s; reading and writing "
            f"{human(io_bytes)} at the {human(read_rate)}/s read from SRC take about {io_s:.0f} s; the larger of "
            "the two, as they overlap; a cached sample or a slower OUT disk make it longer)"), secs
