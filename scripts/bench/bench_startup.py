"""Start-up of the light commands against `python -c "import click"` (the floor of any click CLI), measured in
one run: each command is run --runs times in a fresh process, alternating, and the medians are compared.

    python3 scripts/bench/bench_startup.py [--runs 7] [--json FILE]

Goal: `--help`, `targets` and `inspect` within 2x of the floor. `inspect` reads a tiny fixture's headers."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fimoe_convert.testing import make_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    src = make_checkpoint(Path(tempfile.mkdtemp()) / "tiny", "tiny")
    # What users run: the entry point beside this interpreter (not a version manager's shim, which adds its own
    # start-up); `python -m` would add runpy's.
    entry = Path(sys.executable).parent / "fimoe-convert"
    cli = [str(entry)] if entry.exists() else [sys.executable, "-m", "fimoe_convert"]
    commands = {"import click (floor)": [sys.executable, "-c", "import click"], "--help": [*cli, "--help"],
                "targets": [*cli, "targets"], "inspect": [*cli, "inspect", str(src)]}
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times[name].append(time.perf_counter() - t0)
    floor = statistics.median(times["import click (floor)"])
    rows = {k: {"median_s": statistics.median(v), "ratio": statistics.median(v) / floor} for k, v in times.items()}
    for k, r in rows.items():
        print(f"{k:22} {r['median_s'] * 1000:7.0f} ms  {r['ratio']:.2f}x the floor")
    print("goal: within 2x of the floor: " + ", ".join(f"{k} {'met' if r['ratio'] <= 2 else 'NOT met'}"
                                                       for k, r in rows.items() if k != "import click (floor)"))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": args.runs, "rows": rows, "date": time.strftime("%Y-%m-%d"),
                                               "cores": os.cpu_count(), "loadavg": os.getloadavg()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
