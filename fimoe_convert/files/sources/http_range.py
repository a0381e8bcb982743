"""Ranged HTTP reads of a Hub file that resume where they stopped: a dropped connection, a stalled server, a 5xx or
a body that ends early is asked again from the first byte not yet received, a bounded number of times. A server
that ignores Range (200, the whole file) or starts elsewhere is kept to the bytes asked for, as hub.py's `_get`
(a shard's header, one request) is. Hand-written: huggingface_hub's downloader resumes only into a file on disk,
and --stream writes none."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from ...errors import InputError, redact

RETRIES = 5  # attempts in a row that deliver no byte before the read fails
RETRIES_TOTAL = 50  # attempts per read, progress or not: a server that drips bytes and drops still ends
STALL_SECONDS = 60.0  # a server silent this long (connect or between bytes) is asked again
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0)  # wait before the 1st, 2nd, ... retry in a row
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
    pos, failures, attempts = start, 0, 0

    def counted(view: memoryview) -> None:
        nonlocal pos
        sink(view)
        pos += len(view)

    while pos < end:
        attempts += 1
        before = pos
        try:
            _attempt(url, pos, end, counted, token, where)
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


def _attempt(url: str, pos: int, end: int, sink, token, where: str) -> None:
    """One GET of bytes [pos, end), handed to `sink` as they come."""
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
