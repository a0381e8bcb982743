#!/usr/bin/env python3
"""How close the time estimates come: `--dry-run`'s ETA against the conversion's own seconds, and each progress
line's "about N s left" against the seconds that really were left.

usage: PYTHONPATH=. python3 scripts/bench/bench_eta.py SRC [SRC ...] WORK --case "TARGET [FLAG ...]" ... [--json FILE]
  [--no-dry-run] [--cli-lines]
  e.g. SRC = demo-out/src (`fimoe-convert demo`), or a fixture: scripts/make_fixture.py DIR --preset flash-geometry
  --experts 6 --layers 2 (about 400 MB). Each case is one --case "TARGET [--arch X.Y] [--param K=V ...]"; every
case runs on every SRC, the dry run (unless --no-dry-run) then the conversion, each in a process of its own as the
CLI runs. Every progress line (one every LINE_EVERY_S, or with --cli-lines as often as the CLI prints them) is
recorded with the seconds since the conversion started (convert()'s own clock, after torch's import) and the total
it predicts (those seconds plus its time left). The table gives the dry run's ratio real / estimate (1.0: exact),
the share of the run at which the first time left is printed, and at 10%, 25% and 50% of the run the ratio
predicted / real total of the line on screen then (the last printed; 1.0: exact, "-": no time left shown yet)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The CLI with progress lines every PLAIN_EVERY_S, each stamped with the seconds since the process started, and
# convert()'s start and end on the same clock (its start is its t0, after torch's import).
CHILD = """
import sys, time
T0 = time.monotonic()
from fimoe_convert import console, conversion
if %r is not None:
    console.PLAIN_EVERY_S = %r
line = console.Progress.line
console.Progress.line = lambda self: f"[{time.monotonic() - T0:.3f}] " + line(self)
inner = conversion._convert
def timed(req, opts, t0):
    start = time.monotonic() - T0 - (time.perf_counter() - t0)
    try:
        return inner(req, opts, t0)
    finally:
        print(f"[bench] convert {start:.3f} {time.monotonic() - T0:.3f}", file=sys.stderr, flush=True)
conversion._convert = timed
from fimoe_convert.cli import main
main(sys.argv[1:])
"""
LINE_EVERY_S = 0.1  # seconds between progress lines in the child: a few dozen over a run of seconds
UNITS = {"s": 1, "min": 60, "h": 3600}
SHARES = (0.10, 0.25, 0.50)  # the shares of the run at which the predicted total is shown against the real one


def eta_seconds(text: str) -> float:
    m = re.match(r"ETA: (?:under 1 s|about ([0-9.]+) (s|min|h))", text)
    if not m:
        raise SystemExit(f"error: no ETA in {text!r}")
    return 0.5 if m.group(1) is None else float(m.group(1)) * UNITS[m.group(2)]


def progress_lines(stderr: str, start: float) -> list[dict]:
    """Every progress line: its seconds since the conversion's start and, where it says a time left, that and the
    total it predicts."""
    lines = []
    for m in re.finditer(r"^\[([0-9.]+)\] converting: .*$", stderr, re.M):
        at = float(m.group(1)) - start
        left = re.search(r"about ([0-9.]+) (s|min|h) left$", m.group(0))
        said = float(left.group(1)) * UNITS[left.group(2)] if left else None
        lines.append({"at_s": round(at, 3), "said_left_s": said,
                      "predicted_s": None if said is None else round(at + said, 3)})
    return lines


def first_estimate_share(lines: list[dict], real_s: float) -> float | None:
    return next((p["at_s"] / real_s for p in lines if p["said_left_s"] is not None), None)


def ratio_at(lines: list[dict], real_s: float, share: float) -> float | None:
    """predicted / real total of the line on screen at `share` of the run (the last printed by then); None when
    it shows no time left (or none is printed yet)."""
    shown = [p for p in lines if p["at_s"] <= share * real_s]
    if not shown or shown[-1]["predicted_s"] is None:
        return None
    return shown[-1]["predicted_s"] / real_s


def _run(args: list[str], every: float | None = LINE_EVERY_S) -> subprocess.CompletedProcess:
    """The CLI with `args`, a progress line every `every` seconds (None: the CLI's own PLAIN_EVERY_S)."""
    done = subprocess.run([sys.executable, "-c", CHILD % (every, every), *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: fimoe-convert {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def run_case(src: str, work: Path, args: list[str], dry_run: bool = True, every: float | None = LINE_EVERY_S) -> dict:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    row: dict = {"src": src, "args": args}
    if dry_run:
        t0 = time.monotonic()
        dry = _run([src, str(out), *args, "--dry-run", "--json"])
        res = json.loads(dry.stdout)
        row.update(estimate=res["estimate"], estimate_s=res.get("estimate_seconds") or eta_seconds(res["estimate"]),
                   dry_run_wall_s=round(time.monotonic() - t0, 2), dry_run_s=round(res["seconds"], 2))
    real = _run([src, str(out), *args], every)  # not --json: it turns the progress lines off
    start, end = map(float, re.search(r"^\[bench\] convert ([0-9.]+) ([0-9.]+)$", real.stderr, re.M).groups())
    real_s = end - start
    lines = progress_lines(real.stderr, start)
    row.update(real_s=round(real_s, 3), progress=lines, first_estimate_share=first_estimate_share(lines, real_s),
               ratios={f"{s:.0%}": ratio_at(lines, real_s, s) for s in SHARES})
    if dry_run:
        row["ratio"] = round(real_s / row["estimate_s"], 2)
    return row


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("srcs", nargs="+", metavar="SRC")
    ap.add_argument("work")
    ap.add_argument("--case", action="append", required=True, help='e.g. "fp8_block --param scale_dtype=f32"')
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-dry-run", action="store_true", help="the conversions' progress lines only")
    ap.add_argument("--cli-lines", action="store_true",
                    help=f"progress lines as often as the CLI prints them, not every {LINE_EVERY_S} s")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores")
    print(f"{'fixture':<12} {'case':<34} {'dry-run est s':>13} {'real s':>7} {'ratio':>6} {'first time left':>15} "
          + " ".join(f"{'at ' + format(s, '.0%'):>6}" for s in SHARES), flush=True)
    for src in a.srcs:
        for case in a.case:
            target, *rest = case.split()
            row = run_case(src, work, ["--target", target, *rest], dry_run=not a.no_dry_run,
                           every=None if a.cli_lines else LINE_EVERY_S)
            rows.append(row)
            first = row["first_estimate_share"]
            print(f"{Path(src).name:<12} {case:<34} {_cell(row.get('estimate_s'), '.2f'):>13} {row['real_s']:>7.2f} "
                  f"{_cell(row.get('ratio'), '.2f'):>6} {_cell(first, '.0%'):>15} "
                  + " ".join(f"{_cell(r, '.2f'):>6}" for r in row["ratios"].values()), flush=True)
            for p in row["progress"]:
                said = "" if p["said_left_s"] is None else (f": {p['said_left_s']:.1f} s left, predicted total "
                                                           f"{p['predicted_s']:.1f} s")
                print(f"    at {p['at_s']:6.2f} s ({p['at_s'] / row['real_s']:4.0%}){said}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
