"""What the command line shows while it works (byte progress, log lines, one-line reports), and how a signal stops
a command (SIGINT, SIGTERM and SIGHUP raised as Ctrl-C in the main thread).

Progress is a tqdm bar on a terminal that reports its width and a plain line every few seconds otherwise (a log
file gets no `\\r` redraws); only rank 0 of a torchrun launch shows anything."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import threading
import time

from .sizes import duration, human

PLAIN_EVERY_S = 5.0  # seconds between progress lines when stderr is not a terminal
RATE_WINDOW_S = 10.0  # the progress rate and time left come from the bytes done in these last seconds
# The units' bytes written say their time left (beside their runs') once this share of them is written: before,
# they are a few of the first units' outputs, written at their runs' warm-up pace (1.9x the truth a tenth into a
# megamoe run, measured), where the runs already have warm ones.
UNITS_WRITTEN_SHARE = 0.1
COPIES, UNITS = "copies", "units"  # a conversion's parts: tensors copied as they are, and units' outputs
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what stops a command as Ctrl-C does
# tqdm's bar without its own time left (from its byte rate, which disagreed with ours): ours is the postfix
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"
BAR_EVERY_S = 0.1  # seconds: tqdm's own least time between redraws (mininterval)


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
        # (seconds, bytes done) of the calls in the last RATE_WINDOW_S: the rate is that of the recent bytes. Not
        # from the start: the seconds before the first call (imports, checks, the first unit) and a slow first
        # stretch (the inputs hashed beside) told "3072 s left" of a 20 s job.
        self.points: collections.deque[tuple[float, int]] = collections.deque()
        # With parts (a conversion's copies and units): {part: (done, total)}, and (time, part, bytes, seconds) of the
        # calls in the last RATE_WINDOW_S, each charged the seconds since the call before. A copied byte costs far
        # less than a converted one: one byte rate over copies done first told "1 s left" of 5 s of units.
        self.parts: dict[str, tuple[int, int]] = {}
        self.charged: collections.deque[tuple[float, str, int, float]] = collections.deque()
        self.charged_ever: dict[str, tuple[int, float]] = {}  # {part: (bytes, seconds)} since the first call
        # The seconds the units not yet run will take (convert()'s eta.UnitRuns), None before any has run: the
        # units' cost from the first unit run on, before any of its outputs is written (a whole-block unit's come
        # late in the run). The seconds up to the first units' bytes written are not charged to them: they are the
        # pipeline's fill (that unit's read, its run's compiles and warm-ups), paid once; their seconds per byte
        # count once as many bytes are charged (a unit's 24-byte scale written 10 ms after its weight read as 1 h).
        self.runs_left: float | None = None
        self.units_fill = 0  # bytes
        self.runs_warm = False  # runs_left rests on a second run of a kind (a first pays compiles and warm-ups)
        # Plain lines shown with a time left: 1 once one is, 2 once one from warm runs is. Each is shown at once,
        # not PLAIN_EVERY_S later: a run of a few seconds showed none, and a first run's excess stood for seconds.
        self.told = 0
        self.bar_at = -BAR_EVERY_S  # when the bar's time left was last summed

    takes_parts = True  # convert() gives it `parts`, `runs_left` and `runs_warm`

    def __call__(self, done: int, total: int, parts: dict[str, tuple[int, int]] | None = None,
                 runs_left: float | None = None, runs_warm: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if runs_left is not None:
            self.runs_left, self.runs_warm = runs_left, runs_warm
        if done != self.done or not self.points:  # a call for a unit run alone moves no bytes: nothing to charge
            if parts is not None:
                self._charge(now, parts)
            self.points.append((now, done))
            while len(self.points) > 2 and self.points[1][0] <= now - RATE_WINDOW_S:
                self.points.popleft()  # the oldest kept is at or just before the window's start
        self.done, self.total = done, total
        if sys.stderr.isatty() and terminal_columns() > 0:  # a bar 0 columns wide shows nothing: plain lines
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, unit_divisor=1000,
                                desc=self.desc, file=sys.stderr, dynamic_ncols=True, bar_format=BAR_FORMAT)
            if now - self.bar_at >= BAR_EVERY_S:  # tqdm redraws at most that often: the time left is summed as often
                self.bar_at = now
                self.bar.set_postfix_str(self.left(), refresh=False)
            self.bar.update(done - self.bar.n)
        elif time.monotonic() - self.last >= PLAIN_EVERY_S or done >= total or self.told < 1 + self.runs_warm and \
                self.left():
            self.last = time.monotonic()
            line = self.line()
            if line.endswith(" left"):
                self.told = max(self.told, 1 + self.runs_warm)
            print(line, file=sys.stderr, flush=True)

    def _charge(self, now: float, parts: dict[str, tuple[int, int]]) -> None:
        """The seconds since the call before, charged to the parts whose bytes this call counts (by their bytes)."""
        grew = {k: d - self.parts.get(k, (0, 0))[0] for k, (d, _) in parts.items()}
        grew = {k: n for k, n in grew.items() if n > 0}
        if self.points and grew:  # the first call's bytes: no seconds known to charge them (as the rate's)
            per_byte = (now - self.points[-1][0]) / sum(grew.values())
            for k, n in grew.items():
                if k == UNITS and not self.units_fill:  # the pipeline's fill: the first unit's read and run
                    self.units_fill = n
                    continue
                self.charged.append((now, k, n, n * per_byte))
                b, s = self.charged_ever.get(k, (0, 0.0))
                self.charged_ever[k] = (b + n, s + n * per_byte)
        while self.charged and self.charged[0][0] <= now - RATE_WINDOW_S:
            self.charged.popleft()
        self.parts = dict(parts)

    def seconds_left(self) -> float | None:
        """With parts: each part's bytes left at its own seconds per byte (from its calls in the last
        RATE_WINDOW_S, or since the first call if none was that recent; for the units, the larger of that and
        the seconds their runs left take), summed; None until every part with bytes left has a cost. Without: the bytes
        left at the rate of the last RATE_WINDOW_S."""
        if self.parts:
            recent: dict[str, tuple[int, float]] = {}
            for _, k, n, s in self.charged:
                b, t = recent.get(k, (0, 0.0))
                recent[k] = (b + n, t + s)
            left = 0.0
            for k, (d, total) in self.parts.items():
                if d >= total:
                    continue
                b, s = recent.get(k) or self.charged_ever.get(k, (0, 0.0))
                said = [(total - d) * s / b] if b > 0 and (k != UNITS or b >= self.units_fill) else []
                if k == UNITS and self.runs_left is not None:  # writing may cost more than the runs: the larger
                    if d < UNITS_WRITTEN_SHARE * total and self.runs_warm:
                        said = []
                    said.append(self.runs_left)
                if not said:
                    return None
                left += max(said)
            return left
        t_old, d_old = self.points[0] if self.points else (self.t0, 0)
        now = time.monotonic()
        if now > t_old and self.done > d_old:
            return (self.total - self.done) * (now - t_old) / (self.done - d_old)
        return None

    def left(self) -> str:
        """The time left as both the plain line and the terminal's bar show it ('about 12 s left'), or ''."""
        secs = self.seconds_left() if self.done < self.total else None
        return "" if secs is None else f"{duration(secs)} left"

    def line(self) -> str:
        """One plain progress line. The rate comes from the bytes done in the last RATE_WINDOW_S (from the first
        call on), the time left from seconds_left; before a second call, the rate since the start."""
        now = time.monotonic()
        pct = 100 * self.done / self.total if self.total else 100.0
        text = f"{self.desc}: {human(self.done)} of {human(self.total)} ({pct:.0f}%)"
        t_old, d_old = self.points[0] if self.points else (self.t0, 0)
        if now > t_old and self.done > d_old:
            text = f"{text}, {human((self.done - d_old) / (now - t_old))}/s"
        else:
            text = f"{text}, {human(self.done / max(now - self.t0, 1e-9))}/s"
        left = self.left()
        return f"{text}, {left}" if left else text

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# ------------------------------------------------------------------ stopping a command (SIGINT, SIGTERM, SIGHUP)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread as Ctrl-C is: the library cleans up the same way."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_STOPPING: list[int] = []  # the signal that stopped this process: ignored to the end (a second Ctrl-C)
_STOPPED_FROM: dict = {}  # the handlers a stop left ignored, put back if this process runs another command (tests)
_DEFERRED: list[bool] = []  # inside signals_deferred(): a stop is raised when the block ends


# threading's lock bookkeeping: an exception raised there can leave a lock held (Condition.__enter__ after its
# acquire, __exit__ before its release) and the clean-up then waits on it forever. A stop that lands there is raised
# AGAIN_S later, from SIGALRM's handler (not a thread: its start waits in Condition.wait, where the stop would land).
_UNSAFE = {getattr(threading.Condition, n).__code__ for n in ("__enter__", "__exit__", "_release_save",
                                                              "_acquire_restore", "_is_owned", "notify")}
AGAIN_S = 0.001  # seconds
_HELD: list = []  # [signal, SIGALRM's handler before] while a stop that landed in _UNSAFE waits


def _again(_, frame):
    if _HELD and not _STOPPING:
        signum, before = _HELD
        _HELD.clear()
        signal.signal(signal.SIGALRM, before)
        _on_signal(signum, frame)


def _on_signal(signum, frame):
    if frame is not None and frame.f_code in _UNSAFE and not _STOPPING:
        if not _HELD:
            _HELD.extend([signum, signal.signal(signal.SIGALRM, _again)])
        signal.setitimer(signal.ITIMER_REAL, AGAIN_S)
        return
    for s in SIGNALS:  # the clean-up that follows is not interrupted again (a second Ctrl-C)
        signal.signal(s, signal.SIG_IGN)
    _STOPPING.append(signum)
    if not _DEFERRED:
        raise Interrupted(signum)


@contextlib.contextmanager
def signals_deferred():
    """A stop that comes inside the block is raised when it ends. For imports of compiled extensions (torch): their
    initialization calls Python code from C++ frames that cannot pass an exception on, and one raised there takes
    the process down (`terminate called after throwing ... pybind11::error_already_set`, exit -6)."""
    before = len(_STOPPING)  # a stop raised before the block (a command that ended) is not raised again
    _DEFERRED.append(True)
    try:
        yield
    finally:
        _DEFERRED.pop()
    if len(_STOPPING) > before and not _DEFERRED:
        raise Interrupted(_STOPPING[-1])


@contextlib.contextmanager
def signals_interrupt(ignore_after: bool = False):
    """While a command runs, SIGINT, SIGTERM and SIGHUP raise Interrupted (once); signals the process was started
    ignoring (nohup, a background job) stay ignored, and the handlers are put back after, unless a signal stopped
    the command: then they stay ignored through exit (Python resets its own handlers at exit, and a second Ctrl-C
    would end the process with rc -2 or a traceback). `ignore_after`: the process's own command: they stay ignored
    after it, first thing, whatever happened."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    for s, h in _STOPPED_FROM.items():
        signal.signal(s, h)
    _STOPPING.clear()
    _STOPPED_FROM.clear()
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        if ignore_after:
            for s in SIGNALS:
                signal.signal(s, signal.SIG_IGN)
        elif _STOPPING:
            _STOPPED_FROM.update(previous)
        else:
            for s, h in previous.items():
                signal.signal(s, h)


def stopped_by() -> int | None:
    """The signal that stopped the command running now (its handlers raised Interrupted), or None."""
    return _STOPPING[0] if _STOPPING else None

