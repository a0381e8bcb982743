"""Installed package versions, read from their metadata (nothing is imported), and the one version parser."""

from __future__ import annotations

import importlib.metadata
import re

# flashinfer-python 0.7.4 is the first release with flashinfer.megamoe and the moe_ep kernels the targets use.
MIN_FLASHINFER = (0, 7, 4)


def installed(dist: str) -> str | None:
    """The installed version of the distribution `dist` ("flashinfer-python"), or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def parse(version: str) -> tuple[int, ...]:
    """'0.7.4.post1' -> (0, 7, 4); '2.13.0+cpu' -> (2, 13, 0): the leading numbers of up to three parts."""
    out = []
    for part in version.split(".")[:3]:
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def show(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def flashinfer() -> tuple[int, ...] | None:
    v = installed("flashinfer-python")
    return None if v is None else parse(v)
