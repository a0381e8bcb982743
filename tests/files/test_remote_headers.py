"""`inspect` and `--dry-run` of a Hub repo id read config.json, the index and each shard's header from the Hub, and
no weights. A fake Hub on 127.0.0.1 (tests/helpers/hub_files.py) serves the tiny checkpoint; the CLI runs
as a user runs it, in a process of its own pointed there by HF_ENDPOINT."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
from helpers.hub_files import HubFiles

from fimoe_convert.files.sources.hub import FIRST_BYTES

REPO, COMMIT = "org/tiny-v4", "c" * 40


def cli(hub, cache, *args):
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_TOKEN": "", "FIMOE_DEBUG": ""}
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "fimoe_convert", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


def local(*args):
    return subprocess.run([sys.executable, "-m", "fimoe_convert", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def header_end(path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def assert_no_weights_fetched(hub, folder, cache):
    """No shard was downloaded: every GET of a shard asked for a range within its first request or its header."""
    shard_gets = [(p, r) for m, p, r in hub.requests if m == "GET" and p.endswith(".safetensors")]
    assert shard_gets, hub.requests
    for path, rng in shard_gets:
        start, end = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups())
        assert end < max(FIRST_BYTES, header_end(folder / path.rsplit("/", 1)[1])), (path, rng)
    assert not list(cache.rglob("*.safetensors")), list(cache.rglob("*"))


@pytest.mark.slow
def test_inspect_of_a_hub_repo_reads_headers_not_weights(tiny_ckpt, tmp_path):
    cache = tmp_path / "cache"
    want = json.loads(local("inspect", tiny_ckpt, "--json").stdout)
    with HubFiles(REPO, tiny_ckpt, COMMIT) as hub:
        r = cli(hub, cache, "inspect", REPO, "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert_no_weights_fetched(hub, tiny_ckpt, cache)
        text = cli(hub, cache, "inspect", REPO)
    for key in ("variant", "model", "shards", "tensors", "bytes", "routed_expert_bytes", "tensor_classes", "targets"):
        assert got[key] == want[key], key
    assert got["revision"] == COMMIT and got["headers_from_hub"] == want["shards"] == 4
    assert text.returncode == 0 and re.search(r"^4 shards, 339 tensors, .*; 4 shard headers read from the Hub, no "
                                              r"weights downloaded$", text.stdout, re.M), text.stdout


@pytest.mark.slow
@pytest.mark.parametrize("target", ["bf16", "fp8_block"])
def test_dry_run_of_a_hub_repo_plans_as_a_local_one_without_the_weights(tiny_ckpt, tmp_path, target):
    cache = tmp_path / "cache"
    want = json.loads(local(tiny_ckpt, tmp_path / "a", "--target", target, "--dry-run", "--json").stdout)
    with HubFiles(REPO, tiny_ckpt, COMMIT) as hub:
        r = cli(hub, cache, REPO, tmp_path / "b", "--target", target, "--dry-run", "--json")
        assert r.returncode == 0, r.stderr
        assert_no_weights_fetched(hub, tiny_ckpt, cache)
    got = json.loads(r.stdout)
    for key in ("plan", "shards", "bytes_read", "bytes_written"):
        assert got[key] == want[key], key
    assert re.fullmatch(
        r"ETA: converting takes about \d+ s after the download of 7\.05 MB \(estimate: \d+ sample units of zeros "
        r"with the checkpoint's shapes converted on cpu, the largest \S+, [0-9.]+ \w?B in [0-9.]+ m?s; the weights "
        r"are not in the local cache, so neither the download nor the read rate is measured\)",
        got["estimate"],
    ), got["estimate"]
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_shards_already_in_the_cache_are_read_there(tiny_ckpt, tmp_path):
    """A download that stopped halfway: the shards in the snapshot folder are described from the disk, only the
    others from the Hub."""
    cache = tmp_path / "cache"
    with HubFiles(REPO, tiny_ckpt, COMMIT) as hub:
        assert cli(hub, cache, "inspect", REPO).returncode == 0
        snap = cache / "models--org--tiny-v4" / "snapshots" / COMMIT
        shutil.copy(tiny_ckpt / "model-00002-of-00004.safetensors", snap)
        hub.requests.clear()
        r = cli(hub, cache, "inspect", REPO, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["headers_from_hub"] == 3
    asked = {p.rsplit("/", 1)[1] for m, p, _ in hub.requests if m == "GET" and p.endswith(".safetensors")}
    assert asked == {f"model-0000{i}-of-00004.safetensors" for i in (1, 3, 4)}


def _truncate(folder):
    (folder / "model-00003-of-00004.safetensors").write_bytes(b"\x10\x00")


def _bad_header_length(folder):
    p = folder / "model-00003-of-00004.safetensors"
    p.write_bytes(struct.pack("<Q", 10**12) + p.read_bytes()[8:])


def _missing(folder):
    (folder / "model-00003-of-00004.safetensors").unlink()


def _offsets_past_the_end(folder):
    p = folder / "model-00003-of-00004.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:len(data) - 4])  # the header promises 4 bytes more than the file holds


@pytest.mark.slow
@pytest.mark.parametrize("damage, match", [
    (_truncate, r"^error: org/tiny-v4/model-00003-of-00004\.safetensors@c{40}: 2 bytes, too short for a safetensors "
                r"header"),
    (_bad_header_length, r"^error: org/tiny-v4/model-00003-of-00004\.safetensors@c{40}: .*header"),
    (_missing, r"^error: org/tiny-v4/model-00003-of-00004\.safetensors@c{40}: the Hub refused bytes 0-1048575 "
               r"\(HTTP 404 EntryNotFound"),
    (_offsets_past_the_end, r"^error: org/tiny-v4/model-00003-of-00004\.safetensors@c{40}: "),
])
def test_a_bad_shard_on_the_hub_is_one_line_naming_it(tiny_ckpt, tmp_path, damage, match):
    served = tmp_path / "served"
    shutil.copytree(tiny_ckpt, served)
    damage(served)
    with HubFiles(REPO, served, COMMIT) as hub:
        r = cli(hub, tmp_path / "cache", "inspect", REPO)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and re.search(match, r.stderr), r.stderr



@pytest.mark.parametrize("ignore_range", [False, True])
@pytest.mark.parametrize("start, end", [(0, 7), (0, 99), (8, 1000), (5000, 5000), (1000, 10**9)])
def test_a_ranged_read_returns_those_bytes_and_the_size_from_any_server(tiny_ckpt, ignore_range, start, end):
    """`read_head` gives bytes [start, end] (to the file's end) and the file's size, also when the server ignores
    Range and answers with the whole file (then it stops reading after byte `end`)."""
    from fimoe_convert.files.sources.http_range import read_head

    name = "model-00002-of-00004.safetensors"
    data = (tiny_ckpt / name).read_bytes()
    with HubFiles(REPO, tiny_ckpt, COMMIT, ignore_range=ignore_range) as hub:
        got, size = read_head(f"{hub.url}/{REPO}/resolve/{COMMIT}/{name}", start, end, None)
    assert got == data[start:end + 1] and size == len(data)


@pytest.mark.slow
def test_inspect_works_against_a_server_that_ignores_range(tiny_ckpt, tmp_path):
    want = json.loads(local("inspect", tiny_ckpt, "--json").stdout)
    with HubFiles(REPO, tiny_ckpt, COMMIT, ignore_range=True) as hub:
        r = cli(hub, tmp_path / "cache", "inspect", REPO, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert {k: got[k] for k in ("model", "tensors", "bytes", "targets")} == \
        {k: want[k] for k in ("model", "tensors", "bytes", "targets")}
