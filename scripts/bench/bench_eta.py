#!/usr/bin/env python3
"""How close the time estimates come: `--dry-run`'s ETA against the conversion's own seconds, and each progress
line's "about N s left" against the seconds that really were left.

usage: PYTHONPATH=. python3 scripts/bench/bench_eta.py SRC WORK [--target T [--param K=V]]... [--json FILE]
  e.g. SRC = demo-out/src (`fimoe-convert demo`), or a fixture: scripts/make_fixture.py DIR --preset flash-geometry
  --experts 6 --layers 2 (about 400 MB). Each case is given as one --case "TARGET [--param K=V ...]"."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The CLI with progress lines every second, each stamped with the seconds since the process started; the dry run's
# estimate gets OUT for its write probe.
CHILD = """
import sys, time
T0 = time.monotonic()
from fimoe_convert import console, eta
console.PLAIN_EVERY_S = 1.0
line = console.Progress.line
console.Progress.line = lambda self: f"[{time.monotonic() - T0:.2f}] " + line(self)
estimate = eta.estimate
eta.estimate = lambda *a, **k: estimate(*a, **k, out_dir=sys.argv[2])
from fimoe_convert.cli import main
main(sys.argv[1:])
"""
UNITS = {"s": 1, "min": 60, "h": 3600}


def eta_seconds(text: str) -> float:
    m = re.match(r"ETA: (?:under 1 s|about ([0-9.]+) (s|min|h))", text)
    if not m:
        raise SystemExit(f"error: no ETA in {text!r}")
    return 0.5 if m.group(1) is None else float(m.group(1)) * UNITS[m.group(2)]


def run_case(src: str, work: Path, args: list[str]) -> dict:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    dry = subprocess.run([sys.executable, "-c", CHILD, src, str(out), *args, "--dry-run", "--json"],
                         capture_output=True, text=True, check=True)
    estimate = json.loads(dry.stdout)["estimate"]
    t0 = time.monotonic()
    real = subprocess.run([sys.executable, "-c", CHILD, src, str(out), *args], capture_output=True, text=True,
                          check=True)  # not --json: it turns the progress lines off
    wall = time.monotonic() - t0
    res = {"seconds": float(re.search(r" in ([0-9.]+) s -> ", real.stdout).group(1))}
    stamps = [(float(m.group(1)), float(m.group(2))) for m in
              re.finditer(r"^\[([0-9.]+)\] .*about (\d+) s left$", real.stderr, re.M)]
    end = max([float(m.group(1)) for m in re.finditer(r"^\[([0-9.]+)\] ", real.stderr, re.M)] or [0.0])
    lines = [{"at_s": t, "said_left_s": left, "was_left_s": round(end - t, 2)} for t, left in stamps]
    return {"args": args, "estimate": estimate, "estimate_s": eta_seconds(estimate), "convert_s": res["seconds"],
            "wall_s": round(wall, 2), "ratio": round(res["seconds"] / eta_seconds(estimate), 2),
            "progress": lines}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("work")
    ap.add_argument("--case", action="append", required=True, help='e.g. "fp8_block --param scale_dtype=f32"')
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in a.case:
        target, *rest = case.split()
        row = run_case(a.src, work, ["--target", target, *rest])
        rows.append(row)
        print(f"{case}: estimated {row['estimate_s']:.1f} s, converted in {row['convert_s']:.1f} s (ratio "
              f"{row['ratio']}), wall {row['wall_s']:.1f} s")
        for p in row["progress"]:
            print(f"  at {p['at_s']:.1f} s: said {p['said_left_s']:.0f} s left, {p['was_left_s']:.1f} s were")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
