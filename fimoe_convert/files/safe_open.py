"""Opening a file read from SRC or OUT as a regular file only: a FIFO where a manifest, an index, a config, a shard,
a status file or a --config preset belongs would block the open (and a read of /dev/zero never ends), so the open
does not block and anything but a regular file is refused before a byte is read."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | Path, follow_links: bool = True) -> BinaryIO:
    """The file at `path` opened for binary reading; an OSError whose strerror says what it is when it is not a
    regular file (or, with `follow_links` False, when it is a link: ELOOP)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise OSError(errno.EINVAL, f"it is {kind}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
