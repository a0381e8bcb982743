"""Peak RSS does not grow with the model: a fixture with 8 MoE layers vs the same with 2 (goal <= 1.1x),
and with --max-memory 2GiB (goal <= 3 GiB). Each conversion runs in its own child process; each
configuration runs --repeat times and its median peak is compared (one run's peak varies by about
0.1 GiB on a ~0.7 GiB baseline on the shared CPU machine).

usage: python3 scripts/bench/bench_memory.py [--target bf16] [--work DIR] [--experts 8] [--repeat 3] [--json FILE]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_convert import run_convert  # noqa: E402

from fimoe_convert.testing import make_checkpoint  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--work", default="/tmp/fimoe-membench")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration; the median peak counts")
    ap.add_argument("--json", default=None, help="write the results (every run's peak) to this file")
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    peaks = {}
    rows = []
    max_seen = 0
    for layers in (2, 8):
        src = make_checkpoint(work / f"src{layers}", "flash-geometry", layers=layers, experts=args.experts)
        for mem in ("8GiB", "2GiB"):
            out = work / f"out{layers}-{mem}"
            runs = []
            for _ in range(args.repeat):
                wall, rss, _ = run_convert(src, out, args.target, args.device, mem)
                runs.append((rss, wall))
                shutil.rmtree(out)
            peaks[(layers, mem)] = statistics.median(r for r, _ in runs)
            rows.append({"layers": layers, "max_memory": mem, "median_peak_rss": peaks[(layers, mem)],
                         "runs": [{"peak_rss": r, "wall_s": w} for r, w in runs]})
            max_seen = max([max_seen, *(r for r, _ in runs)])
            print(
                f"{layers} layers, --max-memory {mem}: peak RSS {peaks[(layers, mem)] / 2**30:.2f} GiB (median; runs: "
                + ", ".join(f"{r / 2**30:.2f} GiB in {w:.1f} s" for r, w in runs)
                + ")"
            )
        shutil.rmtree(src)
    print(f"ratio peak RSS 8 layers / 2 layers (8GiB): {peaks[(8, '8GiB')] / peaks[(2, '8GiB')]:.2f}x (goal <= 1.1x)")
    print(f"ratio peak RSS 8 layers / 2 layers (2GiB): {peaks[(8, '2GiB')] / peaks[(2, '2GiB')]:.2f}x (goal <= 1.1x)")
    print(
        "peak RSS with --max-memory 2GiB: "
        f"{max(peaks[(8, '2GiB')], peaks[(2, '2GiB')]) / 2**30:.2f} GiB (goal <= 3 GiB)"
    )
    print(f"highest single peak, any run: {max_seen / 2**30:.2f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "target": args.target, "device": args.device, "preset": "flash-geometry", "experts": args.experts,
            "repeat": args.repeat, "cores": os.cpu_count(), "loadavg": os.getloadavg(), "rows": rows,
            "ratio_8_over_2": {m: peaks[(8, m)] / peaks[(2, m)] for m in ("8GiB", "2GiB")},
            "highest_single_peak": max_seen}, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
