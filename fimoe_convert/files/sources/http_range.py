"""Ranged HTTP reads of a Hub file that resume where they stopped: a dropped connection, a stalled server, a 5xx or
a body that ends early is asked again from the first byte not yet received, a bounded number of times. A server
that ignores Range (200, the whole file) or starts elsewhere is kept to the bytes asked for. Two ways in, one
reader: `read_range` reads a known range of a shard into the caller's buffers (--stream), `read_head` returns the
first bytes of a file and its size (a shard's header, for `inspect` and `--dry-run` of a repo id).

Hand-written on the standard library's http.client: huggingface_hub's downloader resumes only into a file on disk
(--stream writes none), and its HTTP client parses bodies in Python under the GIL (about 2 CPU seconds per GB, the
stream's ceiling beside the conversion), where `readinto` lands the bytes in the caller's buffer with the GIL
released. Each thread keeps one connection per host. Proxies come from the environment (HTTPS_PROXY, NO_PROXY...),
as huggingface_hub takes them; a redirect to another host drops the Hub token."""

from __future__ import annotations

import base64
import http.client
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote, urljoin, urlsplit

from ...errors import InputError, redact

RETRIES = 5  # attempts in a row that deliver no byte before the read fails
RETRIES_TOTAL = 50  # attempts per read, progress or not: a server that drips bytes and drops still ends
STALL_SECONDS = 60.0  # a server silent this long (connect or between bytes) is asked again
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0)  # wait before the 1st, 2nd, ... retry in a row
REQUEST_DEADLINE_S = 60.0  # seconds a `read_head` may take in all (a read timeout restarts on every byte)
READ_BYTES = 4 << 20  # bytes per readinto at most: the granularity of progress and of a stop
HEAD_READ_BYTES = 64 << 10  # bytes per read of a header: each read returns what came, so a deadline is seen
MAX_REDIRECTS = 5
ERROR_BODY_BYTES = 4096  # bytes of a refusal's body read for its message
_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_local = threading.local()  # per thread: {(scheme, host, port): _Kept}


@dataclass
class _Kept:
    """A thread's connection to one host: through a plain HTTP proxy (`proxied`: the request line names the whole
    URL, with the proxy's credentials in `extra`), and whether a request went on it yet."""

    conn: http.client.HTTPConnection
    proxied: bool = False
    extra: dict = field(default_factory=dict)
    used: bool = False


class Stop(Exception):
    """Raised by a caller's `into` to end a read at once (the conversion stopped); not retried."""


class _Retry(Exception):
    pass


def read_range(url: str, start: int, end: int, into: Callable[[int, int], memoryview], token=None,
               where: str = "") -> None:
    """Read bytes [start, end) of the file at `url` into the buffers `into(pos, n)` gives: a writable view for the
    bytes from file offset `pos` on, at most `n` long (every byte before `pos` has arrived). A byte asked again after
    a fault is written again, with the same value. Raises InputError naming `where` after RETRIES attempts in a row
    without progress (or RETRIES_TOTAL in all), or at once for a 4xx (not there, or the token may not read it)."""
    _read(url, start, end, into, token, where)


def read_head(url: str, start: int, end: int, token=None, where: str = "") -> tuple[bytes, int]:
    """Bytes [start, end] of the file at `url` (fewer where the file ends before `end`) and the file's size, read
    as `read_range` reads, within REQUEST_DEADLINE_S in all: a server that drips a byte at a time never trips a
    read timeout. At most end + 1 - start bytes are taken, also from a server that ignores Range (a shard is
    gigabytes)."""
    buf = bytearray(end + 1 - start)
    view = memoryview(buf)
    size = _read(url, start, end + 1, lambda pos, n: view[pos - start:pos - start + n], token, where,
                 deadline=time.monotonic() + REQUEST_DEADLINE_S)
    return bytes(buf[:max(min(end + 1, size) - start, 0)]), size


def _read(url: str, start: int, end: int, into, token, where: str, deadline: float | None = None) -> int:
    """`read_range`'s loop; returns the file's size as the last answer gave it (`end` where it gave none). With a
    `deadline` (time.monotonic()), a read that ends before it (a file shorter than `end`) is cut where the file ends,
    and one that does not is an InputError."""
    pos, failures, attempts, size = start, 0, 0, end
    while pos < end:
        attempts += 1
        before = pos
        try:
            pos, told = _attempt(url, pos, end, into, token, where, deadline)
            size = size if told is None else told
            if deadline is not None:
                end = min(end, size)
            if pos >= end:
                break
            fault: BaseException = _Retry(f"the answer ended at byte {pos} of {end}")
        except _Partial as e:
            pos, fault = e.pos, e.__cause__ or e
        failures = 0 if pos > before else failures + 1
        if failures >= RETRIES or attempts >= RETRIES_TOTAL:
            raise InputError(redact(f"{where}: reading bytes {pos}-{end - 1} from the Hub failed {attempts} "
                                    f"times ({_said(fault)}); check "
                                    "the network and run again with --resume (finished shards are kept)", token)
                             ) from None
        time.sleep(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])
        if deadline is not None and time.monotonic() > deadline:
            raise _late(where, pos, end) from None
    return size


class _Partial(Exception):
    """An attempt that failed after receiving the bytes before `pos`; its cause is the fault."""

    def __init__(self, pos: int):
        super().__init__(pos)
        self.pos = pos


def _said(fault: BaseException) -> str:
    """A fault in a few words: ours as they are, the transport's with its kind (ConnectionResetError: ...)."""
    text = " ".join(str(fault).split())[:200]
    return text if isinstance(fault, _Retry) else f"{type(fault).__name__}: {text}"


def _late(where: str, pos: int, end: int) -> InputError:
    return InputError(f"{where}: byte {pos} of {end} after {REQUEST_DEADLINE_S:.0f} s, the most one read of a header "
                      "may take; the server is too slow: try again later, or download the repo first "
                      "(fimoe-convert download)")


def _attempt(url: str, pos: int, end: int, into, token, where: str, deadline: float | None) -> tuple[int, int | None]:
    """One GET of bytes [pos, end) (following redirects), into the caller's buffers as they come: (the first byte
    not received, the file's size where the answer says it). A fault is a _Partial carrying how far it got; a stop
    (Stop) and a refusal (InputError) pass through."""
    from huggingface_hub.utils import build_hf_headers

    headers = {**build_hf_headers(token=token), "Range": f"bytes={pos}-{end - 1}", "Accept-Encoding": "identity"}
    conn = None
    try:
        for _ in range(MAX_REDIRECTS + 1):
            conn, r = _get(url, headers)
            if r.status in (301, 302, 303, 307, 308) and r.getheader("Location"):
                target = urljoin(url, r.getheader("Location"))
                if urlsplit(target).netloc != urlsplit(url).netloc:  # the token is the Hub's: not for a storage host
                    headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                _drain(conn, r)
                url = target
                continue
            break
        else:
            raise _Retry(f"more than {MAX_REDIRECTS} redirects")
        if r.status >= 500 or r.status == 429:
            raise _Retry(f"HTTP {r.status}")
        if r.status >= 400:
            raise InputError(redact(f"{where}: the Hub refused bytes {pos}-{end - 1} ({_refusal(r)}); check the "
                                    "repo id, revision and token", token))
        first = _first_byte(r, pos, where)  # the file offset of the body's first byte
        size = _file_size(r, first)
        _skip(r, pos - first)
        while pos < end:
            if deadline is None:
                view = into(pos, min(READ_BYTES, end - pos))
                n = r.readinto(view)
            else:
                data = r.read1(min(HEAD_READ_BYTES, end - pos))
                n = len(data)
                into(pos, n)[:n] = data
                if time.monotonic() > deadline and pos + n < end:
                    _close(conn)
                    raise _late(where, pos + n, end)
            if not n:
                break
            pos += n
        if pos < end or not r.isclosed():
            _close(conn)  # a body that ended early, or more than asked: the connection is not reused
        return pos, size
    except (Stop, InputError):
        _close(conn)
        raise
    except Exception as e:  # transport errors, timeouts, 5xx, short bodies: asked again from `pos`
        _close(conn)
        raise _Partial(pos) from e


def _get(url: str, headers: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send GET `url` on this thread's connection to its host (a new one where it has none, or where the kept one
    was closed by the server meanwhile) and return the answer's status and headers."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    for fresh in (False, True):
        kept = _connection(parts, fresh)
        used, kept.used = kept.used, True
        try:
            kept.conn.request("GET", url if kept.proxied else path, headers={**headers, **kept.extra})
            return kept.conn, kept.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine):
            _close(kept.conn)
            if fresh or not used:
                raise
    raise AssertionError("unreachable")


def _connection(parts, fresh: bool) -> _Kept:
    """This thread's connection to the host of `parts` (through the environment's proxy, if any); a new one with
    `fresh` or where the kept one is closed."""
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    key = (parts.scheme, host, port)
    conns = _local.__dict__.setdefault("conns", {})
    kept = conns.get(key)
    if kept is not None and not fresh and kept.conn.sock is not None:
        kept.conn.sock.settimeout(STALL_SECONDS)
        return kept
    if kept is not None:
        _close(kept.conn)
    import urllib.request  # here, not at import: the CLI's first lines need no proxy tables

    proxy = None if urllib.request.proxy_bypass(host) else urllib.request.getproxies().get(parts.scheme)
    if proxy:
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        auth = {}
        if p.username:
            cred = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
            auth = {"Proxy-Authorization": "Basic " + base64.b64encode(cred).decode()}
        if https:  # CONNECT through the proxy, then TLS with the host itself
            conn = http.client.HTTPSConnection(p.hostname, p.port or 80, timeout=STALL_SECONDS, context=_tls())
            conn.set_tunnel(host, port, headers=auth)
            kept = _Kept(conn)
        else:
            kept = _Kept(http.client.HTTPConnection(p.hostname, p.port or 80, timeout=STALL_SECONDS), True, auth)
    elif https:
        kept = _Kept(http.client.HTTPSConnection(host, port, timeout=STALL_SECONDS, context=_tls()))
    else:
        kept = _Kept(http.client.HTTPConnection(host, port, timeout=STALL_SECONDS))
    conns[key] = kept
    return kept


_TLS = None  # ssl.SSLContext, made on the first https connection


def _tls():
    """The system's trusted certificates, and certifi's where installed (huggingface_hub's HTTP client trusts
    those)."""
    global _TLS
    if _TLS is None:
        import ssl

        ctx = ssl.create_default_context()
        try:
            import certifi

            ctx.load_verify_locations(certifi.where())
        except (ImportError, OSError):
            pass
        _TLS = ctx
    return _TLS


def _close(conn) -> None:
    if conn is not None:
        conn.close()


def _drain(conn, r) -> None:
    """Read a redirect's short body so that the connection can be used again (a long one closes it)."""
    length = r.getheader("Content-Length")
    if length and length.isdigit() and int(length) <= ERROR_BODY_BYTES:
        r.read()
    else:
        _close(conn)


def _skip(r, n: int) -> None:
    """Read and drop the first `n` bytes of a body (a server that ignored Range starts at byte 0)."""
    while n > 0:
        got = len(r.read1(min(n, READ_BYTES)))
        if not got:
            raise _Retry("the answer ended before the bytes asked for")
        n -= got


def _refusal(r) -> str:
    """A 4xx answer in a few words: its status, the Hub's error code and message (header or JSON body)."""
    code = r.getheader("X-Error-Code") or r.reason
    message = r.getheader("X-Error-Message") or ""
    if not message:
        body = r.read(ERROR_BODY_BYTES)
        message = body.decode("utf-8", "replace")
        try:
            message = str(json.loads(body).get("error", message))
        except (ValueError, AttributeError):
            pass
    return " ".join(f"HTTP {r.status} {code}: {message}".split())[:200].rstrip(": ")


def _file_size(r, first: int) -> int | None:
    """The file's size as an answer gives it: Content-Range's total (a 206), Content-Length (a 200, from byte 0)."""
    total = (r.getheader("Content-Range") or "").rpartition("/")[2]
    if total.isdigit():
        return int(total)
    length = r.getheader("Content-Length") or ""
    return int(length) if first == 0 and r.status == 200 and length.isdigit() else None


def _first_byte(r, pos: int, where: str) -> int:
    """The file offset where the answer's body starts: `pos` for a 206 as asked, 0 for a 200 (Range ignored)."""
    if r.status != 206:
        return 0
    m = _RANGE_RE.fullmatch((r.getheader("Content-Range") or "").strip())
    if m is None:
        raise _Retry(f"206 without a usable Content-Range ({r.getheader('Content-Range')!r})")
    first = int(m.group(1))
    if first > pos:
        raise InputError(f"{where}: asked for bytes from {pos}, the server answered from {first}; the server does "
                         "not serve ranges correctly: download the repo first (fimoe-convert download)")
    return first
