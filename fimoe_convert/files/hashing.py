"""sha256 of many files on several threads: one sha256 runs at 1.2-1.8 GB/s on the machines measured, below a
fast disk, so a single thread hashing a conversion's inputs finished long after the conversion, and `verify` of a
folder of shards was bound by one core. (A file's sha256 is sequential: the parallelism is across files.)"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Hashable

from .safetensors import sha256_file

CORES_PER_HASH = 1  # hashing threads for verify and resume: one per core (each also waits on the disk)


class ParallelHashes:
    """`digest(key)` for every key on `threads` threads, largest first (`size(key)`) so that the threads end
    together; `on_result(key, digest)` as each finishes; `result()` waits and returns {key: digest}, or raises
    the first error."""

    def __init__(self, keys: list[Hashable], digest: Callable[[Hashable], str | None], threads: int,
                 size: Callable[[Hashable], int], on_result: Callable[[Hashable, str | None], None] | None = None):
        self.hashes: dict = {}
        self.errors: list[BaseException] = []
        todo = sorted(keys, key=lambda k: -size(k))
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    if not todo or self.errors:
                        return
                    key = todo.pop(0)
                try:
                    value = digest(key)
                    if on_result is not None:
                        on_result(key, value)
                except BaseException as e:  # noqa: BLE001 - raised by result()
                    self.errors.append(e)
                    return
                with lock:
                    self.hashes[key] = value

        n = min(len(todo), max(1, threads))
        self.threads = [threading.Thread(target=work, name=f"fimoe-hash{i}", daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def result(self) -> dict:
        for t in self.threads:
            t.join()
        if self.errors:
            raise self.errors[0]
        return self.hashes


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

    n = threads or max(1, (os.cpu_count() or 1) // CORES_PER_HASH)
    return ParallelHashes(list(paths), lambda p: sha256_file(p, on_bytes=count), n, sizes.__getitem__).result()
