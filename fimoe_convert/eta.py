"""The time a conversion is estimated to take, printed by `--dry-run` and labeled as an estimate."""

from __future__ import annotations

from .errors import FimoeError
from .files.source import read_rate, resolve_source_root
from .sizes import human

SAMPLE_BYTES = 64 * 2**20  # read from SRC's largest shard to measure its read rate
FLOOR_RATIO = 1.25  # the conversion's goal against the plain I/O floor (scripts/bench/bench_convert.py)


def dry_run_eta(src: str, revision: str | None, io_bytes: int) -> str:
    """One line: SRC's read rate on a sample of its biggest shard, applied to the bytes read and written, x1.25."""
    try:
        root = resolve_source_root(src, revision, offline=True)[0]
        sample, seconds = read_rate(root, SAMPLE_BYTES)
    except (FimoeError, OSError, ValueError):
        return "ETA: not estimated (SRC's files could not be sampled)"
    rate = sample / max(seconds, 1e-6)
    secs = FLOOR_RATIO * io_bytes / rate
    when = ("under 1 s" if secs < 1 else f"about {secs:.0f} s" if secs < 120
            else f"about {secs / 60:.1f} min" if secs < 7200 else f"about {secs / 3600:.1f} h")
    return (f"ETA: {when} (estimate: read + write {human(io_bytes)} at {human(rate)}/s, the read rate of a "
            f"{human(sample)} sample of SRC, x{FLOOR_RATIO}; a cached sample, a slower OUT disk or CPU-bound "
            "decoding make it longer)")
