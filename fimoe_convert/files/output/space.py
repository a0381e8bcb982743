"""Two questions about what OUT already holds: how many bytes `--overwrite` frees by removing the earlier conversion,
and whether a single-file checkpoint lies beside the output's index (an engine may load it in place of the shards)."""

from __future__ import annotations

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
