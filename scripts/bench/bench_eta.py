#!/usr/bin/env python3
"""How close the time estimates come: `--dry-run`'s ETA against the conversion's own seconds, and each progress
line's "about N s left" against the seconds that really were left.

usage: PYTHONPATH=. python3 scripts/bench/bench_eta.py SRC [SRC ...] WORK --case "TARGET [FLAG ...]" ... [--json FILE]
  e.g. SRC = demo-out/src (`fimoe-convert demo`), or a fixture: scripts/make_fixture.py DIR --preset flash-geometry
  --experts 4 --layers 2 (about 300 MB). Each case is one --case "TARGET [--ep-size N] [--param K=V ...]"; every
case runs on every SRC, the dry run then the conversion, each in a process of its own as the CLI runs. The table
ends with the ratio real / estimate (1.0: exact) and, for runs with progress lines, the share of the run after
which every line's time left is within 2x of the time that was left, and the first line past 10% of the run: the
seconds it said were left, the seconds that were, and their ratio (said / was; 1.0: exact)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The CLI with progress lines every second, each stamped with the seconds since the process started.
CHILD = """
import sys, time
T0 = time.monotonic()
from fimoe_convert import console
console.PLAIN_EVERY_S = 1.0
line = console.Progress.line
console.Progress.line = lambda self: f"[{time.monotonic() - T0:.2f}] " + line(self)
from fimoe_convert.cli import main
main(sys.argv[1:])
"""
UNITS = {"s": 1, "min": 60, "h": 3600}
EARLY_SHARE = 0.10  # the share of the run at whose first progress line the time left is shown against the truth
SETTLED_LEFT_S = 2.0  # lines with less left than this are not judged: whole seconds round them by up to 50%


def eta_seconds(text: str) -> float:
    m = re.match(r"ETA: (?:under 1 s|about ([0-9.]+) (s|min|h))", text)
    if not m:
        raise SystemExit(f"error: no ETA in {text!r}")
    return 0.5 if m.group(1) is None else float(m.group(1)) * UNITS[m.group(2)]


def settled_share(lines: list[dict], convert_s: float, end: float) -> float | None:
    """The share of the run (from the conversion's start) at which the progress lines' time left is within 2x of
    the real one from there on; None without a line to judge."""
    judged = [p for p in lines if p["was_left_s"] >= SETTLED_LEFT_S]
    if not judged:
        return None
    start = end - convert_s
    share = None
    for p in judged:
        if not 0.5 <= p["said_left_s"] / max(p["was_left_s"], 1e-9) <= 2.0:
            share = None
        elif share is None:
            share = (p["at_s"] - start) / convert_s
    return 1.0 if share is None else share


def at_share(lines: list[dict], convert_s: float, end: float, share: float = EARLY_SHARE) -> dict | None:
    """The first progress line past `share` of the run (from the conversion's start), or None."""
    start = end - convert_s
    return next((p for p in lines if p["at_s"] - start >= share * convert_s), None)


def _run(args: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: fimoe-convert {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def run_case(src: str, work: Path, args: list[str]) -> dict:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    dry = _run([src, str(out), *args, "--dry-run", "--json"])
    dry_wall = time.monotonic() - t0
    res = json.loads(dry.stdout)
    estimate = res["estimate"]
    estimate_s = res.get("estimate_seconds") or eta_seconds(estimate)
    t0 = time.monotonic()
    real = _run([src, str(out), *args])  # not --json: it turns the progress lines off
    wall = time.monotonic() - t0
    convert_s = float(re.search(r" in ([0-9.]+) s -> ", real.stdout).group(1))
    stamps = [(float(m.group(1)), float(m.group(2))) for m in
              re.finditer(r"^\[([0-9.]+)\] .*about (\d+) s left$", real.stderr, re.M)]
    end = max([float(m.group(1)) for m in re.finditer(r"^\[([0-9.]+)\] ", real.stderr, re.M)] or [0.0])
    lines = [{"at_s": t, "said_left_s": left, "was_left_s": round(end - t, 2)} for t, left in stamps]
    return {"src": src, "args": args, "estimate": estimate, "estimate_s": estimate_s, "convert_s": convert_s,
            "wall_s": round(wall, 2), "dry_run_wall_s": round(dry_wall, 2), "dry_run_s": round(res["seconds"], 2),
            "ratio": round(convert_s / estimate_s, 2), "progress": lines,
            "settled_share": settled_share(lines, convert_s, end), "early": at_share(lines, convert_s, end)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("srcs", nargs="+", metavar="SRC")
    ap.add_argument("work")
    ap.add_argument("--case", action="append", required=True, help='e.g. "fp8_block --param scale_dtype=f32"')
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'fixture':<12} {'case':<36} {'estimate s':>10} {'real s':>7} {'ratio':>6} {'dry run s':>9} "
          f"{'(wall)':>7} {'progress settled':>16} {'at 10%: said s':>14} {'was s':>6} {'ratio':>6}")
    for src in a.srcs:
        for case in a.case:
            target, *rest = case.split()
            row = run_case(src, work, ["--target", target, *rest])
            rows.append(row)
            settled = "-" if row["settled_share"] is None else f"at {row['settled_share']:.0%}"
            e = row["early"]
            early = f"{'-':>14} {'-':>6} {'-':>6}" if e is None else (
                f"{e['said_left_s']:>14.0f} {e['was_left_s']:>6.1f} "
                f"{e['said_left_s'] / max(e['was_left_s'], 1e-9):>6.2f}")
            print(f"{Path(src).name:<12} {case:<36} {row['estimate_s']:>10.2f} {row['convert_s']:>7.1f} "
                  f"{row['ratio']:>6.2f} {row['dry_run_s']:>9.1f} {row['dry_run_wall_s']:>7.1f} {settled:>16} {early}",
                  flush=True)
            for p in row["progress"][:4]:
                print(f"    at {p['at_s']:.1f} s: said {p['said_left_s']:.0f} s left, {p['was_left_s']:.1f} s were")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
