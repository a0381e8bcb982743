"""The sm90 FP8 moe_ep conversion at V4-Flash expert geometry under several settings, in one run: one fixture,
the CLI conversion once per variant, then the O_DIRECT floor. Per variant: wall, convert(), the time after the
report (Python's atexit handlers, then the process teardown) and the stages; with FIMOE_TIMELINE=1 the -vv timeline
goes to OUT/timeline-N.txt.

usage: PYTHONPATH=scripts/gpu/variant_site:$PYTHONPATH python3 scripts/gpu/bench_variants.py \
           "|FIMOE_SWITCH=0.0005|FIMOE_IO_BLOCK=67108864&FIMOE_TIMELINE=1"   (variants split by |, settings by &)
       env: OUT (default .), MEM (--max-memory, default 56GiB), WORK (default /tmp/fv)"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_convert import floor_seconds  # noqa: E402

from fimoe_convert.testing import make_checkpoint  # noqa: E402

TARGET = "sm90_fp8_fp8_bf16_pull_cutedsl"


def run(src: Path, out: Path, env: dict) -> tuple[float, float, float, dict, int]:
    """Wall seconds, seconds after the report, seconds of teardown after the last atexit handler, the CLI's JSON
    report, peak RSS bytes."""
    cmd = [sys.executable, "-m", "fimoe_convert", str(src), str(out), "--target", TARGET, "--device", "cuda",
           "--max-memory", os.environ.get("MEM", "56GiB"), "--json", "--shard-size", "2GB",
           *(["-vv"] if env.get("FIMOE_TIMELINE") else [])]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = p.stdout.read(1)
    printed = time.time()
    rest, err = p.stdout.read(), p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall, ended = time.perf_counter() - t0, time.time()
    if status:
        raise SystemExit(f"conversion failed: {err.decode()[-2000:]}")
    marks = [float(line.split()[1]) for line in err.decode().splitlines() if line.startswith("[atexit-last]")]
    teardown = ended - marks[0] if marks else float("nan")
    return wall, ended - printed, teardown, {**json.loads(first + rest), "stderr": err.decode()}, usage.ru_maxrss * 1024


def main() -> None:
    work = Path(os.environ.get("WORK", "/tmp/fv"))
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    src = make_checkpoint(work / "src", "flash-geometry", fast=True, layers=3, mtp=1, hash_layers=1, experts=256,
                          top_k=6)
    print(f"fixture made in {time.perf_counter() - t0:.1f} s", flush=True)
    floor_seconds(src, 0, work / "warm")  # the page cache warmed as for the floor
    sizes = []
    for i, variant in enumerate(sys.argv[1].split("|"), 1):
        settings = dict(kv.split("=", 1) for kv in variant.split("&") if kv)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "FIMOE_MARK": "1", **settings}
        out = work / "out"
        wall, after, teardown, res, rss = run(src, out, env)
        sizes.append(sum(f.stat().st_size for f in out.iterdir()))
        print(f"variant {sorted(settings.items()) or 'as shipped'}: wall {wall:.2f} s, convert() {res['seconds']:.2f} "
              f"s, after the report {after:.2f} s (teardown after the last atexit handler {teardown:.2f} s), peak RSS "
              f"{rss / 2**30:.1f} GiB, out {sizes[-1] / 1e9:.2f} GB, stages {res.get('timings')}", flush=True)
        if settings.get("FIMOE_TIMELINE"):
            Path(os.environ.get("OUT", "."), f"timeline-{i}.txt").write_text(res["stderr"])
        shutil.rmtree(out)
    total, read_s, write_s = floor_seconds(src, sizes[0], work / "floor", direct=True)
    print(f"floor O_DIRECT: {total:.2f} s (read {read_s:.2f}, write+fsync {write_s:.2f})", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
