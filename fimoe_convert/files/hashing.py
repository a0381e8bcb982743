"""sha256 of files, and of many files on several threads: one sha256 runs at 1.2-1.8 GB/s on the machines
measured, below a fast disk, so a single thread hashing a conversion's inputs finished long after the conversion,
and `verify` of a folder of shards was bound by one core. (A file's sha256 is sequential: the parallelism is across
files.)"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from ..budget import IO_BLOCK

# Threads per core: `verify` hashes on every core; input hashing beside a conversion or a --resume check leaves
# the other cores to the readers, converters and writers.
CORES_PER_HASH = 1
CORES_PER_INPUT_HASH = 4


def hash_threads(cores_per_thread: int) -> int:
    """Hashing threads for this machine: one per `cores_per_thread` cores, at least one."""
    return max(1, (os.cpu_count() or 1) // cores_per_thread)


def sha256(data: bytes = b""):
    import hashlib  # here: only writers and hashers need it, and `inspect` starts without it

    return hashlib.sha256(data)


def sha256_file(path: Path, block: int = IO_BLOCK, on_bytes=None) -> str:
    """The file's sha256 hex digest; `on_bytes(n)` after each block read."""
    h = sha256()
    buf = bytearray(block)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            if on_bytes:
                on_bytes(n)
    return h.hexdigest()


class ParallelHashes:
    """`digest(key)` for every key on `threads` threads, largest first (`size(key)`) so that the threads end
    together; `on_result(key, digest)` as each finishes; `result()` waits and returns {key: digest}, or raises
    the first error. After an error or `cancel()`, keys not yet started are skipped."""

    def __init__(self, keys: list[Hashable], digest: Callable[[Hashable], str | None], threads: int,
                 size: Callable[[Hashable], int], on_result: Callable[[Hashable, str | None], None] | None = None):
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._digest, self._on_result = digest, on_result
        todo = sorted(keys, key=lambda k: -size(k))
        self.workers = min(len(todo), max(1, threads))  # threads that hash
        pool = ThreadPoolExecutor(self.workers or 1, thread_name_prefix="fimoe-hash")
        self._futures = {key: pool.submit(self._one, key) for key in todo}  # the queue is FIFO: largest first
        pool.shutdown(wait=False)

    def _one(self, key: Hashable) -> str | None:
        if self._stop.is_set():
            return None
        try:
            value = self._digest(key)
            if self._on_result is not None:
                self._on_result(key, value)
        except BaseException as e:  # noqa: BLE001 - raised by result()
            self.errors.append(e)
            self._stop.set()
            raise
        return value

    def cancel(self) -> None:
        """Skip the keys not started yet (a failed run stops hashing its inputs)."""
        self._stop.set()
        for f in self._futures.values():
            f.cancel()

    def result(self) -> dict:
        try:
            wait(self._futures.values())
        except BaseException:  # Ctrl-C: the files being hashed end, no more start
            self.cancel()
            raise
        if self.errors:
            raise self.errors[0]
        return {k: f.result() for k, f in self._futures.items()}


def hash_files(paths: list[Path], progress: Callable[[int, int], None] | None = None,
               threads: int | None = None) -> dict[Path, str]:
    """{path: sha256} of `paths`, on `threads` threads (default: one per core), largest first; `progress(done bytes,
    total bytes)` as blocks are hashed (called from the hashing threads, under a lock)."""
    sizes = {p: p.stat().st_size for p in paths}
    total, done = sum(sizes.values()), 0
    lock = threading.Lock()

    def count(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            if progress:
                progress(done, total)

    n = threads or hash_threads(CORES_PER_HASH)
    return ParallelHashes(list(paths), lambda p: sha256_file(p, on_bytes=count), n, sizes.__getitem__).result()
