#!/usr/bin/env python3
"""One sha256 per output folder for 17 conversions (fixture x target x options, every CPU target), for showing
that a refactor leaves the output bytes as they were. Run it on two trees and diff the outputs:

    python3 scripts/reliability/output_digests.py WORK [--tree DIR] > digests.txt

`--tree` (default: this checkout) is put first on PYTHONPATH of each conversion, so an older checkout or worktree
converts with its own code; the fixtures are made once under WORK/fixtures. Compare runs that used the same WORK:
the manifest and the model card record SRC as it was given, so another fixture path gives other digests."""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

JOBS = [  # (fixture preset, target, extra flags)
    ("tiny", "bf16", []), ("tiny", "bf16", ["--ep-size", "2"]), ("base", "bf16", []), ("v4.1", "bf16", []),
    ("tiny", "fp8_block", []), ("tiny", "fp8_block", ["--param", "scale_dtype=f32"]),
    ("v4.1", "fp8_block", ["--param", "scale_dtype=f32"]),
    ("tiny", "megamoe_sm90_mxfp4", ["--ep-size", "2", "--allow-lossy"]),
    ("tiny", "sm100_mxfp8_mxfp4_bf16_cutedsl", []), ("tiny", "sm107_mxfp8_mxfp4_bf16_cutedsl", []),
    ("tiny", "sm107_mxfp4_mxfp4_bf16_cutedsl", []), ("tiny", "sm120_mxfp4_mxfp8_bf16_cake", []),
    ("tiny", "sm100_bf16_bf16_bf16_cutedsl", ["--ep-size", "2"]), ("tiny", "sm100_mxfp8_mxfp8_bf16_cutedsl", []),
    ("tiny", "sm90_fp8_fp8_bf16_pull_cutedsl", []),
    ("tiny", "sm90_fp8_fp8_bf16_pull_cutedsl", ["--param", "fp8_scale_mode=blockwise"]),
    ("base", "sm100_bf16_bf16_bf16_cutedsl", []),
]


def folder_digest(out: Path) -> str:
    """sha256 over every file's relative name and its bytes' sha256, in name order."""
    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(out).as_posix().encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[2]))
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": args.tree}
    fixtures = args.work / "fixtures"
    for preset in sorted({p for p, _, _ in JOBS}):
        if not (fixtures / preset).exists():
            code = (
                "from fimoe_convert.testing import make_checkpoint; "
                f"make_checkpoint({str(fixtures / preset)!r}, {preset!r})"
            )
            subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    for preset, target, extra in JOBS:
        out = args.work / f"{preset}-{target}-{'_'.join(extra).replace('-', '').replace('=', '')}"
        shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run([sys.executable, "-m", "fimoe_convert", str(fixtures / preset), str(out), "--target", target,
                            "-q", *extra], env=env, capture_output=True, text=True)
        if r.returncode:
            print(f"{out.name}: FAILED {r.returncode} {r.stderr.strip()[-300:]}", flush=True)
            continue
        print(f"{out.name}: {folder_digest(out)} ({len(list(out.iterdir()))} files)", flush=True)


if __name__ == "__main__":
    main()
