"""What the command line shows while it works: byte progress, log lines, and one-line reports.

Progress is a tqdm bar on a terminal that reports its width and a plain line every few seconds otherwise (a log
file gets no `\\r` redraws); only rank 0 of a torchrun launch shows anything."""

from __future__ import annotations

import os
import sys
import time

from .sizes import human

PLAIN_EVERY_S = 5.0  # seconds between progress lines when stderr is not a terminal


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def setup_logging(verbose: int, quiet: bool) -> None:
    """-v: the steps of the work (INFO); -vv: details (DEBUG); -q: warnings only; default: warnings."""
    import logging  # here: 20 ms of start-up that `--help` and `targets` need not pay

    level = logging.WARNING if quiet or verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    log = logging.getLogger("fimoe_convert")
    log.setLevel(level)
    if not any(getattr(h, "fimoe", False) for h in log.handlers):
        handler = _stderr_handler()
        handler.fimoe = True
        handler.setFormatter(logging.Formatter("fimoe-convert: %(message)s"))
        log.addHandler(handler)


def _stderr_handler():
    """A logging handler that writes to whatever sys.stderr is now (a test runner may have replaced it since)."""
    import logging

    class Stderr(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            print(self.format(record), file=sys.stderr, flush=True)

    return Stderr()


def terminal_columns() -> int:
    """The width stderr's terminal reports (0 on some: a fresh pty, a serial console)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


class Progress:
    """A byte counter shown as `desc`: call it with (done, total); `close()` when the work ends or fails."""

    def __init__(self, desc: str, enabled: bool = True):
        self.desc = desc
        self.enabled = enabled and is_rank0()
        self.bar = None
        self.t0 = self.last = time.monotonic()
        self.done = self.total = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        self.done, self.total = done, total
        if sys.stderr.isatty() and terminal_columns() > 0:  # a bar 0 columns wide shows nothing: plain lines
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc=self.desc,
                                file=sys.stderr, dynamic_ncols=True)
            self.bar.update(done - self.bar.n)
        elif time.monotonic() - self.last >= PLAIN_EVERY_S or done >= total:
            self.last = time.monotonic()
            print(self.line(), file=sys.stderr, flush=True)

    def line(self) -> str:
        secs = max(time.monotonic() - self.t0, 1e-9)
        rate = self.done / secs
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        pct = 100 * self.done / self.total if self.total else 100.0
        eta = f", about {left:.0f} s left" if self.done < self.total and left != float("inf") else ""
        return f"{self.desc}: {human(self.done)} of {human(self.total)} ({pct:.0f}%), {human(rate)}/s{eta}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")

