"""sha256 of many files on a few daemon threads, beside other work: one sha256 runs at 1.2-1.8 GB/s on the
machines measured, below a fast disk, so one thread finished long after a conversion that writes as many
bytes as it reads."""

from __future__ import annotations

import threading
from typing import Callable, Hashable


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
