"""Ranged HTTP reads of a Hub file that resume where they stopped: a dropped connection, a stalled server, a 5xx or
a body that ends early is asked again from the first byte not yet received, a bounded number of times. A server
that ignores Range (200, the whole file) or starts elsewhere is kept to the bytes asked for. Two ways in, one
reader: `read_range` hands a known range of a shard to a sink (--stream), `read_head` returns the first bytes of
a file and its size (a shard's header, for `inspect` and `--dry-run` of a repo id). Hand-written: huggingface_hub's
downloader resumes only into a file on disk, and --stream writes none."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from ...errors import InputError, redact

RETRIES = 5  # attempts in a row that deliver no byte before the read fails
RETRIES_TOTAL = 50  # attempts per read, progress or not: a server that drips bytes and drops still ends
STALL_SECONDS = 60.0  # a server silent this long (connect or between bytes) is asked again
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0)  # wait before the 1st, 2nd, ... retry in a row
REQUEST_DEADLINE_S = 60.0  # seconds a `read_head` may take in all (a read timeout restarts on every byte)
_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class Stop(Exception):
    """Raised by a sink to end a read at once (the conversion stopped); not retried."""


class _Retry(Exception):
    pass


def read_range(url: str, start: int, end: int, sink: Callable[[memoryview], None], token=None,
               where: str = "") -> None:
    """Hand bytes [start, end) of the file at `url` to `sink`, in order, each exactly once; resumes on faults.
    Raises InputError naming `where` after RETRIES attempts in a row without progress (or RETRIES_TOTAL in all),
    or at once for a 4xx (the file is not there, or the token may not read it)."""
    _read(url, start, end, sink, token, where)


def read_head(url: str, start: int, end: int, token=None, where: str = "") -> tuple[bytes, int]:
    """Bytes [start, end] of the file at `url` (fewer where the file ends before `end`) and the file's size, read
    as `read_range` reads, within REQUEST_DEADLINE_S in all: a server that drips a byte at a time never trips a
    read timeout. At most end + 1 - start bytes are taken, also from a server that ignores Range (a shard is
    gigabytes)."""
    got: list[bytes] = []
    size = _read(url, start, end + 1, lambda view: got.append(bytes(view)), token, where,
                 deadline=time.monotonic() + REQUEST_DEADLINE_S)
    return b"".join(got), size


def _read(url: str, start: int, end: int, sink, token, where: str, deadline: float | None = None) -> int:
    """`read_range`'s loop; returns the file's size as the last answer gave it (`end` where it gave none). With a
    `deadline` (time.monotonic()), a read that ends before it (a file shorter than `end`) is cut where the file ends,
    and one that does not is an InputError."""
    pos, failures, attempts, size = start, 0, 0, end

    def counted(view: memoryview) -> None:
        nonlocal pos
        sink(view)
        pos += len(view)

    while pos < end:
        attempts += 1
        before = pos
        try:
            told = _attempt(url, pos, end, counted, token, where, deadline)
            size = size if told is None else told
            if deadline is not None:
                end = min(end, size)
            if pos < end:
                raise _Retry(f"the answer ended at byte {pos} of {end}")
        except (Stop, InputError):
            raise
        except Exception as e:  # transport errors of the HTTP client, timeouts, 5xx, short bodies: asked again
            failures = 0 if pos > before else failures + 1
            if failures >= RETRIES or attempts >= RETRIES_TOTAL:
                raise InputError(redact(f"{where}: reading bytes {pos}-{end - 1} from the Hub failed {attempts} "
                                        f"times ({type(e).__name__}: {' '.join(str(e).split())[:200]}); check the "
                                        "network and run again with --resume (finished shards are kept)", token)
                                 ) from None
            time.sleep(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])
            if deadline is not None and time.monotonic() > deadline:
                raise _late(where, pos, end) from None
    return size


def _late(where: str, pos: int, end: int) -> InputError:
    return InputError(f"{where}: byte {pos} of {end} after {REQUEST_DEADLINE_S:.0f} s, the most one read of a header "
                      "may take; the server is too slow: try again later, or download the repo first "
                      "(fimoe-convert download)")


def _attempt(url: str, pos: int, end: int, sink, token, where: str, deadline: float | None = None) -> int | None:
    """One GET of bytes [pos, end), handed to `sink` as they come; the file's size where the answer says it. Past
    `deadline` (time.monotonic()), an InputError: not asked again."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = {**build_hf_headers(token=token), "Range": f"bytes={pos}-{end - 1}", "Accept-Encoding": "identity"}
    with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=STALL_SECONDS) as r:
        if r.status_code >= 500 or r.status_code == 429:
            raise _Retry(f"HTTP {r.status_code}")
        if r.status_code >= 400:
            r.read()
            try:
                hf_raise_for_status(r)
            except Exception as e:
                raise InputError(redact(f"{where}: the Hub refused bytes {pos}-{end - 1} ({type(e).__name__}: "
                                        f"{' '.join(str(e).split())[:200]}); check the repo id, revision and token",
                                        token)) from None
        first = _first_byte(r, pos, where)  # the file offset of the body's first byte
        size = _file_size(r, first)
        skip = pos - first
        for chunk in r.iter_bytes():
            view = memoryview(chunk)
            if skip:
                cut = min(skip, len(view))
                view, skip = view[cut:], skip - cut
            view = view[:end - pos]  # a server that sends more than asked: the rest is not used
            if view:
                sink(view)
                pos += len(view)
            if pos >= end:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise _late(where, pos, end)
    return size


def _file_size(r, first: int) -> int | None:
    """The file's size as an answer gives it: Content-Range's total (a 206), Content-Length (a 200, from byte 0)."""
    total = r.headers.get("Content-Range", "").rpartition("/")[2]
    if total.isdigit():
        return int(total)
    length = r.headers.get("Content-Length", "")
    return int(length) if first == 0 and r.status_code == 200 and length.isdigit() else None


def _first_byte(r, pos: int, where: str) -> int:
    """The file offset where the answer's body starts: `pos` for a 206 as asked, 0 for a 200 (Range ignored)."""
    if r.status_code != 206:
        return 0
    m = _RANGE_RE.fullmatch(r.headers.get("Content-Range", "").strip())
    if m is None:
        raise _Retry(f"206 without a usable Content-Range ({r.headers.get('Content-Range')!r})")
    first = int(m.group(1))
    if first > pos:
        raise InputError(f"{where}: asked for bytes from {pos}, the server answered from {first}; the server does "
                         "not serve ranges correctly: download the repo first (fimoe-convert download)")
    return first
