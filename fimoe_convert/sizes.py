"""Byte sizes: parse `5GB` (decimal) / `2GiB` (binary) and print them; durations printed as estimates are."""

from __future__ import annotations

import re

from .errors import UsageError

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int, flag: str) -> int:
    """'5GB' -> 5_000_000_000 bytes; `flag` names the option in the error."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*", text, flags=re.IGNORECASE)
    short = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT])i?\s*", text, flags=re.IGNORECASE)
    if short:  # "8G": ambiguous between 8GB and 8GiB
        n, u = short.group(1), short.group(2).upper()
        raise UsageError(f"{flag}: cannot read size {text!r}; did you mean {n}{u}B (decimal) or {n}{u}iB (binary)?")
    if not m or (m.group(2) or "").upper() not in _UNITS:
        raise UsageError(f"{flag}: cannot read size {text!r}; expected a number with a unit like 5GB or 2GiB")
    value = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    if value <= 0:
        raise UsageError(f"{flag}: size {text!r} must be positive")
    return value


def human(nbytes: int | float) -> str:
    """1234567 -> '1.23 MB' (decimal, as disks are sold)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(nbytes) < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1000
    raise AssertionError


def duration(secs: float) -> str:
    """An estimated duration: 'about 1.3 s' under 10 s (whole seconds would be off by up to 50% there), then
    whole seconds, minutes and hours."""
    return (f"about {secs:.1f} s" if secs < 10 else f"about {secs:.0f} s" if secs < 120
            else f"about {secs / 60:.1f} min" if secs < 7200 else f"about {secs / 3600:.1f} h")
