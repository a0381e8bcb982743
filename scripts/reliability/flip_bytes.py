#!/usr/bin/env python3
"""Integrity check: does `verify` notice a single flipped byte anywhere in an output shard?

    python3 scripts/reliability/flip_bytes.py [--flips 100] [--seed 0] [--workdir DIR] [--region any|header]

Converts a tiny fixture (`--target bf16 --shard-size 1MB`, several shards), then FLIPS times: picks a
random output shard and a random byte in it (header or data, seeded), XORs it with a random non-zero
mask, runs `fimoe-convert verify OUT` (in process, through the CLI), restores the byte. A flip counts
as detected when verify exits 1 and its error line names the damaged shard. At the end the restored
OUT must verify again. Prints `detected D/FLIPS`. `tests/files/test_reliability.py` runs 10 flips.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package, wherever the installed one points


def flip_campaign(flips: int = 100, seed: int = 0, workdir: Path | None = None, log=print, region: str = "any") -> dict:
    from click.testing import CliRunner

    from fimoe_convert.cli import main
    from fimoe_convert.testing import make_checkpoint

    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="fimoe-flip-")) if own else Path(workdir)
    try:
        src = make_checkpoint(work / "src", "tiny")
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        runner = CliRunner()
        r = runner.invoke(main, [str(src), str(out), "--shard-size", "1MB", "--device", "cpu", "-q"])
        assert r.exit_code == 0, r.output
        shards = sorted(out.glob("model-*.safetensors"))
        rng = random.Random(seed)
        detected, missed, regions = 0, [], {"header": 0, "data": 0}
        for _ in range(flips):
            shard = rng.choice(shards)
            data = bytearray(shard.read_bytes())
            header_end = 8 + int.from_bytes(data[:8], "little")
            at = rng.randrange(len(data) if region == "any" else header_end)
            mask = rng.randrange(1, 256)
            regions["header" if at < header_end else "data"] += 1
            orig = data[at]
            data[at] ^= mask
            shard.write_bytes(bytes(data))
            try:
                v = runner.invoke(main, ["verify", str(out)])
                if v.exit_code == 1 and shard.name in v.stderr and "Traceback" not in v.output:
                    detected += 1
                else:
                    missed.append(
                        f"{shard.name} byte {at} ^ {mask:#04x}: verify exit {v.exit_code} {v.output.strip()!r}"
                    )
            finally:
                data[at] = orig
                shard.write_bytes(bytes(data))
        final = runner.invoke(main, ["verify", str(out)])
        res = {"flips": flips, "detected": detected, "missed": missed, "shards": len(shards),
               "regions": regions, "restored_ok": final.exit_code == 0}
        return res
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flips", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--region", choices=["any", "header"], default="any",
                    help="where the byte lies: anywhere in the file (default) or in the header (length + JSON)")
    args = ap.parse_args()
    t0 = time.monotonic()
    r = flip_campaign(args.flips, args.seed, args.workdir, region=args.region)
    print(f"detected {r['detected']}/{r['flips']} single-byte flips across {r['shards']} output shards "
          f"({r['regions']['header']} in headers, {r['regions']['data']} in tensor data); "
          f"restored OUT verifies: {r['restored_ok']}; seed {args.seed}, {time.monotonic() - t0:.1f} s")
    for m in r["missed"]:
        print("MISSED:", m)
    return 0 if r["detected"] == r["flips"] and r["restored_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
