#!/usr/bin/env python3
"""Peak memory of reading worst-case JSON files through `read_json`:

    python3 scripts/reliability/json_memory.py --mib 64 [--mib 4 ...] [--kind manifest] [--dir DIR]

Each pattern is written at about `--mib` MiB, read in a fresh process (as `/usr/bin/time -f %M` reports its peak
RSS), and the peak above that of a process reading `[]` is printed with the bytes of memory per file byte, the
seconds and whether the file was accepted or refused (with the start of the one line)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

PATTERNS = {
    "[{},{},...]": (b"[", b"{}", b",", b"]"),
    "[[],[],...]": (b"[", b"[]", b",", b"]"),
    '{"k1":{},...}': None,
    "[1000,...]": (b"[", b"1000", b",", b"]"),
    "[1.5,...]": (b"[", b"1.5", b",", b"]"),
    '["ab",...]': (b"[", b'"ab"', b",", b"]"),
    "one string, one astral char": None,
    '1.99 M x "ab", then one astral string': None,
    '1.99 M x {}, then one astral string': None,
}
NEAR_LIMIT = 1_990_000  # items, just under MAX_ITEMS

CHILD = """
import sys, time
from pathlib import Path
from fimoe_convert.files.jsonfile import read_json
from fimoe_convert.errors import InputError
t0 = time.perf_counter()
try:
    read_json(Path(sys.argv[1]), sys.argv[2]); what = "accepted"
except InputError as e:
    what = "refused: " + str(e)[:110]
print(time.perf_counter() - t0, what)
"""


def make(path: Path, name: str, size: int) -> None:
    if name == '{"k1":{},...}':
        n = size // 12
        body = b"{" + b",".join(b'"k%09d":{}' % i for i in range(n)) + b"}"
    elif name == "one string, one astral char":
        body = b'["' + "\U0001F600".encode() + b"a" * (size - 10) + b'"]'
    elif name.startswith("1.99 M"):
        item, near = (b'"ab"', NEAR_LIMIT) if '"ab"' in name else (b"{}", NEAR_LIMIT // 2)
        head = b"[" + b",".join([item] * near) + b',"' + "\U0001F600".encode()
        body = head + b"a" * (size - len(head) - 2) + b'"]'
    else:
        head, item, sep, tail = PATTERNS[name]
        n = (size - 2) // (len(item) + 1)
        body = head + sep.join([item] * n) + tail
    path.write_bytes(body)


def child(path: Path, kind: str) -> tuple[int, str, int]:
    """(exit status, stdout, peak RSS in bytes) of a fresh process reading `path`, as /usr/bin/time reports it (a
    child forked from this process would start with this process's pages counted)."""
    r = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-c", CHILD, str(path), kind],
                       capture_output=True, text=True)
    return r.returncode, r.stdout, int(r.stderr.split()[-1]) * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, action="append", required=True)
    ap.add_argument("--kind", default="manifest")
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    empty = Path(a.dir) / "empty.json"
    empty.write_bytes(b"[]")
    base = child(empty, a.kind)[2]
    print(f"a process reading [] peaks at {base / (1 << 20):.1f} MiB; below: the peak above that")
    for mib in a.mib:
        for name in PATTERNS:
            p = Path(a.dir) / "worst.json"
            make(p, name, int(mib * (1 << 20)))
            size = p.stat().st_size
            rc, out, peak = child(p, a.kind)
            p.unlink()
            if rc:
                print(f"{name:30s} {size / (1 << 20):7.1f} MiB: child failed {out[-300:]}")
                continue
            secs, what = out.split(" ", 1)
            rss = peak - base
            print(f"{name:30s} {size / (1 << 20):7.1f} MiB  peak +{rss / (1 << 20):8.1f} MiB ({rss / size:5.1f} B/B) "
                  f"{float(secs):6.2f} s  {what.strip()}", flush=True)


if __name__ == "__main__":
    main()
