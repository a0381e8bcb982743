"""Hashing at the speed of the disk: `verify`, `verify --deep`, the `--resume` check and the upload pre-check hash
files on several threads (fimoe_convert.files.hashing.hash_files). Measured in one run on the same files, page
cache dropped between passes where allowed (else warm for all): plain reads, one thread's sha256 over every file,
and hash_files; prints GB/s and the ratios.

    python3 scripts/bench/bench_hash.py [--files 4] [--size 512MB] [--work DIR] [--json FILE]"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from fimoe_convert.files.hashing import hash_files, sha256_file
from fimoe_convert.sizes import parse_size

BLOCK = 16 * 2**20  # bytes per read


def drop_cache() -> str:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except OSError:
        return "warm (could not drop it)"


def timed(fn) -> float:
    cache = drop_cache()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--size", default="512MB")
    ap.add_argument("--work", default="/tmp/fimoe-hashbench")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    size = parse_size(args.size, "--size")
    chunk = os.urandom(BLOCK)
    paths = []
    for i in range(args.files):
        p = work / f"f{i}.bin"
        with open(p, "wb") as f:
            for _ in range(size // BLOCK):
                f.write(chunk)
        paths.append(p)
    total = sum(p.stat().st_size for p in paths)

    def read_all():
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while f.read(BLOCK):
                    pass

    read_s, cache = timed(read_all)
    one_s, _ = timed(lambda: [sha256_file(p) for p in paths])
    par_s, _ = timed(lambda: hash_files(paths))
    assert hash_files(paths) == {p: sha256_file(p) for p in paths}
    gb = total / 1e9
    rows = {"read": gb / read_s, "sha256, one thread": gb / one_s, "hash_files": gb / par_s}
    print(f"{args.files} files, {gb:.2f} GB; page cache {cache}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    for k, v in rows.items():
        print(f"{k:20} {v:6.2f} GB/s")
    print(f"ratio hash_files / one thread: {one_s / par_s:.2f}x; hash_files / plain read: {read_s / par_s:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"files": args.files, "bytes": total, "cache": cache, "gbps": rows,
                                               "cores": os.cpu_count(), "load": os.getloadavg()[0]}, indent=1) + "\n")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
