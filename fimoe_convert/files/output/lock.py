"""The exclusive lock a conversion holds on OUT for its whole run: two runs into one folder would each believe
the manifest is theirs. `OUT/.fimoe-lock` is locked with flock (released by the kernel if the process dies)
and holds who has it, so that a second run fails at once naming the first."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from datetime import UTC
from pathlib import Path

from ... import __version__
from ...errors import InputError
from ..names import LOCK_NAME
from .atomic import write_failed

HOLDER_MAX_BYTES = 4096  # the holder line is ~100 bytes; more is not ours
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # file systems without flock: run unlocked


# Not filelock's: before 3.20.1 (CVE-2025-68146) it opens with O_TRUNC through a planted symlink, and later ones
# still truncate the holder line before flock (tox-dev/filelock#591), which a second run's error names.
class OutLock:
    """`acquire()` creates OUT (and its parents) when missing and takes the lock; `release()` removes the lock
    file and, if this lock created OUT and nothing was written into it, OUT itself."""

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_NAME
        self.fd: int | None = None
        self.created = False

    def acquire(self) -> None:
        try:
            self.created = not self.out_dir.exists()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for _ in range(3):
                fd = self._open()
                if self._lock(fd):
                    break
                os.close(fd)  # the lock file was removed by the run that held it: lock the new one
            else:
                raise InputError(f"OUT {self.out_dir}: {LOCK_NAME} keeps being replaced by another process; "
                                 "make sure no other fimoe-convert run writes into this folder, then run again")
            os.ftruncate(fd, 0)
            import socket  # here, not at the top: `inspect` and `targets` start without it
            from datetime import datetime

            started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started} "
                          f"(fimoe-convert {__version__})\n".encode(), 0)
        except OSError as e:
            raise write_failed(self.path, e) from e
        self.fd = fd

    def _open(self) -> int:
        """The lock file, opened without following a link or blocking on a FIFO, refused (InputError, one line with
        the remedy) when it is not a regular file of its own: the run truncates and writes it."""
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EMLINK):
                raise self._refuse(os.lstat(self.path)) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise self._refuse(st)
        return fd

    def _refuse(self, st: os.stat_result) -> InputError:
        """Why the lock path cannot be the lock file, and how to clear it."""
        if stat.S_ISLNK(st.st_mode):
            what, fix = f"is a symbolic link (to {os.readlink(self.path)!r})", f"remove the link: rm {self.path}"
        elif stat.S_ISDIR(st.st_mode):
            what, fix = "is a folder", f"move it out of OUT: mv {self.path} SOMEWHERE_ELSE"
        elif not stat.S_ISREG(st.st_mode):
            what, fix = "is not a regular file (a FIFO, socket or device)", f"remove it: rm {self.path}"
        else:
            what = f"has {st.st_nlink} hard links: it is also another file, which locking would overwrite"
            fix = f"remove this name (the other file stays): rm {self.path}"
        return InputError(f"OUT {self.out_dir}: {LOCK_NAME} {what}; fimoe-convert writes its lock only into a file "
                          f"of its own; {fix}, then run again")

    def _lock(self, fd: int) -> bool:
        """Lock `fd`; False when the path no longer names the locked file; an InputError when another run
        holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in _UNSUPPORTED:
                return True
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            holder = os.pread(fd, HOLDER_MAX_BYTES, 0).decode("utf-8", "replace").strip().splitlines()
            os.close(fd)
            raise InputError(f"OUT {self.out_dir}: another fimoe-convert run is writing into it "
                             f"({holder[0] if holder else 'its holder is not recorded'}); wait for it to end or stop "
                             "it, then run again (one run at a time per OUT)") from None
        try:
            return os.fstat(fd).st_ino == os.lstat(self.path).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still locked: a waiting run then locks a new file
        finally:
            os.close(self.fd)
            self.fd = None
        if self.created:
            try:
                self.out_dir.rmdir()  # only when empty: a run that failed before writing leaves no folder
            except OSError:
                pass
