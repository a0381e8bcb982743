"""Peak RSS does not grow with the model: a fixture with 8 MoE layers vs the same with 2 (goal <= 1.1x),
and with --max-memory 2GiB (goal <= 3 GiB). Each conversion runs in its own child process.

usage: python3 scripts/bench_memory.py [--target bf16] [--work DIR] [--experts 8]
"""

import argparse
import shutil
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
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    peaks = {}
    for layers in (2, 8):
        src = make_checkpoint(work / f"src{layers}", "flash-geometry", layers=layers, experts=args.experts)
        for mem in ("8GiB", "2GiB"):
            out = work / f"out{layers}-{mem}"
            wall, rss, _ = run_convert(src, out, args.target, args.device, mem)
            peaks[(layers, mem)] = rss
            print(f"{layers} layers, --max-memory {mem}: peak RSS {rss / 2**30:.2f} GiB ({wall:.1f} s)")
            shutil.rmtree(out)
        shutil.rmtree(src)
    print(f"ratio peak RSS 8 layers / 2 layers (8GiB): {peaks[(8, '8GiB')] / peaks[(2, '8GiB')]:.2f}x (goal <= 1.1x)")
    print(f"ratio peak RSS 8 layers / 2 layers (2GiB): {peaks[(8, '2GiB')] / peaks[(2, '2GiB')]:.2f}x (goal <= 1.1x)")
    print(f"peak RSS with --max-memory 2GiB: {max(peaks[(8, '2GiB')], peaks[(2, '2GiB')]) / 2**30:.2f} GiB (goal <= 3 GiB)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
