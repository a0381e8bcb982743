"""Files written whole through a temporary name (write, fsync, rename, fsync the folder), the registry of the
temporaries this process has open (removed on any failure, Ctrl-C included), and the one error for a failed
write into OUT."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from ...errors import InputError
from ...records import FileRecord
from ..hashing import sha256
from ..names import TMP_SUFFIX

# Temporary files this process is writing, registered before they are created: a run that fails or is
# interrupted (even between a temporary's creation and the code that would delete it) removes them all.
_TEMPS: set[Path] = set()
_TEMPS_LOCK = threading.Lock()


def track_temporary(tmp: Path, on: bool) -> None:
    with _TEMPS_LOCK:
        (_TEMPS.add if on else _TEMPS.discard)(tmp)


def remove_own_temporaries(folder: Path) -> None:
    """Delete every temporary file this process created in `folder` and has not renamed or deleted yet (call
    once no writer runs any more)."""
    folder = Path(folder)
    with _TEMPS_LOCK:
        mine = [p for p in _TEMPS if p.parent == folder]
    for p in mine:
        p.unlink(missing_ok=True)
        track_temporary(p, False)


def write_failed(path: Path, e: OSError) -> InputError:
    """A one-line error for a failed write into OUT (disk full, quota, permissions), naming the file."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "the disk is full" if e.errno == errno.ENOSPC else "the disk quota is exceeded"
        step = f"free space on the disk holding {path.parent}"
    else:
        what = e.strerror or e.__class__.__name__
        step = f"make sure {path.parent} is writable"
    return InputError(f"{path}: cannot write ({what}); {step}, then run the same command with --resume "
                      "(finished shards are kept)")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def atomic_write_bytes(path: Path, data: bytes) -> FileRecord:
    """Write `data` to `path` through a temporary name, fsync and rename."""
    atomic_write_stream(path, lambda f: f.write(data))
    return FileRecord(len(data), sha256(data).hexdigest())


def atomic_write_stream(path: Path, fill) -> None:
    """Write `path` through a temporary name: `fill(f)` writes into the open binary file; then fsync and
    rename. The temporary is removed on any failure, Ctrl-C included."""
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    track_temporary(tmp, True)
    try:
        try:
            with open(tmp, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            track_temporary(tmp, False)
        fsync_dir(path.parent)
    except OSError as e:
        raise write_failed(path, e) from e
