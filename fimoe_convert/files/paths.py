"""The one rule for a file name read from an index or a manifest (SRC's index, OUT's manifest and index): it is
used only if it is a plain relative path (no `..`, no empty part, no backslash, no control character, no drive,
not absolute) and, with its links resolved, stays inside its folder. Such names come from files anyone may have
written (a downloaded checkpoint, an OUT fetched from the Hub); a name outside this rule is never opened or
deleted."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ..errors import CONTROL

NAME_MAX = 255  # bytes in one path component: the limit of Linux file systems (a longer name cannot exist)
PATH_MAX = 4096  # bytes in a whole path (Linux)


def name_problem(rel, folder: Path, where: str, what: str = "file", label: str = "the folder",
                 inside: Path | None = None) -> str | None:
    """Why `rel` (read from the file `where`) may not be used as a `what` in `folder`, or None when it may.
    `inside`: where the resolved name must stay (default: `folder` resolved; a Hub snapshot's blobs live beside
    it); `label` names that place in the message ('the checkpoint', 'OUT')."""
    if not isinstance(rel, str) or not plain_relative(rel):
        return f"{where}: {what} name {rel!r} is not a plain relative path inside {label}; refusing it"
    try:
        base = (inside or Path(folder)).resolve()
        resolved = (Path(folder) / rel).resolve(strict=False)
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        return f"{where}: {what} {rel!r} cannot be resolved ({getattr(e, 'strerror', None) or 'symlink loop'})"
    if not resolved.is_relative_to(base):
        return f"{where}: {what} {rel!r} is a link to {resolved}, outside {label} ({base}); refusing it"
    return None


def plain_relative(rel: str) -> bool:
    """`rel` is a normalized relative POSIX path: no empty, `.` or `..` part, no backslash, control character
    (NUL, newline: a name printed in a message stays one line) or drive, and no part or whole longer than a file
    system allows (the system calls would fail with ENAMETOOLONG)."""
    p = PurePosixPath(rel)
    parts = rel.split("/")
    return bool(rel and p.parts and not p.is_absolute() and "\\" not in rel and not CONTROL.search(rel)
                and all(part not in ("..", ".", "") and len(part.encode()) <= NAME_MAX for part in parts)
                and len(rel.encode()) <= PATH_MAX and ":" not in p.parts[0])
