"""--stream against a plain download, over the same capped link, in one run.

A local Hub server (127.0.0.1) serves a fixture checkpoint as the Hub does (resolve URLs with Range, the LFS sha256
in X-Linked-Etag, a tree listing), all connections together through one token bucket of --rate bytes per second (the
link), each connection through one of its own of --conn-rate (what a CDN serves one connection). Timed for each
--rate, each with a fresh Hugging Face cache: a plain download of the shards (huggingface_hub's snapshot_download in
a process of its own, as `hf download` runs it: 8 files at once), each target converted from the downloaded shards
(what users do without --stream: convert --offline; here from the served folder, the same bytes, so that the disk
holds one copy of the source beside a bf16 output of 3.6x its size), then `fimoe-convert REPO OUT --stream` for each
target. The disk used (the cache plus OUT, polled with du) is sampled throughout; the peak is printed beside the
output's size, and each conversion's peak RSS beside --max-memory. Goal: --stream within 1.15x of the download where
convert --offline alone is faster than the download, else within 1.15x of max(download, convert --offline); peak
disk at most the output plus 1%; peak RSS within --max-memory. The fixture is kept in --work between runs of the
same geometry. V4-Flash geometry: --layers 2 --experts 256 --mtp 1 (10.4 GB of shards).

usage: python3 scripts/bench/bench_stream.py [--rate 50MB[,200MB,...]] [--conn-rate 100MB] [--connections N]
       [--layers 1] [--experts 96] [--mtp 0] [--work DIR] [--code DIR]
       [--targets bf16,fp8_block,megamoe_sm90_mxfp4] [--max-memory 8GiB] [--shard-size S] [--writers N]
       [--json FILE]
       python3 scripts/bench/bench_stream.py --chart-from FILE.json[,...] --chart FILE.png   (needs matplotlib only)
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
    """The fixture folder as repo@commit, served through one Bucket (the link), each answer through one of its own
    of `conn_rate` bytes per second (None: unlimited)."""

    def __init__(self, folder: Path, rate: float, repo: str = REPO, commit: str = COMMIT,
                 conn_rate: float | None = None):
        self.folder, self.bucket, self.repo, self.commit = folder, Bucket(rate), repo, commit
        self.conn_rate = conn_rate
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
            own = Bucket(self.conn_rate) if self.conn_rate else None
            with open(file, "rb") as f:
                f.seek(start)
                left = end + 1 - start
                while left > 0:
                    data = f.read(min(CHUNK, left))
                    if own:
                        own.take(len(data))
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


def env_for(hub: Hub, cache: Path, code: Path) -> dict:
    """A child's environment: the local Hub, a cache of its own, no token, `code`'s fimoe_convert first."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "", "NO_PROXY": "127.0.0.1,localhost",
           "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("HF_HUB_OFFLINE", None)
    return env


def child(argv: list[str], env: dict) -> tuple[str, int]:
    """(stdout, peak RSS in bytes) of a child process; its stderr in the error where it fails."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    readers = [threading.Thread(target=lambda f, into: into.append(f.read()), args=(f, into), daemon=True)
               for f, into in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[:6])}... failed ({proc.returncode}): {''.join(err)[-4000:]}")
    return "".join(out), usage.ru_maxrss * 1024  # kilobytes on Linux


def download(hub: Hub, cache: Path, code: Path) -> None:
    script = ("import sys, huggingface_hub; huggingface_hub.snapshot_download(sys.argv[1], revision=sys.argv[2], "
              "cache_dir=sys.argv[3], max_workers=8)")
    child([sys.executable, "-c", script, REPO, COMMIT, str(cache)], env_for(hub, cache, code))


def convert(hub: Hub, cache: Path, out: Path, target: str, args, local: Path | None = None) -> dict:
    """One CLI conversion in a child: REPO with `--stream`, or the folder `local` (the downloaded shards: the
    same bytes the download put in its cache, which is deleted once timed, so that the disk holds one copy);
    its --json summary with `peak_rss`."""
    how = [str(local)] if local else [REPO, "--stream"]
    conns = ["--connections", str(args.connections)] if not local and args.connections else []
    conns += ["--shard-size", args.shard_size] if args.shard_size else []
    conns += ["--writers", str(args.writers)] if args.writers else []
    # -P: `code`'s package, not the one in the working directory (where `python -m` looks first)
    text, rss = child([sys.executable, "-P", "-m", "fimoe_convert", how[0], str(out), *how[1:], *conns, "--target",
                       target, "--max-memory", args.max_memory, "--json", "-q", *EXTRA.get(target, [])],
                      env_for(hub, cache, args.code))
    return {**json.loads(text), "peak_rss": rss}


def import_floor(code: Path) -> float:
    """Seconds of the quickest of 3 `python -c 'import fimoe_convert.conversion'`: start-up and imports (torch)."""
    best = float("inf")
    env = {**os.environ, "PYTHONPATH": str(code)}
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-P", "-c", "import fimoe_convert.conversion"], check=True, env=env)
        best = min(best, time.perf_counter() - t0)
    return round(best, 2)


def fixture(work: Path, layers: int, experts: int, mtp: int) -> Path:
    """The flash-geometry fixture in work/src, written once per geometry (a stamp names it)."""
    from fimoe_convert.testing import make_checkpoint

    src, stamp = work / "src", work / "src.json"
    want = {"layers": layers, "experts": experts, "mtp": mtp}
    if src.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return src
    shutil.rmtree(src, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    make_checkpoint(src, "flash-geometry", fast=True, layers=layers, mtp=mtp, experts=experts)
    stamp.write_text(json.dumps(want))
    return src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="50MB", help="the link: bytes per second, all connections together; several "
                    "comma-separated: one run each, on the same fixture")
    ap.add_argument("--conn-rate", default=None, help="bytes per second one connection gets (default: no limit)")
    ap.add_argument("--connections", type=int, default=None, help="--stream's --connections (default: the tool's)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--experts", type=int, default=96)
    ap.add_argument("--mtp", type=int, default=0)
    ap.add_argument("--targets", default="bf16,fp8_block,megamoe_sm90_mxfp4")
    ap.add_argument("--max-memory", default="8GiB")
    ap.add_argument("--shard-size", default=None, help="both conversions' --shard-size (default: the tool's)")
    ap.add_argument("--writers", type=int, default=None, help="both conversions' --writers (default: the tool's)")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "fimoe-bench-stream"))
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[2],
                    help="the folder whose fimoe_convert the conversions run (default: this script's checkout)")
    ap.add_argument("--json", default=None, help="write the results as JSON to this file (a list: one per rate)")
    ap.add_argument("--chart-from", default=None,
                    help="draw the chart of earlier --json FILEs (comma-separated), then exit")
    ap.add_argument("--chart", default="docs/img/stream.png")
    ap.add_argument("--serve", default=None, metavar="FOLDER", help="serve FOLDER as --repo@--commit until killed")
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--commit", default=COMMIT)
    args = ap.parse_args()
    if args.chart_from:
        got = [json.loads(Path(f).read_text()) for f in args.chart_from.split(",")]
        return chart([r for g in got for r in (g if isinstance(g, list) else [g])], Path(args.chart))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fimoe_convert.sizes import parse_size

    if args.serve:
        hub = Hub(Path(args.serve), parse_size(args.rate, "--rate"), args.repo, args.commit,
                  parse_size(args.conn_rate, "--conn-rate") if args.conn_rate else None)
        print(hub.url, flush=True)
        threading.Event().wait()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = fixture(work, args.layers, args.experts, args.mtp)
    for p in work.iterdir():  # what an earlier run left, but the fixture
        if p.name not in ("src", "src.json"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    floor = import_floor(args.code)
    print(f"a conversion process's floor (python -c 'import fimoe_convert.conversion', best of 3): {floor:.2f} s")
    runs = []
    for rate in args.rate.split(","):
        runs.append(one_rate(args, src, work, rate, floor))
        if args.json:  # after each rate: a run cut short keeps the rates done
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    print()
    table(runs)


def one_rate(args, src: Path, work: Path, rate: str, floor: float) -> dict:
    from fimoe_convert.sizes import human, parse_size

    shard_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    conn = parse_size(args.conn_rate, "--conn-rate") if args.conn_rate else None
    hub = Hub(src, parse_size(rate, "--rate"), conn_rate=conn)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; fixture: flash-geometry, {args.layers} layer(s), "
          f"{args.experts} experts, {args.mtp} MTP: {human(shard_bytes)} of shards in "
          f"{len(list(src.glob('*.safetensors')))} files; link {rate}/s, {args.conn_rate or 'unlimited'}/s per "
          f"connection; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; code {args.code}", flush=True)
    budget = parse_size(args.max_memory, "--max-memory")
    results = {"rate": rate, "conn_rate": args.conn_rate, "shard_bytes": shard_bytes, "cores": os.cpu_count(),
               "runs": [], "load_before": round(os.getloadavg()[0], 2), "import_floor": floor,
               "max_memory": budget}
    cache = work / "cache-download"
    seconds, peak = timed(lambda: download(hub, cache, args.code), cache)
    results["download"] = {"seconds": round(seconds, 2), "peak_disk": peak}
    print(f"plain download: {seconds:.2f} s, {human(shard_bytes / seconds)}/s, peak disk {human(peak)}", flush=True)
    shutil.rmtree(cache)
    first = {}  # the alternative: convert the downloaded copy (offline), after the download
    for target in args.targets.split(","):
        out, res = work / f"offline-{target}", {}
        secs, _ = timed(lambda: res.update(convert(hub, cache, out, target, args, src)), out)  # noqa: B023 - called within this iteration
        first[target] = {"seconds": round(secs, 2), "convert_seconds": round(res["seconds"], 2),
                         "peak_rss": res["peak_rss"]}
        print(f"download first, then --offline {target}: convert {secs:.2f} s (convert() {res['seconds']:.2f} s); "
              f"with the download {seconds + secs:.2f} s, peak disk {human(peak + du(out))}", flush=True)
        shutil.rmtree(out)
    results["download_first"] = first
    for target in args.targets.split(","):
        cache, out = work / f"cache-{target}", work / f"out-{target}"
        res: dict = {}
        secs, peak = timed(lambda: res.update(convert(hub, cache, out, target, args)), cache, out)  # noqa: B023 - called within this iteration
        out_bytes = du(out)
        left = sorted(p.name for p in cache.rglob("*.safetensors"))
        offline = first[target]["seconds"]
        bound = seconds if offline <= seconds else max(seconds, offline)  # the goal's base
        row = {"target": target, "seconds": round(secs, 2), "ratio": round(secs / seconds, 3),
               "bound": round(bound, 2), "ratio_to_bound": round(secs / bound, 3), "peak_disk": peak,
               "out_disk": out_bytes, "peak_over_out": round(peak / out_bytes, 4), "fetched": res.get("bytes_fetched"),
               "fetched_ratio": round(res["bytes_fetched"] / shard_bytes, 4) if res.get("bytes_fetched") else None,
               "held_peak": res.get("bytes_held_peak"), "stream_max_memory": res.get("stream_max_memory"),
               "shards_in_cache": left, "convert_seconds": round(res["seconds"], 2), "timings": res["timings"],
               "peak_rss": res["peak_rss"]}
        row["goal_met"] = row["ratio_to_bound"] <= 1.15 and row["peak_over_out"] <= 1.01 and res["peak_rss"] <= budget
        results["runs"].append(row)
        print(f"--stream {target}: {secs:.2f} s = {secs / seconds:.2f}x the download, {secs / bound:.2f}x the goal's "
              f"base ({'download' if bound == seconds else 'convert --offline'}, {bound:.2f} s); peak disk "
              f"{human(peak)} = {peak / out_bytes:.4f}x the output ({human(out_bytes)}); peak RSS "
              f"{human(res['peak_rss'])}; fetched {fetched_line(res.get('bytes_fetched'), shard_bytes)}; "
              f"held at most {human(res.get('bytes_held_peak') or 0)} (without re-fetches: --max-memory "
              f"{human(res.get('stream_max_memory') or 0)}); source shards in the cache: {len(left)}; "
              f"convert() {res['seconds']:.2f} s, outside it "
              f"{secs - res['seconds']:.2f} s; "
              f"stages {res['timings']}", flush=True)
        shutil.rmtree(out)
        shutil.rmtree(cache)
    hub.server.shutdown()
    hub.server.server_close()
    results["load_after"] = round(os.getloadavg()[0], 2)
    print(f"load average at the end {results['load_after']:.2f}", flush=True)
    return results


def fetched_line(fetched: int | None, shard_bytes: int) -> str:
    """"fetched X GB of Y GB (ratio)": bytes received from the Hub against the shards' bytes (1.000: each once)."""
    if fetched is None:
        return "? (no bytes_fetched in the summary)"
    return f"{fetched / 1e9:.3f} GB of {shard_bytes / 1e9:.3f} GB ({fetched / shard_bytes:.3f})"


def table(runs: list[dict]) -> None:
    """The summary, one line per rate and target (Markdown)."""
    print("| link | per conn | target | download | convert --offline | download + convert | --stream | "
          "/download | /goal base | peak disk/out | peak RSS | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        down = r["download"]["seconds"]
        for row in r["runs"]:
            off = r["download_first"][row["target"]]["seconds"]
            print(f"| {r['rate']}/s | {r['conn_rate'] or '-'} | {row['target']} | {down:.1f} s | {off:.1f} s | "
                  f"{down + off:.1f} s | {row['seconds']:.1f} s | {row['ratio']:.2f}x | {row['ratio_to_bound']:.2f}x | "
                  f"{row['peak_over_out']:.4f} | {row['peak_rss'] / 2**30:.2f} GiB | "
                  f"{'met' if row['goal_met'] else 'MISSED'} |")


def chart(results: list[dict] | dict, png: Path) -> None:
    """Per link rate: wall seconds of the plain download, `download, then convert --offline` and `--stream` per
    target, against the goal (1.15x the download, or of convert --offline where that is slower)."""
    results = results if isinstance(results, list) else [results]  # one rate: an older run's JSON
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.4), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        down = res["download"]["seconds"]
        labels, bars, colors, goals = [], [], [], []
        for r in res["runs"]:
            first = res["download_first"][r["target"]]
            labels += [f"download + {r['target']}", f"--stream {r['target']}"]
            bars += [down + first["seconds"], r["seconds"]]
            colors += ["#c6c6c6", "#4c72b0" if r.get("goal_met", r["ratio"] <= 1.15) else "#c44e52"]
            goals += [None, 1.15 * r.get("bound", down)]
        ys = range(len(bars))
        ax.barh(ys, bars, color=colors)
        for y, g in zip(ys, goals, strict=True):
            if g:
                ax.plot([g, g], [y - 0.4, y + 0.4], color="k", ls="--", lw=1)
        ax.axvline(down, color="#8172b2", lw=1.5, label=f"plain download {down:.1f} s")
        ax.set_yticks(list(ys), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds (wall); dashed: the goal")
        ax.set_title(f"{res['shard_bytes'] / 1e9:.2f} GB, link {res['rate']}/s, "
                     f"{res.get('conn_rate') or 'unlimited'}/s a connection", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"chart: {png}")


if __name__ == "__main__":
    main()
