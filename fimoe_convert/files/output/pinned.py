"""OUT's files as `upload` sends them: each opened once, without following a link, and refused unless it is a regular
file of OUT; a small file is read into memory there (the bytes sent are the bytes hashed), a large one stays open and
is sent through its descriptor, so that a name swapped for a link after the check cannot send another file."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import InputError
from .manifest import FileRecord

# The Hub keeps files up to 10 MB in git ("regular") and larger ones in LFS or Xet storage: those are sent from
# memory, at most this many bytes each.
SMALL_FILE_BYTES = 10 * 2**20
FD_PATH = "/proc/self/fd/{fd}"  # Linux: opening it opens the very file behind the descriptor, whatever its name is now


@dataclass
class Pinned:
    name: str
    size: int
    data: bytes | None = None  # a small file's bytes, read once
    fd: int | None = None  # a large file, open
    ident: tuple[int, int] = (0, 0)  # (st_dev, st_ino) when opened
    via: str = field(default="")  # what huggingface_hub opens to read a large file: its descriptor's path

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open(path: Path, name: str) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        what = "is a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})"
        raise InputError(f"{path}: {what}; upload sends only OUT's own regular files, as verified: restore "
                         f"{name} (fimoe-convert verify {path.parent}), then run the upload again") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"{path}: is not a regular file (a FIFO, socket or device); upload sends only OUT's own "
                         f"regular files: restore {name}, then run the upload again")
    return fd, st


def pin_files(out_dir: Path, records: dict[str, FileRecord]) -> list[Pinned]:
    """Every file of `records`, opened and checked against its size (and, for a small file, its sha256). The caller
    closes them (`Pinned.close`)."""
    pinned: list[Pinned] = []
    try:
        for name, rec in sorted(records.items()):
            path = Path(out_dir) / name
            fd, st = _open(path, name)
            p = Pinned(name, st.st_size, fd=fd, ident=(st.st_dev, st.st_ino), via=FD_PATH.format(fd=fd))
            pinned.append(p)
            if st.st_size != rec.size:
                raise InputError(f"{path}: {st.st_size} bytes now, {rec.size} when verified; it changed during the "
                                 "upload: run `fimoe-convert verify` on OUT, then the upload again")
            if st.st_size <= SMALL_FILE_BYTES:
                p.data = _read_all(fd, st.st_size, path)
                p.close()
                if rec.sha256 is not None and hashlib.sha256(p.data).hexdigest() != rec.sha256:
                    raise changed(path, hashlib.sha256(p.data).hexdigest(), rec.sha256)
            elif not os.path.exists(p.via):  # not Linux: the name, checked again by sha256 before the commit
                p.via = str(path)
    except BaseException:
        for p in pinned:
            p.close()
        raise
    return pinned


def pin_bytes(path: Path) -> bytes:
    """A small file of OUT (the manifest) read once, refused if it is a link or not a regular file."""
    fd, st = _open(path, path.name)
    try:
        return _read_all(fd, st.st_size, path)
    finally:
        os.close(fd)


def changed(path: Path, got: str, want: str) -> InputError:
    return InputError(f"{path}: sha256 {got[:16]}... as sent, {want[:16]}... in the manifest; it changed after it "
                      "was verified, and nothing was committed: run `fimoe-convert verify` on OUT, then the upload "
                      "again")


def _read_all(fd: int, size: int, path: Path) -> bytes:
    data = bytearray()
    while len(data) <= size:
        chunk = os.read(fd, max(size - len(data), 0) + 1)
        if not chunk:
            break
        data += chunk
    if len(data) != size:
        raise InputError(f"{path}: {len(data)} bytes read, {size} expected; it changed during the upload: run "
                         "`fimoe-convert verify` on OUT, then the upload again")
    return bytes(data)
