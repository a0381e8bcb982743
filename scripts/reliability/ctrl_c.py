#!/usr/bin/env python3
"""A single Ctrl-C at random moments of a conversion:

    python3 scripts/reliability/ctrl_c.py [--runs 60] [--seed 0] [--writers 3] [--min 0.9] [--max 3.5] [--tty]
                                          [--workdir DIR]

Converts the tiny fixture (`--shard-size 1MB`) in a subprocess RUNS times, sends one SIGINT after a random delay
(seconds, uniform in [MIN, MAX]) and collects stderr (a pipe, or with --tty a terminal 120 columns wide, so that the
progress bar is drawn). Expected: the interruption line alone and exit 130, or, when the run finished first, exit 0
and no error line; and no temporary left. Prints each run that differs with its stderr, then `bad B of RUNS`."""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path


def run_once(src: Path, out: Path, writers: int, delay: float, tty: bool) -> tuple[int, str]:
    """(exit status, stderr) of one conversion stopped by SIGINT after `delay` seconds."""
    master = slave = None
    if tty:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", str(src), str(out), "--shard-size", "1MB",
                             "--writers", str(writers)], stdout=subprocess.DEVNULL,
                            stderr=slave if tty else subprocess.PIPE, env={**os.environ, "FIMOE_DEBUG": ""},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    chunks: list[bytes] = []
    if tty:
        os.close(slave)

        def read() -> None:
            while True:
                try:
                    b = os.read(master, 65536)
                except OSError:  # the terminal closed with the process
                    return
                if not b:
                    return
                chunks.append(b)

        reader = threading.Thread(target=read)
        reader.start()
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    if tty:
        proc.wait(timeout=120)
        reader.join(10)
        os.close(master)
        err = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
        err = re.sub(r"\r[^\n\r]*", "", err)  # the bar's redraws
    else:
        err = proc.communicate(timeout=120)[1].decode(errors="replace")
    return proc.returncode, err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--min", type=float, default=0.9)
    ap.add_argument("--max", type=float, default=3.5)
    ap.add_argument("--tty", action="store_true")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    from fimoe_convert.testing import make_checkpoint

    work = Path(a.workdir or tempfile.mkdtemp(prefix="fimoe-ctrl-c-"))
    src = make_checkpoint(work / "src", "tiny")
    rng = random.Random(a.seed)
    bad = 0
    for i in range(a.runs):
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        delay = rng.uniform(a.min, a.max)
        rc, err = run_once(src, out, a.writers, delay, a.tty)
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("converting")]
        ok = (rc == 130 and len(lines) == 1 and lines[0].startswith("error: interrupted (SIGINT)")) or (
            rc == 0 and not lines)
        temporaries = sorted(p.name for p in out.glob("*.fimoe-tmp")) if out.exists() else []
        if not ok or temporaries:
            bad += 1
            print(f"--- run {i}, SIGINT after {delay:.2f} s: exit {rc}, temporaries {temporaries}\n{err}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    print(f"bad {bad} of {a.runs}")


if __name__ == "__main__":
    main()
