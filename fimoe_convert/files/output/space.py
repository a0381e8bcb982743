"""Two questions about what OUT already holds: how many bytes `--overwrite` frees by removing the earlier conversion,
and whether a single-file checkpoint lies beside the output's index (an engine may load it in place of the shards)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..names import SINGLE_NAME
from .folder import earlier_files


def reclaimable_bytes(out_dir: Path) -> int:
    """Bytes --overwrite frees in OUT: the earlier conversion's files that are regular and have no other name (a hard
    link's data stays on the disk)."""
    if not Path(out_dir).is_dir():
        return 0
    total = 0
    for p in earlier_files(Path(out_dir)):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            total += st.st_size
    return total


def stray_single_file(out_dir: Path, listed: dict) -> str | None:
    """The problem with a `model.safetensors` in OUT that the manifest does not list, or None."""
    path = Path(out_dir) / SINGLE_NAME
    if SINGLE_NAME in listed or not (path.exists() or path.is_symlink()):
        return None
    return (f"{path}: not part of this output, and an engine that finds it beside the index may load it in place of "
            f"the shards; move it out of {out_dir}")


def _probe_folder(out_dir: Path) -> Path:
    """OUT, or the nearest folder above it that exists: where a probe file goes."""
    folder = Path(out_dir).absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def small_write_seconds(out_dir: Path, runs: int = 3) -> float | None:
    """Seconds OUT's disk takes to write a small file as the metadata files are (a temporary name, fsync, rename,
    fsync of the folder; atomic_write_bytes), the median of `runs` probe files removed at once; None where no
    folder can be written."""
    import statistics
    import tempfile
    import time

    from ...errors import InputError
    from .atomic import atomic_write_bytes

    folder, took = _probe_folder(out_dir), []
    try:
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix=".fimoe-meta-probe-", dir=folder) as d:
                t0 = time.perf_counter()
                atomic_write_bytes(Path(d) / "probe.json", bytes(4096))
                took.append(time.perf_counter() - t0)
    except (OSError, InputError):  # InputError: atomic_write_bytes's own, naming the file
        return None
    return statistics.median(took)


def write_rate(out_dir: Path, nbytes: int) -> float | None:
    """Bytes per second at which OUT's disk takes a shard's writes, from writing `nbytes` as the shard writer does
    (O_DIRECT where the file system takes it, then fsync) into a hidden probe file in OUT or the nearest folder above
    it that exists, removed at once; None where no such folder can be written."""
    import mmap
    import tempfile
    import time

    from ..safetensors.writer import _direct_opener

    folder = _probe_folder(out_dir)
    block = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT wants
    try:
        fd, name = tempfile.mkstemp(prefix=".fimoe-write-probe-", dir=folder)
    except OSError:
        return None
    os.close(fd)
    try:
        t0 = time.perf_counter()
        with open(name, "wb", buffering=0, opener=_direct_opener) as f:
            for _ in range(max(nbytes >> 20, 1)):
                f.write(block)
            os.fsync(f.fileno())
        return max(nbytes >> 20, 1) * len(block) / max(time.perf_counter() - t0, 1e-6)
    except OSError:
        return None
    finally:
        os.unlink(name)
