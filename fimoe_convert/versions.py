"""Installed package versions, read from their metadata (nothing is imported), and the one version parser
(packaging's)."""

from __future__ import annotations

import functools
import os
import re
import sys

from . import __version__
from .records import Tool

# flashinfer-python 0.7.4 is the first release with flashinfer.megamoe and the moe_ep kernels the targets use.
MIN_FLASHINFER = (0, 7, 4)


@functools.cache  # one scan of the installed distributions per name and process
def installed(dist: str) -> str | None:
    """The installed version of the distribution `dist` ("flashinfer-python"), or None. First from the name of its
    `*.dist-info` folder on sys.path, as importlib.metadata would find it: importing importlib.metadata costs
    ~0.1 s, most of `inspect`'s start-up."""
    prefix = re.sub(r"[-_.]+", "_", dist).lower() + "-"
    for entry in sys.path:
        try:
            names = [e.name for e in os.scandir(entry or ".") if e.name.endswith(".dist-info")]
        except OSError:
            continue
        for name in names:
            if re.sub(r"[-_.]+", "_", name.split("-")[0]).lower() + "-" == prefix:
                return name[len(name.split("-")[0]) + 1:-len(".dist-info")]
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def parse(version: str) -> tuple[int, ...]:
    """'0.7.4.post1' -> (0, 7, 4); '2.13.0+cpu' -> (2, 13, 0): the release numbers (PEP 440, by packaging), at most
    three; () for a version string that is not PEP 440."""
    from packaging.version import InvalidVersion, Version  # here: `--help` starts without it

    try:
        return Version(version).release[:3]
    except InvalidVersion:
        return ()


def show(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def flashinfer() -> tuple[int, ...] | None:
    v = installed("flashinfer-python")
    return None if v is None else parse(v)


def tool() -> Tool:
    """The manifest's `tool`: this tool's version and those of the libraries that shape its output."""
    torch = installed("torch")
    return Tool(name="fimoe-convert", version=__version__, torch=torch.split("+")[0] if torch else None,
                safetensors=installed("safetensors"), flashinfer=installed("flashinfer-python"))
