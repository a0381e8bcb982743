"""SRC streamed from the Hub (--stream): the shards' bytes go from HTTP into the conversion, never to disk.

Design: each remote SOURCE shard is cut into pieces at its tensors' edges (small tensors together, up to
PIECE_MIN_BYTES) and at every `grid` bytes (chunk_bytes: CHUNK_BYTES, fewer with a small budget); one ranged GET
fetches the queued pieces of one grid cell together, so a shard's first pass is one GET per `grid` bytes.
`connections` workers (--connections) take them in the order the conversion consumes their bytes (the plan's
reads), so many connections, on one shard and across shards, fill a link that one connection cannot. Each shard's
sha256 is computed over its contiguous prefix as pieces land (in file order) and compared with the Hub's own record
(the LFS sha256) at its end: the check covers every byte, the header included. A piece's priority is the earliest
read of it or of any later piece of its shard, so a shard is fetched front to back and its hash never waits long.

Memory: pieces received are held (at most `cap` bytes, in flight included; anonymous mappings, returned to the
system as each is released) until hashed and read by every planned read. The conversion reads a shard's tensors
in its own order, not in file order, so a shard arrives ahead of its reads: `cap` is what --max-memory leaves
beside the conversion's own working set (budget.MemoryBudget.stream_bytes). With no room, fetching ahead waits;
while a reader waits, the hashed piece needed last, if later than the next one, is dropped, its blake2b kept;
fetched again (that piece's bytes only), they must match that hash, so every byte converted is a byte checked.
`peak_need` (held plus dropped and needed again, at most) is what a cap without re-fetches takes. An output shard
converted from a source shard not yet verified is written but recorded as finished only once every source shard it
read is verified; a mismatch stops the run naming the shard and deletes those outputs.

Large files on the Hub are stored elsewhere: the resolve URL answers 302 to a storage host with a signed URL that
takes Range. Ranges go there directly, without the Hub token; a refused signed URL (expired) is resolved again.

`stream_early` opens SRC and begins the streams (shards in index order, pieces kept within the cap) on a thread
while the caller imports the converters (torch: seconds); the conversion's `open_streamed` takes that source over,
and `start` then gives the pieces the plan's order and drops what the plan does not read."""

from __future__ import annotations

import bisect
import collections
import ctypes
import hashlib
import heapq
import mmap
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import fields
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import InputError, UsageError
from ...records import FileRecord
from ..safetensors.header import parse_header
from .http_range import Stop, read_range
from .hub import HUB_PATTERNS, _is_repo_id, describing_files, outside_repo
from .local import Source, open_source, summarized

CONNECTIONS = 16  # ranged GETs at once (--connections): 16 x ~100 MB/s per connection fills a 1 GB/s link
CHUNK_BYTES = 32 << 20  # bytes per ranged GET at most: long enough for a connection to reach its speed
MIN_CHUNK_BYTES = 1 << 20  # ... and at least, however small the memory budget
PIECE_MIN_BYTES = 1 << 20  # bytes held and dropped together at least (tensors smaller than this, with their neighbors)
METADATA_THREADS = 8  # HEAD requests for the shards' LFS records at once
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")  # a file stored in git itself, not LFS: its etag is the git blob sha1
_LAST = float("inf")  # the priority of bytes no planned read needs: hashed after the rest


def chunk_bytes(cap: int, connections: int) -> int:
    """Bytes per ranged GET: CHUNK_BYTES, fewer where `connections` chunks in flight would take over half of the
    memory `cap`."""
    return max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, cap // (2 * connections)))


def piece_edges(ends: list[int], size: int, grid: int, least: int) -> list[int]:
    """A shard's piece edges, from 0 to `size`: every `grid` bytes, and at each of `ends` (where the header and each
    tensor end) that closes a piece of at least `least` bytes."""
    edges = [0]
    for e in sorted({*ends, size}):
        while (nxt := edges[-1] // grid * grid + grid) < e:
            edges.append(nxt)
        if e > edges[-1] and (e - edges[-1] >= least or e == size or e % grid == 0):
            edges.append(e)
    return edges


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


class _Chunk:
    """A piece: bytes [start, end) of a remote shard and where they are: queued, fetching, held (`data`), or
    dropped; `index`: its place in the shard's pieces, `cell`: its grid cell (one GET fetches a cell's pieces)."""

    __slots__ = ("shard", "start", "end", "key", "index", "cell", "reads", "data", "hashed", "digest", "users",
                 "queued", "busy")

    def __init__(self, shard: "_Remote", start: int, end: int, key: tuple, index: int, cell: int):
        self.shard, self.start, self.end, self.key, self.index, self.cell = shard, start, end, key, index, cell
        self.reads: collections.deque[int] | None = None  # planned reads (their index) not made yet; None: no plan
        self.data: mmap.mmap | None = None
        self.hashed = False  # the shard's sha256 has taken these bytes
        self.digest: bytes | None = None  # blake2b of the bytes first received, once they were dropped
        self.users = 0  # readers and the hasher copying from `data`
        self.queued = True  # in the fetch queue (never fetched, or dropped and needed again)
        self.busy = False  # being fetched

    @property
    def size(self) -> int:
        return self.end - self.start


class _Remote:
    """One source shard on the Hub: its pieces, and its sha256 over the prefix received so far."""

    def __init__(self, rel: str, url: str, size: int, etag: str, location: str, order: int):
        self.rel, self.url, self.size, self.etag, self.order = rel, url, size, etag, order
        self.direct = _elsewhere(url, location)  # a storage host's signed URL the Hub redirects to, or None
        self.chunks: list[_Chunk] = []  # its pieces, in file order
        self.starts: list[int] = []  # where each piece starts
        self.next = 0  # the first piece not hashed yet
        self.hashing = False
        self.sha256 = hashlib.sha256()
        self.git = hashlib.sha1(b"blob %d\0" % size) if len(etag) == 40 else None
        self.done = False
        self.head: bytearray | None = bytearray()  # the streamed header as hashed; None once checked against the plan's


def _elsewhere(url: str, location: str | None) -> str | None:
    """`location` where it is on another host than `url` (a redirect to storage), else None."""
    if not location:
        return None
    a, b = urlsplit(url), urlsplit(location)
    return location if b.netloc and (a.scheme, a.netloc) != (b.scheme, b.netloc) else None


_EARLY: dict[tuple[str, str | None], Future] = {}  # stream_early's sources, until open_streamed takes them


def stream_early(spec: str, revision: str | None, cap: int, connections: int = CONNECTIONS) -> None:
    """Open SRC `spec` and begin its streams on a thread now (`connections` at once, holding at most `cap` bytes of
    pieces); the next
    `open_streamed(spec, revision)` returns that source (or raises its error). Streams begun already for SRC are
    kept (a caller began them before convert(), which begins them too)."""
    if (spec, revision) in _EARLY:
        return
    future: Future = Future()
    _EARLY[(spec, revision)] = future

    def run() -> None:
        try:
            source = _open_streamed(spec, revision)
            source._start_early(cap, connections)
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
    """A Source whose shards in `remote` are read from the Hub in pieces (local shards as usual). `start` begins
    the fetches, `read`/`read_range` take bytes from the pieces, `verified` waits for every sha256."""

    def attach(self) -> None:
        """Read each remote shard's LFS record (sha256, size, where it is stored) from the Hub; all problems at
        once."""
        from concurrent.futures import ThreadPoolExecutor

        from huggingface_hub import hf_hub_url

        def record(rel: str):
            where = f"{self.repo_id}/{rel}@{self.revision}"
            url = hf_hub_url(self.repo_id, rel, revision=self.revision)
            try:
                meta = _metadata(url)
            except Exception as e:  # HTTP and transport errors: one line each, listed together
                return None, f"{where}: reading its record from the Hub failed ({type(e).__name__}); check the network"
            etag, size = (meta.etag or "").lower(), self.headers[rel].file_size
            if not (_SHA256_RE.match(etag) or _SHA1_RE.match(etag)):
                return None, (f"{where}: the Hub gives no sha256 for it (etag {meta.etag!r}), so its bytes cannot be "
                              "checked as they stream: download the repo first (drop --stream)")
            if meta.size != size:
                return None, f"{where}: the Hub records {meta.size} bytes, its header was read from {size}"
            return _Remote(rel, url, size, etag, meta.location, rels.index(rel)), None

        rels = sorted(self.remote)
        with ThreadPoolExecutor(METADATA_THREADS) as pool:
            got = dict(zip(rels, pool.map(record, rels)))
        problems = [p for _, p in got.values() if p]
        if problems:
            from ...errors import ValidationError

            raise ValidationError(summarized(problems, "shard records could not be read from the Hub"))
        self._shards: dict[str, _Remote] = {rel: r for rel, (r, _) in got.items()}
        # One lock, two conditions: readers (and `verified`) wait on _cv for bytes and checks, fetch workers on
        # _work for pieces and room; a piece read or hashed wakes one worker, not every thread of the run.
        self._cv = threading.Condition()
        self._work = threading.Condition(self._cv._lock)
        self._queue: list[tuple[tuple, int, _Chunk]] = []  # heap: (key, tie, piece) of pieces to fetch
        self._tie = 0
        self._held = self._cap = 0  # bytes of pieces held or in flight, and at most
        self._holding: set[_Chunk] = set()  # pieces held
        self._dropped = 0  # bytes of pieces dropped and not fetched again yet
        self._fetching = 0
        self._waiting: collections.Counter[_Chunk] = collections.Counter()  # pieces readers wait for
        self._sha: dict[str, str] = {}  # verified shards
        self._read_from: set[str] = set()  # shards whose bytes the conversion took
        self._pending: list[tuple[set[str], Path, Callable[[], None]]] = []
        self._error: BaseException | None = None
        self._closed = self._started = self._early = False
        self._on_verified: Callable[[str, str], None] = lambda rel, sha: None
        self.fetched = 0  # bytes received from the Hub, over all pieces and re-reads
        self.peak_held = 0  # bytes held or in flight at most
        self.peak_need = 0  # ... and with the bytes dropped to stay within the cap: a cap that re-fetches nothing
        self.connections = CONNECTIONS
        for rel in self.remote:  # no local file: the identity of a Hub file at a pinned commit is its size
            self.identities[rel] = FileRecord(self._shards[rel].size, None, mtime_ns=0, ctime_ns=0, inode=0, dev=0)

    # -- files -------------------------------------------------------------------------------------------------

    def identity(self, rel: str) -> FileRecord:
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

    # -- the schedule ------------------------------------------------------------------------------------------

    def start(self, reads: list[tuple[str, int]], carried: dict[str, str | None], cap: int,
              on_verified: Callable[[str, str], None], connections: int | None = None) -> None:
        """Begin fetching. `reads`: (tensor, bytes) the conversion will read, in its order (a tensor read in
        parts is read front to back); `carried`: the sha256 an earlier run verified (--resume); `cap`: bytes of
        pieces held at once; `on_verified(rel, sha256)` as each shard is verified; `connections`: ranged GETs at
        once. A shard none of whose tensors is read and whose sha256 was verified before is not fetched at all."""
        touched = {self.weight_map[n] for n, _ in reads} & set(self._shards)
        with self._cv:
            self._cap, self._on_verified, self._started = cap, on_verified, True
            if not self._early:
                self.connections = connections or self.connections
                for rel, shard in self._shards.items():
                    old = carried.get(rel)
                    if rel not in touched and old and _SHA256_RE.match(shard.etag):
                        if old != shard.etag:
                            raise InputError(f"--resume: {self.repo_id}/{rel}@{self.revision}: the Hub records "
                                             f"sha256 {shard.etag[:16]}..., the earlier run verified {old[:16]}...; "
                                             "run with --overwrite in place of --resume to convert again")
                        shard.done = True
                        self._sha[rel] = old
                    else:
                        self._cut(shard, chunk_bytes(cap, self.connections))
            self._plan(reads)
            done = dict(self._sha) if self._early else {}
            self._cv.notify_all()
            self._work.notify_all()
        if not self._early:
            self._spawn()
        for rel, sha in done.items():  # verified by early fetches before the plan came
            on_verified(rel, sha)

    def _start_early(self, cap: int, connections: int) -> None:
        """Begin fetching before the plan is known: shards in index order, every piece kept within `cap`."""
        with self._cv:
            self._cap, self._early, self.connections = cap, True, connections
            for shard in self._shards.values():
                self._cut(shard, chunk_bytes(cap, connections))
        self._spawn()

    def _cut(self, shard: _Remote, grid: int) -> None:
        header = self.headers[shard.rel]
        ends = [header.data_start, *(t.end for t in header.tensors.values())]
        edges = piece_edges(ends, shard.size, grid, min(PIECE_MIN_BYTES, grid))
        shard.chunks = [_Chunk(shard, a, b, (shard.order, a), i, a // grid)
                        for i, (a, b) in enumerate(zip(edges, edges[1:]))]
        shard.starts = edges[:-1]
        for c in shard.chunks:
            self._push(c)

    def _push(self, c: _Chunk) -> None:
        c.queued = True
        self._tie += 1
        heapq.heappush(self._queue, (c.key, self._tie, c))

    def _plan(self, reads: list[tuple[str, int]]) -> None:
        """Give each piece the planned reads of its bytes and a priority: the earliest read of it or of a later
        piece of its shard (so the shard's hash runs front to back); drop what the plan does not read."""
        at: dict[str, int] = {}  # a tensor read in parts: where its next part starts
        for c in (c for s in self._shards.values() for c in s.chunks):
            c.reads = collections.deque()
        for i, (name, n) in enumerate(reads):
            shard = self._shards.get(self.weight_map[name])
            if shard is None or not shard.chunks:
                continue
            info = self.info(name)
            lo = info.start + at.get(name, 0)
            at[name] = (at.get(name, 0) + n) % max(info.nbytes, 1)
            for c in self._covering(shard, lo, lo + n):
                if not c.reads or c.reads[-1] != i:
                    c.reads.append(i)
        for shard in self._shards.values():
            best = _LAST
            for c in reversed(shard.chunks):
                best = min(best, c.reads[0] if c.reads else _LAST)
                c.key = (best, shard.order, c.start)
            for c in shard.chunks:
                self._release(c)
        self._queue = []
        for c in (c for s in self._shards.values() for c in s.chunks):
            if c.queued:
                self._push(c)

    @staticmethod
    def _covering(shard: _Remote, lo: int, hi: int) -> list[_Chunk]:
        first = bisect.bisect_right(shard.starts, lo) - 1
        return shard.chunks[first:max(bisect.bisect_left(shard.starts, hi), first + 1)]

    def _spawn(self) -> None:
        for i in range(self.connections):
            threading.Thread(target=self._worker, name=f"fimoe-stream{i}", daemon=True).start()

    # -- fetching ----------------------------------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            with self._cv:
                run = self._next()
                if run is None:
                    return
            try:
                data = self._fetch(run)
            except Stop:
                return
            except BaseException as e:  # noqa: BLE001 - handed to every reader and to `verified`
                self._fail(e)
                return
            self._arrived(run, data)

    def _next(self) -> list[_Chunk] | None:
        """The next pieces to fetch with one GET (under the lock): the first piece a reader waits for, else the
        queue's first, when it fits within the cap (pieces needed later dropped to make room) or when readers wait
        and nothing else is in flight, and the queued pieces after it in its grid cell that fit as well; None once
        closed."""
        while not self._closed:
            while self._queue and not self._queue[0][2].queued:
                heapq.heappop(self._queue)  # fetched already under an earlier key
            if self._queue:
                c = self._queue[0][2]
                # a piece a reader waits for goes first (the lanes' real order can run ahead of the plan's)
                c = min((w for w in self._waiting if w.queued), key=lambda w: w.key, default=c)
                if self._fits(c) or (self._waiting and not self._fetching):
                    if c is self._queue[0][2]:
                        heapq.heappop(self._queue)
                    run = [c]
                    for d in c.shard.chunks[c.index + 1:]:
                        if (d.cell != c.cell or not d.queued or d.busy or d.data is not None
                                or self._held + sum(x.size for x in run) + d.size > self._cap):
                            break
                        run.append(d)
                    for d in run:
                        d.queued, d.busy = False, True
                        self._held += d.size
                    self._fetching += 1
                    self._peak()
                    self._work.notify()  # another piece may fit as well
                    return run
            self._work.wait()
        return None

    def _peak(self) -> None:
        self.peak_held = max(self.peak_held, self._held)
        self.peak_need = max(self.peak_need, self._held + self._dropped)

    def _fits(self, c: _Chunk) -> bool:
        """Whether `c` fits within the cap, dropping held pieces needed later than `c` (latest first) while a reader
        waits: a fetch ahead of the readers waits for room instead (what it would drop is fetched again). Only hashed
        pieces: one dropped before the hash took it would stall its shard's hash, and every piece after it, until
        fetched again."""
        if self._held + c.size <= self._cap:
            return True
        if c.reads is None or not self._waiting:
            return False  # before the plan: every piece may be read
        later = sorted((h for h in self._holding if h.hashed and not h.users and self._need(h) > c.key[0]),
                       key=self._need, reverse=True)
        for h in later:
            h.digest = hashlib.blake2b(h.data, digest_size=32).digest()  # the bytes fetched again must match it
            self._drop(h)
            self._dropped += h.size
            self._push_again(h)
            if self._held + c.size <= self._cap:
                return True
        return False

    def _drop(self, c: _Chunk) -> None:
        """Let go of `c`'s bytes (under the lock)."""
        c.data = None
        self._held -= c.size
        self._holding.discard(c)

    @staticmethod
    def _need(c: _Chunk) -> float:
        """When the conversion or the hash next needs piece `c`: its next planned read, else its priority."""
        return c.reads[0] if c.reads else c.key[0]

    def _push_again(self, c: _Chunk) -> None:
        c.key = (self._need(c), c.shard.order, c.start)
        self._push(c)

    def _fetch(self, run: list[_Chunk]) -> list[mmap.mmap]:
        """The bytes of the consecutive pieces `run` from the Hub, with one GET (from the shard's storage host,
        without the Hub's token, where it redirects), each piece into an anonymous mapping of its own."""
        shard = run[0].shard
        bufs = [mmap.mmap(-1, c.size) for c in run]
        views = [memoryview(b) for b in bufs]
        at, piece = 0, 0  # bytes received; the piece holding byte `at`

        def into(pos: int, n: int) -> memoryview:
            nonlocal at, piece
            if self._closed:
                raise Stop
            at = pos - run[0].start
            while pos >= run[piece].end:
                piece += 1
            while pos < run[piece].start:  # asked again from an earlier byte
                piece -= 1
            c = run[piece]
            return views[piece][pos - c.start:min(c.end, pos + n) - c.start]

        where = f"{self.repo_id}/{shard.rel}@{self.revision}"
        direct, start, end = shard.direct, run[0].start, run[-1].end
        try:
            read_range(direct or shard.url, start, end, into, token=False if direct else None, where=where)
        except InputError:
            if direct is None:
                raise
            # a signed URL lasts hours: refused, it is asked of the Hub again, once
            shard.direct = _elsewhere(shard.url, _metadata(shard.url).location) or shard.direct
            read_range(shard.direct, start + at, end, into, token=False, where=where)
        return bufs

    def _arrived(self, run: list[_Chunk], data: list[mmap.mmap]) -> None:
        shard = run[0].shard
        where = f"{self.repo_id}/{shard.rel}@{self.revision}"
        for c, buf in zip(run, data, strict=True):
            if c.digest is not None and hashlib.blake2b(buf, digest_size=32).digest() != c.digest:
                self._fail(InputError(f"{where}: bytes {c.start}-{c.end - 1} read again differ from the bytes read "
                                      "before; the file changed on the server: run again"))
                return
        with self._cv:
            self._fetching -= 1
            for c, buf in zip(run, data, strict=True):
                self.fetched += c.size
                if c.digest is not None:
                    self._dropped -= c.size
                c.busy, c.data, c.digest = False, buf, None
                self._holding.add(c)
            self._cv.notify_all()
            self._work.notify()
        self._hash(shard)

    def _hash(self, shard: _Remote) -> None:
        """Take the shard's pieces received in file order into its sha256; one thread at a time per shard."""
        while True:
            with self._cv:
                c = shard.chunks[shard.next] if shard.next < len(shard.chunks) else None
                if shard.hashing or c is None or c.data is None or self._closed:
                    return
                shard.hashing = True
                c.users += 1
            shard.sha256.update(c.data)
            if shard.git is not None:
                shard.git.update(c.data)
            if shard.head is not None and not self._header_seen(shard, c):
                return
            with self._cv:
                shard.hashing = False
                c.users -= 1
                c.hashed = True
                shard.next += 1
                self._release(c)
                self._work.notify()  # room, or a piece that may now be dropped for one a reader waits for
            if shard.next == len(shard.chunks):
                return self._check(shard)

    def _header_seen(self, shard: _Remote, c: _Chunk) -> bool:
        """Keep the header's bytes of `c` (hashed in file order); once whole, compare it with the header the plan was
        made from, before any tensor of the shard is taken (`_take` waits for it). False: it differs (the run fails)."""
        planned = self.headers[shard.rel]
        shard.head.extend(memoryview(c.data)[:max(planned.data_start - c.start, 0)])
        if len(shard.head) < planned.data_start:
            return True
        try:
            _same_header(bytes(shard.head), planned, shard.size, f"{self.repo_id}/{shard.rel}@{self.revision}")
        except InputError as e:
            self._fail(e)
            return False
        with self._cv:
            shard.head = None
            self._cv.notify_all()
        return True

    def _release(self, c: _Chunk) -> bool:
        """Drop `c`'s bytes once hashed and read by every planned read (under the lock); whether it did."""
        if c.data is not None and c.hashed and c.reads is not None and not c.reads and not c.users:
            self._drop(c)
            return True
        return False

    def _check(self, shard: _Remote) -> None:
        where = f"{self.repo_id}/{shard.rel}@{self.revision}"
        got = (shard.git or shard.sha256).hexdigest()
        if got != shard.etag:
            self._fail(InputError(f"{where}: the {'sha256' if shard.git is None else 'git sha1'} of the bytes "
                                  f"received, {got[:16]}..., differs from the Hub's record, {shard.etag[:16]}...; "
                                  "nothing converted from it is kept: run again with --resume (a damaged transfer), "
                                  "or download the repo first to check the file"))
            return
        sha = shard.sha256.hexdigest()
        with self._cv:
            shard.done = True
            self._sha[shard.rel] = sha
            ready = [p for p in self._pending if p[0] <= set(self._sha)]
            self._pending = [p for p in self._pending if p not in ready]
            on_verified = self._on_verified  # read here: `start` records the shards verified before it
            self._cv.notify_all()
        on_verified(shard.rel, sha)
        for _, _, fn in ready:
            fn()

    def _fail(self, error: BaseException) -> None:
        """Stop every fetch and reader with `error`; delete the outputs converted from unverified bytes."""
        with self._cv:  # deleted before a reader or `verified` wakes to raise the error: OUT is final once raised
            if self._error is None:
                self._error = error
            self._closed = True
            for _, path, _ in self._pending:
                path.unlink(missing_ok=True)
            self._pending = []
            self._cv.notify_all()
            self._work.notify_all()

    def close(self, failed: bool = False) -> None:
        """End the fetches (the run is over); with `failed`, delete outputs whose sources were not verified."""
        if failed:
            self._fail(InputError("the conversion stopped"))
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            self._work.notify_all()

    def interrupt(self) -> None:
        """The conversion stops: readers waiting for bytes wake (raising Stop) and the fetches end, at once."""
        self._fail(Stop("the conversion stopped"))

    def explain(self, error: BaseException) -> BaseException:
        """What to report for `error`, raised while converting: a check of tensor values can see a bad byte from
        the Hub before its shard's sha256 does. The shards read from and not verified yet are finished first (their
        pieces not hashed yet fetched ahead of everything, for the hash alone); their mismatch, or any failure of
        the streams, is reported in place of `error`. A stop (Ctrl-C) ends the wait."""
        with self._cv:
            rels = {r for r in self._read_from if r not in self._sha}
            pieces = [c for r in rels for c in self._shards[r].chunks if not c.hashed]
            for c in pieces:
                c.reads = collections.deque()  # no read will come: released once hashed
                c.key = (-1, c.shard.order, c.start)
                if c.queued:
                    self._push(c)
                self._waiting[c] += 1  # held pieces needed later are dropped to make room for these
            self._work.notify_all()
            try:
                self._cv.wait_for(lambda: self._error is not None or rels <= set(self._sha))
            finally:
                for c in pieces:
                    self._waiting[c] -= 1
                    if not self._waiting[c]:
                        del self._waiting[c]
            return error if self._error is None or isinstance(self._error, Stop) else self._error

    def after_verified(self, tensors: set[str], path: Path, fn: Callable[[], None]) -> None:
        """Call `fn` (record the output shard `path` as finished) once every source shard holding one of
        `tensors` is verified: now, or from the fetch that verifies the last."""
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
        """{shard: sha256} of `rels` (default: every remote shard), waiting for their fetches; raises the
        fetch's error (a mismatch names the shard)."""
        rels = list(self._shards) if rels is None else rels
        with self._cv:
            self._cv.wait_for(lambda: self._error is not None or all(r in self._sha for r in rels))
            if self._error is not None:
                raise self._error
            return {r: self._sha[r] for r in rels}

    # -- tensors -----------------------------------------------------------------------------------------------

    def _take(self, name: str, start: int, end: int, out=None):
        """Bytes [start, end) of remote tensor `name` (uint8, into `out` where given), from the pieces that hold
        them: waiting for each (first in the queue while a reader waits), fetched again where it was dropped."""
        import torch

        shard = self._shards[self.weight_map[name]]
        self._read_from.add(shard.rel)
        info = self.info(name)
        lo, hi = info.start + start, info.start + end
        buf = out.view(torch.uint8).view(-1) if out is not None else torch.empty(hi - lo, dtype=torch.uint8)
        if buf.numel() != hi - lo:  # _copy writes by address: a buffer of another size is a bug, not a fault
            raise ValueError(f"tensor {name!r}: a buffer of {buf.numel()} bytes for {hi - lo}")
        for c in self._covering(shard, lo, hi) if hi > lo else []:
            with self._cv:
                if c.data is None or shard.head is not None:
                    if c.data is None and not c.queued and not c.busy:
                        if c.digest is None:
                            raise InputError(f"{self.repo_id}/{shard.rel}: tensor {name!r} was read more often "
                                             "than planned; this is a bug: run again without --stream and report it")
                        self._push_again(c)
                    self._waiting[c] += 1
                    self._work.notify()  # a fetch waiting for room goes now
                    try:
                        self._cv.wait_for(lambda: (c.data is not None and shard.head is None)  # noqa: B023
                                          or self._error is not None)
                    finally:
                        self._waiting[c] -= 1
                        if not self._waiting[c]:
                            del self._waiting[c]
                if self._error is not None:
                    raise self._error
                c.users += 1
            a, b = max(lo, c.start), min(hi, c.end)
            try:
                _copy(buf, a - lo, c.data, a - c.start, b - a)
            finally:
                with self._cv:
                    c.users -= 1
                    if c.reads:
                        c.reads.popleft()
                    if self._release(c) or self._waiting:
                        self._work.notify()  # room, or a piece that may now be dropped for a waiting reader
        return buf

    def read_raw(self, name: str, out=None):
        if self.is_local(name):
            return super().read_raw(name, out)
        return self._take(name, 0, self.info(name).nbytes, out)

    def read_range(self, name: str, start: int, end: int):
        return super().read_range(name, start, end) if self.is_local(name) else self._take(name, start, end)


def _copy(dst, at: int, src: mmap.mmap, start: int, n: int) -> None:
    """Bytes [start, start + n) of the piece `src` into the contiguous uint8 tensor `dst` from byte `at`: one memmove
    with the GIL released (a tensor copy takes a team of OpenMP threads per lane, about twice the CPU)."""
    view = ctypes.c_char.from_buffer(src)
    try:
        ctypes.memmove(dst.data_ptr() + at, ctypes.addressof(view) + start, n)
    finally:
        del view


def _metadata(url: str):
    """The Hub's record of the file at `url`: sha256 (etag), size, and where it is stored (location)."""
    from huggingface_hub import get_hf_file_metadata

    return get_hf_file_metadata(url)
