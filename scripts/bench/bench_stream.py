"""--stream against a plain download, over the same capped link, in one run.

A local Hub server (127.0.0.1) serves a fixture checkpoint as the Hub does (resolve URLs with Range, the LFS
sha256 in X-Linked-Etag, a tree listing), all connections together through one token bucket of --rate bytes per
second. Timed, each with a fresh Hugging Face cache: a plain download of the shards (huggingface_hub's
snapshot_download in a process of its own, as `hf download` runs it: 8 files at once), then `fimoe-convert REPO OUT
--stream` for each target. The disk used (the cache plus OUT, polled with du) is sampled throughout; the peak is
printed beside the output's size. Also printed: the floor of a conversion process (start-up and imports), and each
run's time outside `convert()`. Goal: --stream within 1.15x of the download, peak disk at most the output plus 1%.
The default fixture (1 layer, 96 experts: 1.4 GB) is big enough that a few seconds of start-up do not dominate.

usage: python3 scripts/bench/bench_stream.py [--rate 50MB] [--layers 1] [--experts 96] [--work DIR]
       [--targets bf16,fp8_block,megamoe_sm90_mxfp4] [--json FILE]
       python3 scripts/bench/bench_stream.py --chart-from FILE.json --chart FILE.png   (needs matplotlib only)
       python3 scripts/bench/bench_stream.py --serve FOLDER [--repo ORG/NAME] [--commit SHA] [--rate 1GB]
           (serve FOLDER as a Hub repo until killed, its URL on the first line; scripts/prebake/build_local.sh
           imports its `Hub` to count the bytes it serves)"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO, COMMIT = "bench/stream-v4", "b" * 40
CHUNK = 256 * 1024  # bytes per write to a socket, each paid for in the bucket first
EXTRA = {"megamoe_sm90_mxfp4": ["--arch", "9.0"]}  # judged for an H200 where none is present: the bytes are the same


class Bucket:
    """A token bucket of `rate` bytes per second shared by every connection (burst: a tenth of a second)."""

    def __init__(self, rate: float):
        self.rate, self.tokens, self.t = rate, 0.0, time.perf_counter()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:
            now = time.perf_counter()
            self.tokens = min(self.rate / 10, self.tokens + (now - self.t) * self.rate) - n
            self.t = now
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait:
            time.sleep(wait)


class Hub:
    """The fixture folder as repo@commit, served through one Bucket."""

    def __init__(self, folder: Path, rate: float, repo: str = REPO, commit: str = COMMIT):
        self.folder, self.bucket, self.repo, self.commit = folder, Bucket(rate), repo, commit
        self.sha = {p.name: _sha256(p) for p in folder.iterdir()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.serve(self, body=False)

            def do_GET(self):
                hub.serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, h, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        if path.startswith(f"/api/models/{self.repo}/tree/"):
            return self._send(h, 200, {"Content-Type": "application/json"}, json.dumps([
                {"type": "file", "path": n, "size": (self.folder / n).stat().st_size, "oid": s[:40],
                 **({"lfs": {"oid": s, "size": (self.folder / n).stat().st_size, "pointerSize": 134}}
                    if n.endswith(".safetensors") else {})} for n, s in sorted(self.sha.items())]).encode())
        m = re.fullmatch(rf"/{re.escape(self.repo)}/resolve/[^/]+/(.+)", path)
        if not m or m.group(1) not in self.sha:
            return self._send(h, 404, {"X-Error-Code": "EntryNotFound"}, b"")
        file = self.folder / m.group(1)
        size, sha = file.stat().st_size, self.sha[m.group(1)]
        start, end, status = 0, size - 1, 200
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range", ""))
        if rng:
            start, end, status = int(rng.group(1)), min(int(rng.group(2) or size - 1), size - 1), 206
        head = {"X-Repo-Commit": self.commit, "ETag": f'"{sha[:40]}"', "Content-Length": str(end + 1 - start),
                "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(size)}
        if status == 206:
            head["Content-Range"] = f"bytes {start}-{end}/{size}"
        self._send(h, status, head, None)
        if body:
            with open(file, "rb") as f:
                f.seek(start)
                left = end + 1 - start
                while left > 0:
                    data = f.read(min(CHUNK, left))
                    self.bucket.take(len(data))
                    try:
                        h.wfile.write(data)
                    except OSError:
                        return
                    left -= len(data)

    @staticmethod
    def _send(h, status: int, headers: dict, payload: bytes | None) -> None:
        h.send_response(status)
        if payload is not None:
            headers = {**headers, "Content-Length": str(len(payload))}
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if payload:
            h.wfile.write(payload)


def _sha256(p: Path) -> str:
    d = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 24):
            d.update(chunk)
    return d.hexdigest()


def du(*folders: Path) -> int:
    """Bytes of disk the folders use (blocks allocated), 0 for a folder not there yet."""
    total = 0
    for folder in folders:
        for root, _, files in os.walk(folder):
            for n in files:
                try:
                    total += os.lstat(os.path.join(root, n)).st_blocks * 512
                except OSError:
                    pass
    return total


def timed(fn, *watch: Path) -> tuple[float, int]:
    """(seconds, peak disk bytes under `watch`) of fn(), disk polled every 50 ms."""
    peak, done = [0], threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], du(*watch))
            done.wait(0.05)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    done.set()
    t.join()
    return seconds, max(peak[0], du(*watch))


def env_for(hub: Hub, cache: Path) -> dict:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "", "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("HF_HUB_OFFLINE", None)
    return env


def download(hub: Hub, cache: Path) -> None:
    code = ("import sys, huggingface_hub; huggingface_hub.snapshot_download(sys.argv[1], revision=sys.argv[2], "
            "cache_dir=sys.argv[3], max_workers=8)")
    subprocess.run([sys.executable, "-c", code, REPO, COMMIT, str(cache)], env=env_for(hub, cache), check=True,
                   capture_output=True)


def stream(hub: Hub, cache: Path, out: Path, target: str, max_memory: str, how: str = "--stream") -> dict:
    """One CLI conversion of REPO in a child: `--stream`, or `--offline` from the cache a download filled."""
    pin = ["--revision", COMMIT] if how == "--offline" else []  # the download fetched the commit, not `main`
    r = subprocess.run([sys.executable, "-m", "fimoe_convert", REPO, str(out), how, *pin, "--target", target,
                        "--max-memory", max_memory, "--json", "-q", *EXTRA.get(target, [])],
                       env=env_for(hub, cache), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"--stream {target} failed: {r.stderr}")
    return json.loads(r.stdout)


def import_floor() -> float:
    """Seconds of the quickest of 3 `python -c 'import fimoe_convert.conversion'`: start-up and imports (torch)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import fimoe_convert.conversion"], check=True)
        best = min(best, time.perf_counter() - t0)
    return round(best, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="50MB", help="the link: bytes per second, all connections together")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--experts", type=int, default=96)
    ap.add_argument("--targets", default="bf16,fp8_block,megamoe_sm90_mxfp4")
    ap.add_argument("--max-memory", default="8GiB")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "fimoe-bench-stream"))
    ap.add_argument("--json", default=None, help="write the results as JSON to this file")
    ap.add_argument("--chart-from", default=None, help="draw the chart of an earlier --json FILE, then exit")
    ap.add_argument("--chart", default="docs/img/stream.png")
    ap.add_argument("--serve", default=None, metavar="FOLDER", help="serve FOLDER as --repo@--commit until killed")
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--commit", default=COMMIT)
    args = ap.parse_args()
    if args.chart_from:
        return chart(json.loads(Path(args.chart_from).read_text()), Path(args.chart))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fimoe_convert.sizes import human, parse_size
    from fimoe_convert.testing import fresh_folder, make_checkpoint

    if args.serve:
        hub = Hub(Path(args.serve), parse_size(args.rate, "--rate"), args.repo, args.commit)
        print(hub.url, flush=True)
        threading.Event().wait()

    work = fresh_folder(args.work)
    src = make_checkpoint(work / "src", "flash-geometry", fast=True, layers=args.layers, mtp=0,
                          experts=args.experts)
    shard_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    hub = Hub(src, parse_size(args.rate, "--rate"))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; fixture: flash-geometry, {args.layers} layer(s), "
          f"{args.experts} experts: {human(shard_bytes)} of shards; link {args.rate}/s; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    results = {"rate": args.rate, "shard_bytes": shard_bytes, "cores": os.cpu_count(), "runs": [],
               "load_before": round(os.getloadavg()[0], 2)}
    floor = import_floor()
    results["import_floor"] = floor
    print(f"a conversion process's floor (python -c 'import fimoe_convert.conversion', best of 3): {floor:.2f} s")
    cache = work / "cache-download"
    seconds, peak = timed(lambda: download(hub, cache), cache)
    results["download"] = {"seconds": round(seconds, 2), "peak_disk": peak}
    print(f"plain download: {seconds:.2f} s, {human(shard_bytes / seconds)}/s, peak disk {human(peak)}")
    first = {}  # the alternative: convert the downloaded copy (--offline), after the download
    for target in args.targets.split(","):
        out, res = work / f"offline-{target}", {}
        secs, _ = timed(lambda: res.update(stream(hub, cache, out, target, args.max_memory, "--offline")), out)  # noqa: B023 - called within this iteration
        first[target] = {"seconds": round(secs, 2), "convert_seconds": round(res["seconds"], 2)}
        print(f"download first, then --offline {target}: convert {secs:.2f} s (convert() {res['seconds']:.2f} s); "
              f"with the download {seconds + secs:.2f} s, peak disk {human(peak + du(out))}")
        shutil.rmtree(out)
    results["download_first"] = first
    shutil.rmtree(cache)
    for target in args.targets.split(","):
        cache, out = work / f"cache-{target}", work / f"out-{target}"
        res: dict = {}
        secs, peak = timed(lambda: res.update(stream(hub, cache, out, target, args.max_memory)), cache, out)  # noqa: B023 - called within this iteration
        out_bytes = du(out)
        left = sorted(p.name for p in cache.rglob("*.safetensors"))
        row = {"target": target, "seconds": round(secs, 2), "ratio": round(secs / seconds, 3), "peak_disk": peak,
               "out_disk": out_bytes, "peak_over_out": round(peak / out_bytes, 4), "fetched": res.get("bytes_fetched"),
               "shards_in_cache": left, "convert_seconds": round(res["seconds"], 2), "timings": res["timings"]}
        results["runs"].append(row)
        print(f"--stream {target}: {secs:.2f} s = {secs / seconds:.2f}x the download; peak disk {human(peak)} = "
              f"{peak / out_bytes:.4f}x the output ({human(out_bytes)}); fetched {human(res.get('bytes_fetched') or 0)}"
              f"; source shards in the cache: {len(left)}; convert() itself {res['seconds']:.2f} s "
              f"({res['seconds'] / seconds:.2f}x), outside it {secs - res['seconds']:.2f} s; stages {res['timings']}")
        shutil.rmtree(out)
        shutil.rmtree(cache)
    results["load_after"] = round(os.getloadavg()[0], 2)
    print(f"load average at the end {results['load_after']:.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


def chart(results: dict, png: Path) -> None:
    """Wall seconds of `download, then convert --offline` and of `--stream` per target (split into `convert()` and
    the rest of the process: start-up and imports, while the streams already run, and exit), against the plain
    download and the 1.15x goal; and peak disk over the output's size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    down = results["download"]["seconds"]
    rows = []  # (label, [(seconds, color, legend)])
    for r in results["runs"]:
        first = results.get("download_first", {}).get(r["target"])
        if first:
            rows.append((f"download, then {r['target']}", [(down, "#8172b2", "plain download"),
                                                           (first["seconds"], "#c6c6c6", "convert --offline (wall)")]))
        rows.append((f"--stream {r['target']}", [
            (r["convert_seconds"], "#4c72b0", "--stream: convert()"),
            (r["seconds"] - r["convert_seconds"], "#dd8452", "--stream: start-up, imports (streams running), exit")]))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 1.4]})
    seen = set()
    for i, (_, parts) in enumerate(rows):
        left = 0.0
        for secs, color, label in parts:
            ax.barh(i, secs, left=left, color=color, label=None if label in seen else label)
            seen.add(label)
            left += secs
    ax.axvline(down, color="k", lw=1)
    ax.axvline(1.15 * down, color="k", ls="--", lw=1, label="goal: 1.15x the download")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (wall)")
    load = f", load average {results['load_before']}-{results['load_after']}" if "load_before" in results else ""
    ax.set_title(f"{results['shard_bytes'] / 1e9:.2f} GB of shards over a {results['rate']}/s cap, "
                 f"{results['cores']} cores{load}", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    runs = results["runs"]
    bx.barh(range(len(runs)), [r["peak_over_out"] for r in runs], color="#55a868")
    bx.axvline(1.01, color="k", ls="--", lw=1)
    bx.set_yticks(range(len(runs)), [f"--stream {r['target']}" for r in runs], fontsize=8)
    bx.invert_yaxis()
    bx.set_xlim(0.99, 1.02)
    bx.set_xlabel("peak disk / output size (goal <= 1.01)", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"chart: {png}")


if __name__ == "__main__":
    main()
