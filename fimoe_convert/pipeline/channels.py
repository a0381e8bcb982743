"""What the pipeline's threads share: one byte budget for the data in flight, and FIFO channels."""

from __future__ import annotations

import threading
from collections.abc import Iterator


class Stopped(Exception):
    """The pipeline was stopped (a failure elsewhere, or Ctrl-C): the thread that sees it just ends."""


END = object()  # the last item a producer puts into a channel


class Budget:
    """Bytes of host memory held by data in flight (read, converted or waiting to be written), kept under
    `cap`; data that needs more than `cap` alone still proceeds when nothing else is held."""

    def __init__(self, cap: int):
        self.cap = cap
        self.used = 0
        self.cv = threading.Condition()
        self.closed = False

    def acquire(self, n: int) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.closed or self.used <= 0 or self.used + n <= self.cap)
            if self.closed:
                raise Stopped
            self.used += n

    def release(self, n: int) -> None:
        with self.cv:
            self.used -= n
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()


class Channel:
    """A FIFO from one thread to the next. Unbounded: what is in it is already counted in the Budget, which
    bounds it. After `close`, `put` and `get` raise Stopped (a blocked `get` wakes up)."""

    def __init__(self):
        self.items: list = []
        self.cv = threading.Condition()
        self.closed = False

    def put(self, item) -> None:
        with self.cv:
            if self.closed:
                raise Stopped
            self.items.append(item)
            self.cv.notify_all()

    def get(self):
        with self.cv:
            self.cv.wait_for(lambda: self.items or self.closed)
            if not self.items:
                raise Stopped
            return self.items.pop(0)

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.items.clear()
            self.cv.notify_all()

    def drain(self) -> Iterator:
        """Items until END; an exception put by the producer is raised here, in the consumer."""
        while True:
            item = self.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
