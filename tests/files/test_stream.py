"""--stream: a Hub repo's shards read over HTTP straight into the conversion, against a fake Hub on 127.0.0.1
(tests/helpers/hub_files.py) that answers as the Hub does (LFS sha256 in X-Linked-Etag, ranges, a tree listing) and
injects faults: a corrupted byte, a dropped connection, a stalled answer, a 5xx, a server that ignores Range.
The reference is the same repo downloaded first (a seeded Hugging Face cache, converted offline)."""

import hashlib
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
from click.testing import CliRunner
from helpers.hub_files import HubFiles, point_hf_at
from helpers.stream_case import convert_both
from test_upload import TOKEN, FakeHub, arrived, expected_files, hub  # noqa: F401 - `hub`: a Hub taking uploads

import fimoe_convert.files.sources.http_range as http_range
from fimoe_convert import convert, verify
from fimoe_convert.cli import main
from fimoe_convert.errors import InputError, UsageError
from fimoe_convert.files.output import manifest as manifest_mod
from fimoe_convert.files.sources.stream import StreamedSource, end_early, open_streamed, stream_early
from fimoe_convert.kernels import KERNELS, Kernel
from fimoe_convert.targets.rules import availability
from fimoe_convert.testing import seed_hub_cache

REPO, COMMIT = "org/tiny-v4", "c" * 40
SHARDS = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
CASE = Path(__file__).parents[1] / "helpers" / "stream_case.py"
WORKER_SECONDS = 600  # one case in a worker, at most


def target_cases():
    """Every row of the kernel table, and each --param value other than its default (they change the bytes): with
    --ep-size 2 where the layout is sharded by rank, --arch one the kernel runs on, and --device cuda only where
    FlashInfer's preprocessing needs it (those cases are `gpu`)."""
    for k in KERNELS:
        for params in [{}, *({key: v} for key, values in k.params.items() for v in values[1:])]:
            kw = {"params": params, "device": "cuda" if k.preprocess_needs_cuda else "cpu", "shard_size": "1MB"}
            kw |= {"ep_size": 2} if k.kernel_name else {}
            kw |= {"arch": k.capabilities[0]} if k.capabilities else {}
            marks = [pytest.mark.gpu] if k.preprocess_needs_cuda else []
            marks += [] if (k.name, params) == ("bf16", {}) else [pytest.mark.slow]  # bf16: the fast tier's case
            yield pytest.param(k, kw, marks=marks, id="-".join([k.name, *(f"{a}={b}" for a, b in params.items())]))


def skip_unless_it_converts_here(k: Kernel):
    """The skip for a target this machine cannot convert, saying why (what `fimoe-convert targets` says)."""
    ok, why = availability(k)
    if not ok:
        pytest.skip(f"--target {k.name}: {why}")


@pytest.fixture
def served(tiny_ckpt, tmp_path, monkeypatch):
    """The tiny checkpoint as REPO@COMMIT on a fake Hub that huggingface_hub is pointed at; an empty cache."""
    with HubFiles(REPO, tiny_ckpt, COMMIT) as h:
        yield point_at(h, tmp_path, monkeypatch)


def point_at(h: HubFiles, tmp_path, monkeypatch, token: str = "") -> HubFiles:
    """huggingface_hub pointed at the fake Hub `h`, with HF_TOKEN `token` and an empty cache."""
    point_hf_at(h.url, monkeypatch, tmp_path / "cache", token)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(http_range, "BACKOFF_SECONDS", (0.01,))
    return h


def downloaded(tiny_ckpt, tmp_path, monkeypatch, target: str, **kw):
    """OUT of a conversion of REPO downloaded first: a Hugging Face cache holding it, converted offline."""
    cache, out = tmp_path / "downloaded-cache", tmp_path / f"downloaded-{target}"
    seed_hub_cache(tiny_ckpt, cache, REPO, COMMIT)
    with monkeypatch.context() as m:
        m.setenv("HF_HUB_CACHE", str(cache))
        convert(REPO, str(out), target, offline=True, **kw)
    return out


def when_streams_start(monkeypatch, arm):
    """Call `arm()` once, as the streams start (after SRC was opened: its header reads see no fault): early, while
    convert() imports torch, or when the conversion starts them."""
    armed = []

    def hook(real):
        def start(self, *args, **kwargs):
            if not armed:
                armed.append(arm())
            return real(self, *args, **kwargs)
        return start

    for name in ("_start_early", "start"):
        monkeypatch.setattr(StreamedSource, name, hook(getattr(StreamedSource, name)))


def same_files(a, b) -> list[str]:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    return [n for n in names if (a / n).read_bytes() != (b / n).read_bytes()]


def shard_gets(server, name):
    return [r for m, p, r in server.requests if m == "GET" and p.endswith("/" + name)]


def tiling(ranges: list[str]) -> list[tuple[int, int]]:
    """The byte spans [a, b) that Range headers `bytes=A-B` cover, merged where they touch; None where two
    overlap (a byte asked for twice)."""
    spans = sorted((int(a), int(b) + 1) for a, b in (re.fullmatch(r"bytes=(\d+)-(\d+)", r).groups() for r in ranges))
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a < merged[-1][1]:
            return None
        merged[-1:] = [(merged[-1][0], b)] if merged and a == merged[-1][1] else [*merged[-1:], (a, b)]
    return merged


def first_written_shard(monkeypatch) -> threading.Event:
    """Set once this process's conversion writes a manifest that records a shard as written."""
    event = threading.Event()
    real = manifest_mod.write_manifest

    def write(out_dir, manifest):
        real(out_dir, manifest)
        if "written" in manifest.status.values():
            event.set()

    monkeypatch.setattr(manifest_mod, "write_manifest", write)
    return event


@pytest.fixture(scope="module")
def moe_ep_workers(tmp_path_factory):
    """`ask(kernel, case)`: convert_both in a worker process, one for FlashInfer's SM90 moe_ep kernels and one for
    the others (their kernel trees share module names); each imports torch and FlashInfer once."""
    workers, log = {}, tmp_path_factory.mktemp("workers")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env |= {"HF_TOKEN": "", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(log / "hf-home")}

    def ask(kernel: Kernel, case: dict) -> dict:
        tree = "sm90" if "9.0" in kernel.capabilities else "other"
        if tree not in workers:
            with (log / f"{tree}.err").open("w") as err:
                workers[tree] = subprocess.Popen([sys.executable, str(CASE)], stdin=subprocess.PIPE,
                                                 stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        w = workers[tree]
        w.stdin.write(json.dumps(case) + "\n")
        w.stdin.flush()
        line = w.stdout.readline() if select.select([w.stdout], [], [], WORKER_SECONDS)[0] else ""
        if not line:  # dead or stuck: the next case of this tree starts a fresh worker
            w.kill()
            w.wait()
            del workers[tree]
            pytest.fail(f"the {tree} worker gave no answer in {WORKER_SECONDS} s; its stderr ends: "
                        + (log / f"{tree}.err").read_text()[-4000:])
        got = json.loads(line)
        assert "error" not in got, got["error"]
        return got

    yield ask
    for w in workers.values():  # every answer read: nothing to wait for (torch's exit takes seconds)
        w.stdin.close()
        w.kill()
        w.wait()


@pytest.mark.parametrize("kernel, kw", list(target_cases()))
def test_stream_output_is_the_downloaded_conversion_byte_for_byte(served, moe_ep_workers, tiny_ckpt, tmp_path,
                                                                  kernel, kw):
    skip_unless_it_converts_here(kernel)
    out, ref, cache, ref_cache = (tmp_path / n for n in ("streamed", "downloaded", "cache", "downloaded-cache"))
    seed_hub_cache(tiny_ckpt, ref_cache, REPO, COMMIT)
    case = {"repo": REPO, "target": kernel.name, "out": str(out), "ref": str(ref), "cache": str(cache),
            "ref_cache": str(ref_cache), "kw": kw}
    got = moe_ep_workers(kernel, {"endpoint": served.url, **case}) if kernel.family == "moe_ep" else convert_both(
        **case)
    assert same_files(out, ref) == []  # shards, index, config, card, manifest (sha256 of every input) and all
    assert got["problems"] == []  # verify
    assert got["bytes_fetched"] == sum((tiny_ckpt / s).stat().st_size for s in SHARDS)  # each shard once
    assert not list(cache.rglob("*.safetensors"))  # no source shard on disk
    assert sorted(p.name for p in cache.rglob("snapshots/*/*")) == sorted(
        p.name for p in tiny_ckpt.iterdir() if p.suffix != ".safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("cap", [64 << 20, 1 << 20])
def test_streams_begun_early_are_taken_over_by_the_conversion(served, tiny_ckpt, tmp_path, monkeypatch, cap):
    """stream_early (convert()'s, while torch is imported; here begun before the call) streams before the plan
    exists, keeping tensors within `cap`: with room for all, every shard is verified before the conversion starts;
    with 1 MiB, the streams wait. The conversion takes the source over: each shard streamed once, the shards
    verified early recorded, the same output."""
    shard_bytes = sum((tiny_ckpt / s).stat().st_size for s in SHARDS)
    when_streams_start(monkeypatch, served.requests.clear)  # the header reads before it: not the streams'
    stream_early(REPO, None, cap)
    early = open_streamed(REPO, None)  # the source stream_early opened, which convert() takes
    if cap > shard_bytes:  # every shard streams: until the last byte arrives
        deadline = time.monotonic() + 60
        while early.fetched < shard_bytes and time.monotonic() < deadline:
            time.sleep(0.05)
    else:  # the streams wait for room: until no byte arrives for a while (under load, a pause passes this check too)
        seen, deadline = -1, time.monotonic() + 60
        while early.fetched != seen and time.monotonic() < deadline:
            seen = early.fetched
            time.sleep(0.5)
    assert (early.fetched == shard_bytes) == (cap > shard_bytes), early.fetched
    out = tmp_path / "streamed"
    try:
        res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB")
    finally:
        end_early()
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert res.bytes_fetched == shard_bytes and early.fetched == shard_bytes
    for s in SHARDS:  # each byte asked for once
        assert tiling(shard_gets(served, s)) == [(0, (tiny_ckpt / s).stat().st_size)], shard_gets(served, s)


@pytest.mark.slow
def test_a_corrupted_byte_stops_the_run_naming_the_shard(served, tiny_ckpt, tmp_path, monkeypatch):
    bad = SHARDS[2]
    offset = (tiny_ckpt / bad).stat().st_size - 100  # in the last tensor's bytes

    def corrupt(name, start, part):
        if name != bad or not start <= offset < start + len(part):
            return part
        i = offset - start
        return part[:i] + bytes([part[i] ^ 1]) + part[i + 1:]

    when_streams_start(monkeypatch, lambda: setattr(served, "fault", corrupt))
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"^org/tiny-v4/{bad}@c{{40}}: the sha256 of the bytes received, "
                                         r"[0-9a-f]{16}\.\.\., differs from the Hub's record, [0-9a-f]{16}\.\.\.; "
                                         r"nothing converted"):
        convert(REPO, str(out), "bf16", stream=True, shard_size="1MB")
    m = json.loads((out / "fimoe-manifest.json").read_text())
    assert m["complete"] is False and m["source"]["files"][bad]["sha256"] is None
    written = [f for f, st in m["status"].items() if st == "written"]
    assert sorted(p.name for p in out.glob("model-*.safetensors")) == sorted(written)
    ref = downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")
    assert len(written) < 9 and all((out / f).read_bytes() == (ref / f).read_bytes() for f in written)


def cut_once(names, after: int):
    """A fault: the first stream GET of each of `names` sends `after` bytes, then the connection drops."""
    left = set(names)

    def fault(name, start, part):
        if name in left and len(part) > after:
            left.discard(name)
            return part[:after]
        return part

    return fault


@pytest.mark.slow
@pytest.mark.parametrize("ignore_range", [False, True])
def test_a_dropped_connection_resumes_where_it_stopped(served, tiny_ckpt, tmp_path, monkeypatch, ignore_range):
    when_streams_start(monkeypatch, lambda: (setattr(served, "fault", cut_once(SHARDS, 50_000)),
                                             setattr(served, "ignore_range", ignore_range)))
    out = tmp_path / "streamed"
    convert(REPO, str(out), "fp8_block", stream=True, shard_size="1MB")
    ref = downloaded(tiny_ckpt, tmp_path, monkeypatch, "fp8_block", shard_size="1MB")
    assert same_files(out, ref) == []
    for s in SHARDS:  # the header read, the stream, and the stream again from byte 50000
        assert f"bytes=50000-{(tiny_ckpt / s).stat().st_size - 1}" in shard_gets(served, s)


@pytest.mark.slow
def test_a_server_that_ignores_range_streams_each_shard_whole(served, tiny_ckpt, tmp_path, monkeypatch):
    when_streams_start(monkeypatch, lambda: setattr(served, "ignore_range", True))
    out = tmp_path / "streamed"
    convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", max_memory="1MiB")  # re-reads by range too
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []


@pytest.mark.slow
def test_a_5xx_and_a_stall_are_asked_again(served, tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(http_range, "STALL_SECONDS", 2.0)  # a loaded machine's pauses stay shorter than this
    stalled, asked_again = set(), threading.Event()

    def stall(name, start, part):
        if name == SHARDS[1] and name not in stalled:
            stalled.add(name)
            asked_again.wait(60)  # silent until the client gives up on this answer and asks again
        elif name == SHARDS[1]:
            asked_again.set()
        return part

    when_streams_start(monkeypatch, lambda: (served.errors.update({SHARDS[0]: [503, 502]}),
                                             setattr(served, "fault", stall)))
    out = tmp_path / "streamed"
    convert(REPO, str(out), "bf16", stream=True, shard_size="1MB")
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert len(shard_gets(served, SHARDS[0])) == 4 and len(shard_gets(served, SHARDS[1])) == 3


def test_retries_are_bounded_and_resume_fetches_only_what_kept_shards_do_not_cover(served, tiny_ckpt, tmp_path,
                                                                                    monkeypatch):
    """A shard whose every answer drops at its first byte fails the run after RETRIES attempts, naming it (as a
    kill would, the run stops: shards verified so far stay recorded); --resume then keeps those shards and
    fetches only the source shards the rest needs."""
    late, written = SHARDS[3], first_written_shard(monkeypatch)

    def drop(name, start, part):  # answers from the first shard recorded as written on: the rest at once
        if name != late:
            return part
        written.wait(60)
        return part[:0]

    when_streams_start(monkeypatch, lambda: setattr(served, "fault", drop))
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"^org/tiny-v4/{late}@c{{40}}: reading bytes 0-\d+ from the Hub failed "
                                         rf"{http_range.RETRIES} times \(the answer ended at byte 0 of \d+\)"):
        convert(REPO, str(out), "bf16", stream=True, shard_size="1MB")
    m = json.loads((out / "fimoe-manifest.json").read_text())
    verified = {f for f, r in m["source"]["files"].items() if f in SHARDS and r["sha256"]}
    kept = [f for f, st in m["status"].items() if st == "written"]
    assert kept and late not in verified
    monkeypatch.undo()  # a healthy Hub for the resume
    served.fault = None
    served.requests.clear()
    point_hf_at(served.url, monkeypatch, tmp_path / "cache", token=None)
    res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", resume=True)
    assert res.shards_kept == len(kept)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert res.bytes_fetched < sum((tiny_ckpt / s).stat().st_size for s in SHARDS)
    streamed = {s for s in SHARDS if any(r and r.startswith("bytes=0-") and not r.endswith("-1048575")
                                         for r in shard_gets(served, s))}
    assert late in streamed and streamed < set(SHARDS)


def test_stream_flags_are_refused_before_anything_is_read(tiny_ckpt, tmp_path):
    with pytest.raises(UsageError, match=r"^--stream: SRC '.*' is a local path; --stream reads a Hub repo"):
        convert(str(tiny_ckpt), str(tmp_path / "out"), stream=True)
    with pytest.raises(UsageError, match=r"^--stream reads the shards from the Hub, and --offline"):
        convert(REPO, str(tmp_path / "out"), stream=True, offline=True)
    with pytest.raises(UsageError, match=r"^--upload-repo 'no-namespace': expected NAMESPACE/NAME"):
        convert(str(tiny_ckpt), str(tmp_path / "out"), upload_repo="no-namespace")
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(tmp_path / "out"), "--stream"])
    assert r.exit_code == 2 and "error: --stream: SRC" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_upload_repo_publishes_the_verified_output(hub, tiny_ckpt, tmp_path):  # noqa: F811
    # 7MB: the tiny fixture's 16.3 MB of BF16 output in 3 shards
    out = tmp_path / "out"
    res = convert(str(tiny_ckpt), str(out), "bf16", shard_size="7MB", upload_repo="fimoe-test/tiny-bf16")
    assert res.upload.url == f"{hub.url}/fimoe-test/tiny-bf16" and res.upload.files == 10
    assert arrived(hub, "fimoe-test/tiny-bf16") == expected_files(out)
    assert hashlib.sha256((out / "fimoe-manifest.json").read_bytes()).hexdigest() == hashlib.sha256(
        arrived(hub, "fimoe-test/tiny-bf16")["fimoe-manifest.json"]).hexdigest()


@pytest.mark.slow
def test_a_killed_stream_resumes_keeping_its_finished_shards(served, tiny_ckpt, tmp_path, monkeypatch):
    """SIGKILL while the last source shard streams (its answer stalls): the shards recorded as finished are kept
    by --resume, which streams only the source shards the others need."""
    import signal

    late = SHARDS[3]
    size = (tiny_ckpt / late).stat().st_size
    released = threading.Event()  # the stalled answer ends once the run is killed
    served.fault = lambda name, start, part: (released.wait(60), part)[1] if (name, len(part)) == (late, size) else part
    out = tmp_path / "out"
    env = {**os.environ, "HF_ENDPOINT": served.url, "FIMOE_DEBUG": ""}
    proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", REPO, str(out), "--stream", "--shard-size", "1MB",
                             "-q"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    manifest = out / "fimoe-manifest.json"
    # Until the other source shards are verified and the shards recorded as written stop growing: the lane waits for
    # `late`, which stalls for 60 s. No event says so from the child process: the written set still for 3 s does.
    deadline, written, still_since = time.monotonic() + 120, None, time.monotonic()
    while time.monotonic() < deadline:
        m = json.loads(manifest.read_text()) if manifest.exists() else {"source": {"files": {}}, "status": {}}
        hashed = all((m["source"]["files"].get(s) or {}).get("sha256") for s in SHARDS[:3])
        now = {f for f, st in m["status"].items() if st == "written"}
        if now != written:
            written, still_since = now, time.monotonic()
        elif hashed and written and time.monotonic() - still_since > 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    released.set()
    kept = [f for f, st in json.loads(manifest.read_text())["status"].items() if st == "written"]
    assert kept, proc.stderr.read()
    served.fault = None
    served.requests.clear()
    res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", resume=True)
    assert res.shards_kept == len(kept)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert verify(str(out)).problems == []
    streamed = {s for s in SHARDS if f"bytes=0-{(tiny_ckpt / s).stat().st_size - 1}" in shard_gets(served, s)}
    assert late in streamed and streamed < set(SHARDS), streamed


def test_cli_flags_reach_the_library(served, tiny_ckpt, tmp_path):
    r = CliRunner().invoke(main, [REPO, str(tmp_path / "out"), "--stream", "--target", "fp8_block", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output[r.output.index("{"):])
    assert got["bytes_fetched"] == sum((tiny_ckpt / s).stat().st_size for s in SHARDS) and got["upload"] is None


@pytest.mark.slow
def test_cli_upload_repo_prints_where_it_went(hub, tiny_ckpt, tmp_path):  # noqa: F811
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(tmp_path / "out"), "--upload-repo", "fimoe-test/tiny-bf16"])
    assert r.exit_code == 0, r.output
    assert re.search(rf"^uploaded 8 files, .* -> {re.escape(hub.url)}/fimoe-test/tiny-bf16$", r.output, re.M), r.output


@pytest.fixture
def one_hub(served, monkeypatch, tmp_path):
    """`served` answering uploads too, at the same endpoint (as the real Hub does): the source repo's reads are its
    own, every other request goes to a FakeHub. A token to write with; plain LFS; nothing beyond loopback."""
    uploads = FakeHub()
    uploads.server.server_close()  # its own server is never started: `served` answers for it
    uploads.url, served.other = served.url, uploads
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    real_getaddrinfo, asked = socket.getaddrinfo, []

    def loopback_only(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost", "::1"):
            asked.append(str(host))
            raise OSError(f"no network beyond loopback (asked for {host})")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)
    yield uploads
    assert asked == []


@pytest.mark.slow
def test_stream_and_upload_repo_in_one_run(one_hub, served, tiny_ckpt, tmp_path, monkeypatch):
    """`--stream --upload-repo` on one Hub endpoint: SRC's shards stream in (none on disk), and the repo receives
    exactly OUT's files, byte for byte, which are the conversion of the downloaded repo."""
    out, dest = tmp_path / "out", "fimoe-test/tiny-v4-bf16"
    r = CliRunner().invoke(main, [REPO, str(out), "--stream", "--upload-repo", dest, "--shard-size", "7MB", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output[r.output.index("{"):])
    assert got["upload"]["url"] == f"{served.url}/{dest}" and got["upload"]["files"] == len(expected_files(out))
    assert arrived(one_hub, dest) == expected_files(out)
    assert got["bytes_fetched"] == sum((tiny_ckpt / s).stat().st_size for s in SHARDS)
    assert not list((tmp_path / "cache").rglob("*.safetensors"))
    ref = downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="7MB")  # by the library: no command line
    assert same_files(out, ref) == ["README.md", "fimoe-manifest.json"]  # the card shows the CLI's command
    assert all(q["auth"] == f"Bearer {TOKEN}" for q in one_hub.requests if "/lfs-storage/" not in q["path"])
