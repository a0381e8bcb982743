#!/usr/bin/env python3
"""What one byte of `--stream` costs the reading process: ranged GETs of a local file, split over K connections,
read by fimoe-convert's reader (`files/sources/http_range.read_range`: http.client, `readinto` into the caller's
buffer) and by huggingface_hub's HTTP client (its session's `stream().iter_bytes()`, each chunk copied into the same
kind of buffer), in one run, alone and beside one busy Python thread (a conversion lane holding the interpreter).
Prints MB/s, the reading threads' CPU seconds per GB, and ours / huggingface_hub's. The server is a process of its
own (os.sendfile): its CPU is not counted.

usage: python3 scripts/bench/bench_range_reads.py [--mb 512] [--connections 1,8,16] [--work DIR]"""

from __future__ import annotations

import argparse
import mmap
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def serve(path: str) -> None:
    """Serve `path` with Range on a free port (printed first), until killed."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    size = os.path.getsize(path)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            start, end = (int(m.group(1)), int(m.group(2) or size - 1)) if m else (0, size - 1)
            self.send_response(206)
            self.send_header("Content-Length", str(end + 1 - start))
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            self.wfile.flush()
            with open(path, "rb") as f:
                os.sendfile(self.connection.fileno(), f.fileno(), start, end + 1 - start)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


def ours(url: str, start: int, end: int, buf: mmap.mmap) -> None:
    from fimoe_convert.files.sources.http_range import read_range

    view = memoryview(buf)
    read_range(url, start, end, lambda pos, n: view[pos - start:pos - start + n], token=False)


def hub_client(url: str, start: int, end: int, buf: mmap.mmap) -> None:
    from huggingface_hub.utils import get_session

    at = 0
    with get_session().stream("GET", url, headers={"Range": f"bytes={start}-{end - 1}"}) as r:
        for chunk in r.iter_bytes():
            buf[at:at + len(chunk)] = chunk
            at += len(chunk)
    assert at == end - start, (at, end - start)


def timed(read, url: str, size: int, k: int, busy: bool) -> tuple[float, float]:
    """(MB/s, CPU seconds per GB) of reading `size` bytes over `k` connections, each its own range and buffer."""
    part = size // k
    bufs = [mmap.mmap(-1, part) for _ in range(k)]
    stop = threading.Event()

    def spin() -> None:  # pure Python: holds the GIL as a converting lane does between its C calls
        x = 0
        while not stop.is_set():
            for i in range(10_000):
                x += i

    spinner = threading.Thread(target=spin, daemon=True)
    if busy:
        spinner.start()
    cpu: list[float] = []

    def reader(i: int) -> None:  # the reading threads' own CPU, not the spinner's
        c0 = time.thread_time()
        read(url, i * part, (i + 1) * part, bufs[i])
        cpu.append(time.thread_time() - c0)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(k)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    if busy:
        spinner.join()
    return k * part / wall / 1e6, sum(cpu) / (k * part / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=512, help="megabytes of the file read in each run")
    ap.add_argument("--connections", default="1,8,16")
    ap.add_argument("--work", default=None, help="folder for the file (default: a temporary one)")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve)
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        path = Path(work) / "shard.bin"
        with open(path, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        size = path.stat().st_size
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(path)], stdout=subprocess.PIPE, text=True)
        try:
            url = f"http://127.0.0.1:{server.stdout.readline().strip()}/shard.bin"
            print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {size / 1e6:.0f} MB per run; "
                  f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
            print("| connections | beside | fimoe-convert MB/s | CPU s/GB | huggingface_hub MB/s | CPU s/GB | "
                  "MB/s ours / theirs | CPU theirs / ours |")
            print("|---|---|---|---|---|---|---|---|")
            for k in (int(x) for x in args.connections.split(",")):
                for busy in (False, True):
                    ours_rate, ours_cpu = timed(ours, url, size, k, busy)
                    hub_rate, hub_cpu = timed(hub_client, url, size, k, busy)
                    print(f"| {k} | {'a busy Python thread' if busy else 'nothing'} | {ours_rate:.0f} | "
                          f"{ours_cpu:.2f} | {hub_rate:.0f} | {hub_cpu:.2f} | {ours_rate / hub_rate:.2f}x | "
                          f"{hub_cpu / max(ours_cpu, 1e-9):.2f}x |", flush=True)
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
