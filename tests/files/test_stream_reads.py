"""--stream's reads: chunks of each shard on several ranged connections, in the order the conversion consumes
them, against the fake Hub (tests/helpers/hub_files.py): faults on one chunk's answer, a Hub that redirects to a
storage host, and a stop while a range stalls. The reference is the same repo downloaded first."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers.hub_files import HubFiles
from test_stream import (
    COMMIT,
    REPO,
    SHARDS,
    downloaded,
    point_at,
    same_files,
    shard_gets,
    tiling,
    when_streams_start,
)

import fimoe_convert.files.sources.stream as stream
from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError, UsageError
from fimoe_convert.files.safetensors.header import read_header

CHUNK = 128 << 10  # bytes per ranged GET here: the tiny shards (0.4 to 1.6 MB) in 3 to 13 chunks
TOKEN = "hf_stream_test_token"
STOP_SECONDS = 2.0  # a stop ends the process within this, also while a range stalls


@pytest.fixture
def served(tiny_ckpt, tmp_path, monkeypatch):
    with HubFiles(REPO, tiny_ckpt, COMMIT) as h:
        yield point_at(h, tmp_path, monkeypatch)


def fresh(hub: HubFiles, fault=None) -> None:
    """As the streams start: the fake Hub's request log emptied (the header reads are not the streams'), `fault`
    armed."""
    hub.requests.clear()
    hub.fault = fault


@pytest.fixture
def chunks(monkeypatch):
    monkeypatch.setattr(stream, "CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(stream, "MIN_CHUNK_BYTES", CHUNK)


def sizes(tiny_ckpt) -> dict[str, int]:
    return {s: (tiny_ckpt / s).stat().st_size for s in SHARDS}


class AtOnce:
    """A fault: the first `n` GETs are answered only once all `n` wait (`broken` if the client never opens `n` at
    once); `most`: the most GETs seen waiting for their answer at once."""

    def __init__(self, n: int):
        self.barrier, self.first, self.lock = threading.Barrier(n, timeout=30), iter(range(n)), threading.Lock()
        self.now = self.most = 0
        self.broken = False

    def __call__(self, name, start, part):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            first = next(self.first, None) is not None
        try:
            if first:
                self.barrier.wait()
        except threading.BrokenBarrierError:
            self.broken = True
        finally:
            with self.lock:
                self.now -= 1
        return part


@pytest.mark.parametrize("connections", [1, 4, 16])
def test_connections_read_each_byte_once_in_chunks(served, chunks, tiny_ckpt, tmp_path, monkeypatch, connections):
    waits = AtOnce(connections)
    when_streams_start(monkeypatch, lambda: fresh(served, waits))
    out = tmp_path / "streamed"
    res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", connections=connections)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert waits.most == connections and not waits.broken
    for s, size in sizes(tiny_ckpt).items():  # each byte asked for once, in chunks
        gets = shard_gets(served, s)
        assert tiling(gets) == [(0, size)] and len(gets) == -(-size // CHUNK), gets
    assert res.bytes_fetched == sum(sizes(tiny_ckpt).values())


def test_a_connection_dropped_mid_range_resumes_where_it_stopped(served, chunks, tiny_ckpt, tmp_path, monkeypatch):
    """One chunk's answer (the second chunk of the first shard) drops after 50000 bytes: that chunk is asked again
    from byte 50000 of it; nothing else is asked twice."""
    dropped = []

    def drop(name, start, part):
        if name == SHARDS[0] and start == CHUNK and not dropped:
            dropped.append(start)
            return part[:50_000]
        return part

    when_streams_start(monkeypatch, lambda: fresh(served, drop))
    out = tmp_path / "streamed"
    convert(REPO, str(out), "fp8_block", stream=True, shard_size="1MB", connections=4)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "fp8_block", shard_size="1MB")) == []
    gets = shard_gets(served, SHARDS[0])
    assert dropped and f"bytes={CHUNK + 50_000}-{2 * CHUNK - 1}" in gets
    cut = [f"bytes={CHUNK}-{CHUNK + 50_000 - 1}" if g == f"bytes={CHUNK}-{2 * CHUNK - 1}" else g for g in gets]
    assert tiling(cut) == [(0, sizes(tiny_ckpt)[SHARDS[0]])], gets


def test_a_range_answered_with_other_bytes_stops_the_run_naming_the_shard(served, chunks, tiny_ckpt, tmp_path,
                                                                         monkeypatch):
    """The third shard's second chunk is answered with the bytes of its first (a 206 for the range asked, other
    bytes in it): the shard's sha256 differs from the Hub's record; nothing converted from it is kept."""
    bad = SHARDS[2]
    first = (tiny_ckpt / bad).read_bytes()[:CHUNK]

    def swap(name, start, part):
        return first[:len(part)] if name == bad and start == CHUNK else part

    when_streams_start(monkeypatch, lambda: setattr(served, "fault", swap))
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"^org/tiny-v4/{bad}@c{{40}}: the sha256 of the bytes received, "
                                         r"[0-9a-f]{16}\.\.\., differs from the Hub's record, [0-9a-f]{16}\.\.\.; "
                                         r"nothing converted from it is kept"):
        convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", connections=4)
    m = json.loads((out / "fimoe-manifest.json").read_text())
    assert m["complete"] is False and m["source"]["files"][bad]["sha256"] is None
    written = [f for f, st in m["status"].items() if st == "written"]
    assert sorted(p.name for p in out.glob("model-*.safetensors")) == sorted(written)
    ref = downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")
    assert len(written) < 9 and all((out / f).read_bytes() == (ref / f).read_bytes() for f in written)


def test_bytes_read_again_must_be_the_bytes_read_first(served, chunks, tiny_ckpt, tmp_path, monkeypatch):
    """With room for few chunks, chunks fetched for the hash before the conversion reads them are dropped and
    fetched again; a second answer that differs from the first (the file changed on the server) stops the run."""
    asked: set[tuple[str, int]] = set()

    def changed(name, start, part):
        if (name, start) in asked:
            return bytes([part[0] ^ 1]) + part[1:]
        asked.add((name, start))
        return part

    when_streams_start(monkeypatch, lambda: setattr(served, "fault", changed))
    with pytest.raises(InputError, match=r"^org/tiny-v4/model-0000\d-of-00004\.safetensors@c{40}: bytes \d+-\d+ read "
                                         r"again differ from the bytes read before; the file changed on the server"):
        convert(REPO, str(tmp_path / "out"), "bf16", stream=True, shard_size="1MB", max_memory="1MiB", connections=2)


def test_a_tight_memory_budget_fetches_again_and_converts_the_same(served, chunks, tiny_ckpt, tmp_path, monkeypatch):
    out = tmp_path / "streamed"
    res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", max_memory="1MiB", connections=2)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert res.bytes_fetched > sum(sizes(tiny_ckpt).values())


@pytest.mark.parametrize("connections", [2, 4])
def test_a_hold_of_a_shard_and_the_gets_in_flight_fetches_each_byte_once(served, chunks, tiny_ckpt, tmp_path,
                                                                         monkeypatch, connections):
    """The conversion reads each shard's tensors out of file order; a hold of about the largest shard (1.6 MB) and
    the GETs in flight is enough: with --max-memory 12MiB (a hold of 3 MiB) the Hub serves each byte once."""
    def arm():
        fresh(served)
        served.sent = 0

    when_streams_start(monkeypatch, arm)
    out = tmp_path / "streamed"
    res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", max_memory="12MiB", connections=connections)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    total = sum(sizes(tiny_ckpt).values())
    assert served.sent == res.bytes_fetched == total
    assert max(sizes(tiny_ckpt).values()) < res.bytes_held_peak <= 3 << 20
    for s, size in sizes(tiny_ckpt).items():
        assert tiling(shard_gets(served, s)) == [(0, size)]


def get_spans(hub: HubFiles, name: str) -> list[tuple[int, int]]:
    """The byte spans [a, b) of `name`'s GETs, in the order asked."""
    return [(int(a), int(b) + 1) for a, b in (re.fullmatch(r"bytes=(\d+)-(\d+)", r).groups()
                                              for r in shard_gets(hub, name))]


def test_a_dropped_piece_is_fetched_again_alone(served, chunks, tiny_ckpt, tmp_path, monkeypatch):
    """With room for few pieces, pieces cut at every tensor's end (PIECE_MIN_BYTES 1): a piece dropped to make room
    is asked again alone, not its whole chunk. Every GET is of whole pieces within one grid cell (its span starts and
    ends at tensor edges or grid points); the GETs that ask bytes again are such spans, some shorter than their
    cell; the bytes the Hub served are the bytes fetched, and the output is the downloaded conversion's."""
    monkeypatch.setattr(stream, "PIECE_MIN_BYTES", 1)

    def arm():
        fresh(served)
        served.sent = 0

    when_streams_start(monkeypatch, arm)
    out = tmp_path / "streamed"
    res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", max_memory="1MiB", connections=2)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    again, shorter = 0, 0
    for s, size in sizes(tiny_ckpt).items():
        h = read_header(tiny_ckpt / s)
        edges = {h.data_start, size, *(t.end for t in h.tensors.values()), *range(0, size, CHUNK)}
        asked = bytearray(size)  # 1: the byte was asked for before
        for a, b in get_spans(served, s):
            assert a in edges and b in edges and a // CHUNK == (b - 1) // CHUNK, (s, a, b)
            twice = sum(asked[a:b])
            again += twice
            shorter += bool(twice) and b - a < min(size, a // CHUNK * CHUNK + CHUNK) - a // CHUNK * CHUNK
            asked[a:b] = b"\x01" * (b - a)
    total = sum(sizes(tiny_ckpt).values())
    assert again and shorter and res.bytes_fetched == total + again == served.sent


@pytest.mark.parametrize("refusals", [0, 1])
def test_a_redirect_to_a_storage_host_gets_no_token(tiny_ckpt, chunks, tmp_path, monkeypatch, refusals):
    """The Hub answers a shard's resolve URL with 302 to a storage host (as for its Xet-backed files): the ranges
    are asked there, without the Hub token, which the Hub itself still receives. A refused signed URL (expired)
    is asked of the Hub again."""
    with HubFiles(REPO, tiny_ckpt, COMMIT, storage=True) as hub:
        point_at(hub, tmp_path, monkeypatch, token=TOKEN)
        when_streams_start(monkeypatch, lambda: setattr(hub, "storage_refusals", refusals))
        out = tmp_path / "streamed"
        res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", connections=4)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert res.bytes_fetched == sum(sizes(tiny_ckpt).values())
    got = [(path, rng) for path, rng, _ in hub.storage.requests if rng and not rng.startswith("bytes=0-")]
    assert got and [auth for _, _, auth in hub.storage.requests] == [None] * len(hub.storage.requests)
    assert hub.authorizations and set(hub.authorizations) == {f"Bearer {TOKEN}"}
    assert not [r for m, p, r in hub.requests if m == "GET" and p.endswith(".safetensors") and r
                and not r.startswith("bytes=0-")]  # every chunk but the first went to the storage host only


def test_connections_need_stream_and_a_count(tiny_ckpt, tmp_path):
    with pytest.raises(UsageError, match=r"^--connections 4: it sets --stream's ranged GETs at once; add --stream"):
        convert(str(tiny_ckpt), str(tmp_path / "out"), connections=4)
    with pytest.raises(UsageError, match=r"^--connections 0: expected at least 1 \(default 16\)"):
        convert(REPO, str(tmp_path / "out"), stream=True, connections=0)


def wait_for_verified(manifest, rels: list[str], proc) -> None:
    """Until OUT's manifest records `rels` as verified and an output shard as finished (the child writes it;
    polled), or the child ends."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        m = json.loads(manifest.read_text()) if manifest.exists() else {"source": {"files": {}}, "status": {}}
        if all((m["source"]["files"].get(s) or {}).get("sha256") for s in rels) and "written" in m["status"].values():
            return
        time.sleep(0.1)
    raise AssertionError(f"{rels} not verified; the child: {proc.poll()} {proc.stderr.read() if proc.poll() else ''}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_a_stalled_range_ends_at_once_and_resume_finishes(served, tiny_ckpt, tmp_path, monkeypatch,
                                                                        signum):
    """The last shard's answer stalls; the lane waits for its bytes. SIGINT or SIGTERM: the process ends within
    STOP_SECONDS (exit 128 + the signal), the shards recorded as finished are kept, and --resume completes OUT."""
    late, release = SHARDS[3], threading.Event()
    size = (tiny_ckpt / late).stat().st_size

    def stall(name, start, part):
        if name == late and start + len(part) == size:  # its last chunk, not the header read (its first MiB)
            release.wait(120)
        return part

    served.fault = stall
    out = tmp_path / "out"
    env = {**os.environ, "HF_ENDPOINT": served.url, "FIMOE_DEBUG": ""}
    proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", REPO, str(out), "--stream", "--shard-size", "1MB",
                             "-q", "--connections", "4"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for_verified(out / "fimoe-manifest.json", SHARDS[:3], proc)
        t0 = time.monotonic()
        proc.send_signal(signum)
        proc.wait(timeout=30)
        seconds = time.monotonic() - t0
    finally:
        release.set()
        proc.kill()
    err = proc.stderr.read()
    assert seconds < STOP_SECONDS and proc.returncode == 128 + signum, (seconds, proc.returncode, err)
    assert f"interrupted ({signal.Signals(signum).name})" in err, err
    m = json.loads((out / "fimoe-manifest.json").read_text())
    kept = [f for f, st in m["status"].items() if st == "written"]
    assert kept and m["source"]["files"][late]["sha256"] is None
    served.fault = None
    served.requests.clear()
    res = convert(REPO, str(out), "bf16", stream=True, shard_size="1MB", resume=True)
    assert res.shards_kept == len(kept)
    assert same_files(out, downloaded(tiny_ckpt, tmp_path, monkeypatch, "bf16", shard_size="1MB")) == []
    assert verify(str(out)).problems == []
