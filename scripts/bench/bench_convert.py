"""End-to-end conversion vs the I/O floor, measured in the same run.

The floor: read every source file once, then write the same number of output bytes sequentially
and fsync them. Prints `ratio convert/floor: X.XXx` (goal <= 1.25) and peak RSS of the conversion.

usage: python3 scripts/bench/bench_convert.py [--target bf16] [--device cpu|cuda] [--arch X.Y] [--work DIR] [--layers N]
       [--experts E] [--preset flash-geometry|pro-geometry] [--max-memory 8GiB] [--shard-size 5GB] [--json FILE]

--experts 256 --preset flash-geometry is V4-Flash's exact expert geometry (256 experts of 4096x2048 per layer);
--preset pro-geometry --experts 384 --layers 1 --mtp 0 one V4-Pro layer (384 experts of 7168x3072). The time is
also extrapolated to the whole published model: convert() seconds x (its bytes / the fixture's bytes)."""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BLOCK = 64 * 2**20  # bytes per read/write call in the floor


def floor_seconds(src: Path, out_bytes: int, scratch: Path, direct: bool = False) -> tuple[float, float, float]:
    """Read SRC once, then write `out_bytes` sequentially and fsync: buffered (the goal's floor), or with
    O_DIRECT from a page-aligned buffer (what the converter's writer does where the file system allows)."""
    t0 = time.perf_counter()
    for p in sorted(src.iterdir()):
        with open(p, "rb", buffering=0) as f:
            while f.read(BLOCK):
                pass
    t1 = time.perf_counter()
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(BLOCK))
    scratch.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    fd = os.open(scratch / "floor.bin", flags, 0o644)
    try:
        left = -(-out_bytes // 4096) * 4096 if direct else out_bytes
        with memoryview(buf) as view:
            while left > 0:
                left -= os.write(fd, view[:min(left, BLOCK)])
        os.fsync(fd)
    finally:
        os.close(fd)
    t2 = time.perf_counter()
    shutil.rmtree(scratch)
    return t2 - t0, t1 - t0, t2 - t1


def run_convert(src: Path, out: Path, target: str, device: str, max_memory: str,
                extra: tuple[str, ...] = ()) -> tuple[float, int, dict]:
    """Wall time, peak RSS (bytes) and the converter's own stage timings of one CLI conversion in a child."""
    cmd = [sys.executable, "-m", "fimoe_convert", str(src), str(out), "--target", target, "--device", device,
           "--max-memory", max_memory, "--json", *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stdout = proc.stdout.read(1)  # the JSON report is the last thing the CLI does before it exits
    printed = time.perf_counter() - t0
    stdout += proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"conversion failed: {' '.join(cmd)}")
    return wall, usage.ru_maxrss * 1024, {**json.loads(stdout), "exit_s": wall - printed}


def startup_seconds() -> float:
    """A child that only does what the CLI does before calling convert(): start the interpreter and import
    torch and the CLI. (The device context and the target's imports happen inside convert(), in its `start`.)"""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, fimoe_convert.cli"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--arch", default=None, help="as the CLI's (a target made for another GPU, converted on this one)")
    ap.add_argument("--work", default="/tmp/fimoe-bench")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-memory", default="8GiB")
    ap.add_argument("--shard-size", default="5GB", help="as the CLI's; more shards let more writers run at once")
    ap.add_argument("--preset", default="flash-geometry", choices=["flash-geometry", "pro-geometry"])
    ap.add_argument("--experts", type=int, default=None, help="routed experts per layer (default: the preset's)")
    ap.add_argument("--mtp", type=int, default=1, help="MTP blocks")
    ap.add_argument("--json", default=None, help="append the results as one JSON line to this file")
    ap.add_argument("--floors", default="both", choices=["both", "direct"],
                    help="direct: only the floor with O_DIRECT writes (what the issue's goal measures against)")
    args = ap.parse_args()
    from fimoe_convert.checkpoint import VARIANTS
    from fimoe_convert.testing import make_checkpoint

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    over = {"layers": args.layers, "mtp": args.mtp, "hash_layers": min(1, args.layers)}
    if args.experts:
        over.update(experts=args.experts, top_k=min(6, args.experts))
    t0 = time.perf_counter()
    src = make_checkpoint(work / "src", args.preset, fast=True, **over)
    print(f"fixture made in {time.perf_counter() - t0:.1f} s")
    out = work / "out"
    # Warm the page cache equally for both measurements: each reads the source once before timing.
    floor_seconds(src, 0, work / "warm")
    extra = ("--shard-size", args.shard_size, *(("--arch", args.arch) if args.arch else ()))
    wall, rss, res = run_convert(src, out, args.target, args.device, args.max_memory, extra)
    out_bytes = sum(p.stat().st_size for p in out.iterdir())
    in_bytes = sum(p.stat().st_size for p in src.iterdir())
    shutil.rmtree(out)
    dfloor, dread_s, dwrite_s = floor_seconds(src, out_bytes, work / "floor", direct=True)
    floor, read_s, write_s = (floor_seconds(src, out_bytes, work / "floor") if args.floors == "both"
                              else (dfloor, dread_s, dwrite_s))
    experts = args.experts or "the preset's"
    print(
        f"fixture: {args.preset}, {experts} experts, {args.layers} layers + {args.mtp} MTP; "
        f"read {in_bytes / 1e9:.2f} GB, "
        f"write {out_bytes / 1e9:.2f} GB in {res['shards']} shards; target {args.target} on {args.device}"
    )
    print(f"floor: {floor:.2f} s (read {read_s:.2f} s, write+fsync {write_s:.2f} s)")
    print(f"floor with O_DIRECT writes: {dfloor:.2f} s (read {dread_s:.2f} s, write+fsync {dwrite_s:.2f} s)")
    start = startup_seconds()
    print(f"convert: {wall:.2f} s, peak RSS {rss / 2**30:.2f} GiB; in convert() {res['seconds']:.2f} s; a child that "
          f"only starts and imports torch and the CLI: {start:.2f} s; the rest (output, exit): "
          f"{wall - start - res['seconds']:.2f} s, of which {res['exit_s']:.2f} s after the report was printed")
    print("convert stages (s): " + ", ".join(f"{k} {v:.2f}" for k, v in res.get("timings", {}).items()))
    print(f"ratio convert/floor: {wall / floor:.2f}x (goal <= 1.25x)")
    print(f"ratio convert/floor with O_DIRECT writes: {wall / dfloor:.2f}x")
    print(f"ratio convert() alone/floor: {res['seconds'] / floor:.2f}x (start-up excluded)")
    print(f"throughput: {out_bytes / wall / 1e9:.2f} GB/s written, {in_bytes / wall / 1e9:.2f} GB/s read; "
          f"peak device memory {(res.get('device_peak_bytes') or 0) / 2**30:.2f} GiB")
    variant = VARIANTS["V4-Pro" if args.preset == "pro-geometry" else "V4-Flash"]
    whole = res["seconds"] * variant.source_bytes / in_bytes
    print(f"extrapolated to {variant.name} ({variant.source_bytes / 1e9:.0f} GB of source): about {whole / 60:.1f} min "
          f"(convert() seconds x its bytes / the fixture's)")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"target": args.target, "device": args.device, "preset": args.preset,
                                "experts": args.experts, "layers": args.layers, "mtp": args.mtp, "in_bytes": in_bytes,
                                "out_bytes": out_bytes, "wall_s": wall, "convert_s": res["seconds"], "floor_s": floor,
                                "floor_direct_s": dfloor, "startup_s": start, "exit_s": res["exit_s"], "peak_rss": rss,
                                "device_peak_bytes": res.get("device_peak_bytes"), "timings": res.get("timings"),
                                "ratio": wall / floor, "whole_model_s": whole, "variant": variant.name}) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
