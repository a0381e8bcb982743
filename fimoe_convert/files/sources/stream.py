"""SRC streamed from the Hub (--stream): the shards' bytes go from HTTP into the conversion, never to disk.

Design: each SOURCE shard is read once, front to back, on one connection (several shards at once), and its
sha256 is computed as its bytes arrive and compared with the Hub's own record (the LFS sha256) at its end: the
check covers every byte, the header included, with no second read. The conversion asks for tensors in output
order, which the source shards' order need not follow: a tensor that arrives before it is asked for is kept in
memory (at most `cap` bytes of such tensors; a stream waits for room), and a stream whose shard holds a tensor
the conversion waits for skips ahead of the room rule. A tensor skipped that way is hashed (blake2b) and, when
asked for, fetched again by range and compared with that hash, so every byte converted is a byte checked.
(The other design, one ranged read per tensor in output order, would need the shard's bytes again in order for
its sha256, or hold all out-of-order bytes until the gap before them filled.)

An output shard converted from a source shard not yet verified is written but recorded as finished only once
every source shard it read is verified; a mismatch stops the run naming the shard and deletes those outputs.

`stream_early` opens SRC and begins the streams (shards in index order, tensors kept within the cap) on a thread
while the caller imports the converters (torch: seconds); the conversion's `open_streamed` takes that source
over, and `start` then gives the streams the plan's order and drops what the plan does not read."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import fields
from pathlib import Path

from ...errors import InputError, UsageError
from ..safetensors.header import parse_header
from .http_range import Stop, read_range
from .hub import HUB_PATTERNS, _is_repo_id, describing_files, outside_repo
from .local import Source, open_source, summarized

CONNECTIONS = 4  # source shards read at once: one connection each (a Hub CDN serves one at a few hundred MB/s)
METADATA_THREADS = 8  # HEAD requests for the shards' LFS records at once
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")  # a file stored in git itself, not LFS: its etag is the git blob sha1


def check_stream_flags(src: str, offline: bool, revision: str | None) -> None:
    """--stream needs a Hub repo id and the network: a usage error (naming --stream) otherwise."""
    if Path(src).expanduser().exists():
        raise UsageError(f"--stream: SRC {src!r} is a local path; --stream reads a Hub repo (org/name) over HTTP: "
                         "drop --stream to convert the folder")
    if not _is_repo_id(src):
        raise UsageError(f"--stream: SRC {src!r} is not a Hub repo id (org/name)")
    if offline or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        raise UsageError("--stream reads the shards from the Hub, and --offline (or HF_HUB_OFFLINE=1) forbids the "
                         "network: drop one of them")


class _Remote:
    """One source shard on the Hub and how far its stream has come."""

    def __init__(self, rel: str, url: str, size: int, etag: str, spans: list[tuple[int, int, str]]):
        self.rel, self.url, self.size, self.etag, self.spans = rel, url, size, etag, spans
        self.names = {n for _, _, n in spans}
        self.state = "queued"  # queued, streaming, done
        self.skipped: dict[str, bytes] = {}  # tensor -> blake2b of the bytes streamed past, not kept


_EARLY: dict[tuple[str, str | None], Future] = {}  # stream_early's sources, until open_streamed takes them


def stream_early(spec: str, revision: str | None, cap: int) -> None:
    """Open SRC `spec` and begin its streams on a thread now (holding at most `cap` bytes of tensors); the next
    `open_streamed(spec, revision)` returns that source (or raises its error). Streams begun already for SRC are
    kept (a caller began them before convert(), which begins them too)."""
    if (spec, revision) in _EARLY:
        return
    future: Future = Future()
    _EARLY[(spec, revision)] = future

    def run() -> None:
        try:
            source = _open_streamed(spec, revision)
            source._start_early(cap)
            future.set_result(source)
        except BaseException as e:  # noqa: BLE001 - raised where the conversion opens SRC
            future.set_exception(e)

    threading.Thread(target=run, name="fimoe-stream-early", daemon=True).start()


def end_early() -> None:
    """Stop the streams stream_early began (taken over or not): after the conversion, or when it failed early."""
    for future in list(_EARLY.values()):
        if future.done() and future.exception() is None:
            future.result().close()
    _EARLY.clear()


def open_streamed(spec: str, revision: str | None) -> "StreamedSource":
    """SRC `spec` (a Hub repo id) for --stream: the small files (config, index, tokenizer...) into the Hugging Face
    cache, each shard's header and LFS record read from the Hub; no shard is downloaded. The source stream_early
    opened, where there is one."""
    early = _EARLY.get((spec, revision))
    return early.result() if early is not None else _open_streamed(spec, revision)


def _open_streamed(spec: str, revision: str | None) -> "StreamedSource":
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    try:  # the commit first (config.json, index), then the other small files of that commit
        commit = describing_files(spec, revision).name
        snap = Path(huggingface_hub.snapshot_download(spec, revision=commit, allow_patterns=HUB_PATTERNS,
                                                      ignore_patterns=["*.safetensors"],
                                                      cache_dir=os.environ.get("HF_HUB_CACHE")))
    except HfHubHTTPError as e:
        raise InputError(f"SRC {spec!r}: the Hub refused the download ({e.__class__.__name__}); check the repo id, "
                         "--revision and your token (HF_TOKEN)") from None
    except ValueError as e:  # huggingface_hub refuses a listed name that leaves the repo ('..', absolute)
        raise InputError(outside_repo(spec, e)) from None
    except OSError as e:
        raise InputError(f"SRC {spec!r}: cannot reach the Hub ({e.__class__.__name__}: {e}); "
                         "check the network") from None
    base = open_source(spec, revision=snap.name, weights=False)
    source = StreamedSource(**{f.name: getattr(base, f.name) for f in fields(Source) if f.init})
    source.attach()
    return source


def _same_header(head: bytes, planned, size: int, where: str) -> None:
    """The header at the start of the streamed bytes is the one the plan cut its tensors by: a Hub that served other
    bytes to the header read than to the stream, at one commit, is refused before a tensor is taken."""
    got = parse_header(head[:8], lambda n: head[8:8 + n], size, where)
    if got.tensors != planned.tensors or got.data_start != planned.data_start:
        differ = sorted(n for n in set(got.tensors) | set(planned.tensors)
                        if got.tensors.get(n) != planned.tensors.get(n))
        raise InputError(f"{where}: the header streamed differs from the one read to plan the conversion (e.g. "
                         f"{differ[:1] or ['its length']}); the Hub served two versions of the file at one commit: "
                         "run again, or download the repo first (drop --stream)")


class StreamedSource(Source):
    """A Source whose shards in `remote` are read from the Hub as they stream (local shards as usual).
    `start` begins the streams, `read`/`read_range` take tensors from them, `verified` waits for every sha256."""

    def attach(self) -> None:
        """Read each remote shard's LFS record (sha256, size) from the Hub; all problems at once."""
        from concurrent.futures import ThreadPoolExecutor

        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        def record(rel: str):
            where = f"{self.repo_id}/{rel}@{self.revision}"
            try:
                meta = get_hf_file_metadata(hf_hub_url(self.repo_id, rel, revision=self.revision))
            except Exception as e:  # HTTP and transport errors: one line each, listed together
                return None, f"{where}: reading its record from the Hub failed ({type(e).__name__}); check the network"
            etag, size = (meta.etag or "").lower(), self.headers[rel].file_size
            if not (_SHA256_RE.match(etag) or _SHA1_RE.match(etag)):
                return None, (f"{where}: the Hub gives no sha256 for it (etag {meta.etag!r}), so its bytes cannot be "
                              "checked as they stream: download the repo first (drop --stream)")
            if meta.size != size:
                return None, f"{where}: the Hub records {meta.size} bytes, its header was read from {size}"
            spans = sorted((i.start, i.end, n) for n, i in self.headers[rel].tensors.items())
            return _Remote(rel, hf_hub_url(self.repo_id, rel, revision=self.revision), size, etag, spans), None

        with ThreadPoolExecutor(METADATA_THREADS) as pool:
            got = dict(zip(sorted(self.remote), pool.map(record, sorted(self.remote))))
        problems = [p for _, p in got.values() if p]
        if problems:
            from ...errors import ValidationError

            raise ValidationError(summarized(problems, "shard records could not be read from the Hub"))
        self._shards: dict[str, _Remote] = {rel: r for rel, (r, _) in got.items()}
        self._cv = threading.Condition()
        self._cache: dict[str, bytearray] = {}  # tensor -> its bytes, kept until read `_left` bytes
        self._left: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._used = self._cap = 0
        self._queue: list[str] = []
        self._sha: dict[str, str] = {}  # verified shards
        self._pending: list[tuple[set[str], Path, Callable[[], None]]] = []
        self._error: BaseException | None = None
        self._closed = self._started = self._early = False
        self._planned = False  # `_left` holds the plan's reads (before, early streams keep every tensor)
        self._on_verified: Callable[[str, str], None] = lambda rel, sha: None
        self.fetched = 0  # bytes received from the Hub, over all streams and re-reads
        for rel in self.remote:  # no local file: the identity of a Hub file at a pinned commit is its size
            self.identities[rel] = {"size": self._shards[rel].size, "mtime_ns": 0, "ctime_ns": 0, "inode": 0,
                                    "dev": 0}

    # -- files -------------------------------------------------------------------------------------------------

    def identity(self, rel: str) -> dict:
        return self.identities[rel] if rel in self.remote else super().identity(rel)

    def file_size(self, rel: str) -> int:
        return self._shards[rel].size if rel in self.remote else super().file_size(rel)

    def hash_input(self, rel: str) -> str:
        """A remote shard's sha256: the Hub's record before the streams start (compared by --resume, as a
        downloaded blob's name is), then the sha256 of the bytes streamed, once verified."""
        if rel not in self.remote:
            return super().hash_input(rel)
        if not self._started:
            return self._shards[rel].etag
        return self.verified([rel])[rel]

    # -- streams -----------------------------------------------------------------------------------------------

    def start(self, reads: list[tuple[str, int]], carried: dict[str, str | None], cap: int,
              on_verified: Callable[[str, str], None]) -> None:
        """Begin streaming. `reads`: (tensor, bytes) the conversion will read, in its order; `carried`: the sha256
        an earlier run verified (--resume); `cap`: bytes of tensors held before they are read; `on_verified(rel,
        sha256)` as each shard is verified. A shard none of whose tensors is read and whose sha256 was verified
        before is not fetched at all."""
        order: dict[str, int] = {}
        left: dict[str, int] = {}
        for i, (name, n) in enumerate(reads):
            rel = self.weight_map[name]
            if rel in self._shards:
                left[name] = left.get(name, 0) + n
                order.setdefault(rel, i)
        if self._early:
            return self._plan_early(left, order, cap, on_verified)
        self._left, self._planned = left, True
        self._cap, self._on_verified, self._started = cap, on_verified, True
        for rel, shard in self._shards.items():
            old = carried.get(rel)
            if rel not in order and old and _SHA256_RE.match(shard.etag):
                if old != shard.etag:
                    raise InputError(f"--resume: {self.repo_id}/{rel}@{self.revision}: the Hub records sha256 "
                                     f"{shard.etag[:16]}..., the earlier run verified {old[:16]}...; run with "
                                     "--overwrite in place of --resume to convert again")
                shard.state = "done"
                self._sha[rel] = old
        self._queue = sorted((r for r, s in self._shards.items() if s.state == "queued"),
                             key=lambda r: (order.get(r, len(reads)), r))
        for i in range(min(CONNECTIONS, len(self._queue))):
            threading.Thread(target=self._worker, name=f"fimoe-stream{i}", daemon=True).start()

    def _start_early(self, cap: int) -> None:
        """Begin streaming before the plan is known: shards in index order, every tensor kept within `cap`."""
        with self._cv:
            self._cap, self._early = cap, True
            self._queue = sorted(self._shards)
        for i in range(min(CONNECTIONS, len(self._queue))):
            threading.Thread(target=self._worker, name=f"fimoe-stream{i}", daemon=True).start()

    def _plan_early(self, left: dict[str, int], order: dict[str, int], cap: int, on_verified) -> None:
        """The plan reaches early streams: the shards not begun in its order, tensors it does not read dropped,
        the shards verified so far recorded."""
        with self._cv:
            self._left, self._planned, self._started, self._on_verified = left, True, True, on_verified
            self._cap = cap
            for name in [n for n in self._cache if not left.get(n)]:
                self._used -= len(self._cache.pop(name))
            self._queue.sort(key=lambda r: (order.get(r, len(order)), r))
            done = dict(self._sha)
            self._cv.notify_all()
        for rel, sha in done.items():
            on_verified(rel, sha)

    def _worker(self, rel: str | None = None) -> None:
        """Stream queued shards one after another; given `rel` (asked for before its turn): that shard only."""
        once = rel is not None
        while True:
            with self._cv:
                if rel is None:
                    if not self._queue or self._closed:
                        return
                    rel = self._queue.pop(0)
                shard = self._shards[rel]
                shard.state = "streaming"
            try:
                self._stream(shard)
            except Stop:
                return
            except BaseException as e:  # noqa: BLE001 - handed to every reader and to `verified`
                self._fail(e)
                return
            if once:
                return
            rel = None

    def _stream(self, shard: _Remote) -> None:
        """Read `shard` front to back: hash every byte, keep the tensors the conversion reads, verify at the end."""
        where = f"{self.repo_id}/{shard.rel}@{self.revision}"
        sha256 = hashlib.sha256()
        git = hashlib.sha1(b"blob %d\0" % shard.size) if len(shard.etag) == 40 else None
        spans, at, pos = shard.spans, 0, 0  # next span, file offset
        cur: dict = {}  # the tensor being received: name, start, end, and buf (kept) or blake (skipped) or neither
        planned = self.headers[shard.rel]
        head = bytearray()  # the streamed header, compared with the one the plan was made from before any tensor

        def sink(view: memoryview) -> None:
            nonlocal at, pos
            if self._closed:
                raise Stop
            if len(head) < planned.data_start:
                head.extend(view[:planned.data_start - len(head)])
                if len(head) == planned.data_start:
                    _same_header(bytes(head), planned, shard.size, where)
            sha256.update(view)
            if git is not None:
                git.update(view)
            self.fetched += len(view)
            while len(view):
                if not cur and at < len(spans) and pos >= spans[at][0]:
                    self._begin(shard, spans[at], cur)
                    at += 1
                stop = cur["end"] if cur else (spans[at][0] if at < len(spans) else shard.size)
                take = view[:max(stop - pos, 0)]
                if "buf" in cur:
                    cur["buf"][pos - cur["start"]:pos - cur["start"] + len(take)] = take
                elif "blake" in cur:
                    cur["blake"].update(take)
                pos += len(take)
                view = view[len(take):]
                if cur and pos >= cur["end"]:
                    self._end(shard, cur)
                    cur.clear()
                elif not len(take) and not cur and at >= len(spans):
                    break  # bytes after the last tensor (a valid file has none): hashed, not used

        read_range(shard.url, 0, shard.size, sink, where=where)
        got = (git or sha256).hexdigest()
        if got != shard.etag:
            raise InputError(f"{where}: the {'sha256' if git is None else 'git sha1'} of the bytes received, "
                             f"{got[:16]}..., differs from the Hub's record, {shard.etag[:16]}...; nothing converted "
                             "from it is kept: run again with --resume (a damaged transfer), or download the repo "
                             "first to check the file")
        self._verify(shard, sha256.hexdigest())

    def _begin(self, shard: _Remote, span: tuple[int, int, str], cur: dict) -> None:
        """At a tensor's first byte: keep it (room under the cap, or the conversion waits for it), or hash and
        skip it (the conversion waits for a later tensor of this shard), or wait for room."""
        start, end, name = span
        cur.update(name=name, start=start, end=end)
        n = end - start
        unread = lambda: self._planned and not self._left.get(name)  # noqa: E731 - not read by this run
        with self._cv:
            self._cv.wait_for(lambda: self._closed or unread() or name in self._waiting or self._used + n <= self._cap
                              or self._used == 0 or any(w in shard.names for w in self._waiting))
            if self._closed:
                raise Stop
            if unread():
                return  # hashed with the shard only
            if name in self._waiting or self._used + n <= self._cap or self._used == 0:
                self._used += n
                cur["buf"] = bytearray(n)
            else:
                cur["blake"] = hashlib.blake2b(digest_size=32)

    def _end(self, shard: _Remote, cur: dict) -> None:
        # bytes, not a tensor: an early stream must not wait for the import of torch
        with self._cv:
            if "buf" in cur and self._planned and not self._left.get(cur["name"]):
                self._used -= len(cur["buf"])  # kept before the plan came, which does not read it
            elif "buf" in cur:
                self._cache[cur["name"]] = cur["buf"]
            elif "blake" in cur:
                shard.skipped[cur["name"]] = cur["blake"].digest()
            self._cv.notify_all()

    def _verify(self, shard: _Remote, sha: str) -> None:
        with self._cv:
            shard.state = "done"
            self._sha[shard.rel] = sha
            ready = [p for p in self._pending if p[0] <= set(self._sha)]
            self._pending = [p for p in self._pending if p not in ready]
            on_verified = self._on_verified  # read here: `_plan_early` records the shards verified before it
            self._cv.notify_all()
        on_verified(shard.rel, sha)
        for _, _, fn in ready:
            fn()

    def _fail(self, error: BaseException) -> None:
        """Stop every stream and reader with `error`; delete the outputs converted from unverified bytes."""
        with self._cv:
            if self._error is None:
                self._error = error
            self._closed = True
            pending, self._pending = self._pending, []
            self._cv.notify_all()
        for _, path, _ in pending:
            path.unlink(missing_ok=True)

    def close(self, failed: bool = False) -> None:
        """End the streams (the run is over); with `failed`, delete outputs whose sources were not verified."""
        if failed:
            self._fail(InputError("the conversion stopped"))
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def after_verified(self, tensors: set[str], path: Path, fn: Callable[[], None]) -> None:
        """Call `fn` (record the output shard `path` as finished) once every source shard holding one of
        `tensors` is verified: now, or from the stream that verifies the last."""
        deps = {self.weight_map[n] for n in tensors} & set(self._shards)
        with self._cv:
            if self._error is not None:
                path.unlink(missing_ok=True)
                raise self._error
            if not deps <= set(self._sha):
                self._pending.append((deps, path, fn))
                return
        fn()

    def verified(self, rels: list[str] | None = None) -> dict[str, str]:
        """{shard: sha256} of `rels` (default: every remote shard), waiting for their streams; raises the
        stream's error (a mismatch names the shard)."""
        rels = list(self._shards) if rels is None else rels
        with self._cv:
            self._cv.wait_for(lambda: self._error is not None or all(r in self._sha for r in rels))
            if self._error is not None:
                raise self._error
            return {r: self._sha[r] for r in rels}

    # -- tensors -----------------------------------------------------------------------------------------------

    def _take(self, name: str, start: int, end: int):
        """Bytes [start, end) of remote tensor `name` (uint8): from memory, waiting for its stream, or fetched
        again by range when its stream skipped it."""
        shard = self._shards[self.weight_map[name]]
        with self._cv:
            self._waiting[name] = self._waiting.get(name, 0) + 1
            self._cv.notify_all()  # a stream waiting for room skips ahead to it
            try:
                while name not in self._cache:
                    if self._error is not None:
                        raise self._error
                    if name in shard.skipped:
                        break
                    if shard.state == "done":  # streamed past and not kept: read more than `start` was told
                        raise InputError(f"{self.repo_id}/{shard.rel}: tensor {name!r} was read more often than "
                                         "planned; this is a bug: run again without --stream and report it")
                    if shard.state == "queued":  # asked before its turn: a connection of its own now
                        self._queue.remove(shard.rel)
                        shard.state = "streaming"
                        threading.Thread(target=self._worker, args=(shard.rel,), daemon=True).start()
                    self._cv.wait()
            finally:
                self._waiting[name] -= 1
                if not self._waiting[name]:
                    del self._waiting[name]
        if name not in self._cache:
            self._refetch(shard, name)
        import torch

        with self._cv:
            buf = self._cache[name]
            self._left[name] -= end - start
            last = self._left[name] <= 0
            if last:
                del self._cache[name]
                self._used -= len(buf)
                self._cv.notify_all()
        data = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        whole = start == 0 and end == len(buf)
        return data if whole and last else data[start:end].clone()

    def _refetch(self, shard: _Remote, name: str) -> None:
        """Fetch `name` again by range into memory, refused unless it is the bytes its stream hashed."""
        info = self.info(name)
        buf, at = bytearray(info.nbytes), 0

        def sink(view: memoryview) -> None:
            nonlocal at
            buf[at:at + len(view)] = view
            at += len(view)
            self.fetched += len(view)

        where = f"{self.repo_id}/{shard.rel}@{self.revision}"
        read_range(shard.url, info.start, info.end, sink, where=where)
        if hashlib.blake2b(buf, digest_size=32).digest() != shard.skipped[name]:
            self._fail(InputError(f"{where}: tensor {name!r} read again differs from the bytes streamed and hashed "
                                  "before; the file changed on the server: run again"))
            raise self._error
        with self._cv:
            if name not in self._cache:
                self._cache[name] = buf
                self._used += info.nbytes

    def read_raw(self, name: str, out=None):
        if self.is_local(name):
            return super().read_raw(name, out)
        data = self._take(name, 0, self.info(name).nbytes)
        if out is None:
            return data
        out.copy_(data)
        return out

    def read_range(self, name: str, start: int, end: int):
        return super().read_range(name, start, end) if self.is_local(name) else self._take(name, start, end)
