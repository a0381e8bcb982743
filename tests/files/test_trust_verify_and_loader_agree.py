"""Trust boundary, fourth pass: what verify passes, the loader loads, and what the loader refuses, verify refuses;
a structure that names one tensor over and over; shard headers and manifests edited consistently."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from test_stream import served  # noqa: F401 - a fake Hub serving the tiny checkpoint

import fimoe_convert.runtime.loader as loader
from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError

MEGAMOE = "megamoe_sm90_mxfp4"


@pytest.fixture(scope="module")
def mega_out(tiny_ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mega") / "out"
    convert(str(tiny_ckpt), str(out), MEGAMOE)
    return out


@pytest.fixture
def mega(mega_out, tmp_path) -> Path:
    return Path(shutil.copytree(mega_out, tmp_path / "out"))


def edit_manifest(out: Path, edit) -> None:
    path = out / "fimoe-manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def first_block(data: dict) -> dict:
    return data["layers"]["layers.0"]["0"]


def test_the_loader_reads_each_tensor_once_however_often_it_is_named(mega, monkeypatch):
    edit_manifest(mega, lambda d: first_block(d)["structure"]["tuple"].append(first_block(d)["structure"]["tuple"][0]))
    assert verify(str(mega)).problems == []
    read = []
    real = loader.read_output_tensors
    monkeypatch.setattr(loader, "read_output_tensors", lambda out, names, device="cpu": (read.extend(names),
                                                                                         real(out, names, device))[1])
    got = loader.load_transformed_weights(mega, "layers.0")
    assert len(got) == 5 and got[4].data_ptr() == got[0].data_ptr()  # one read, one buffer
    assert sorted(read) == sorted(set(read)) and len(read) == 4


def test_a_structure_naming_one_tensor_over_and_over_is_refused_by_verify_and_the_loader(mega, monkeypatch):
    def repeat(d):
        node = first_block(d)["structure"]["tuple"][0]  # 557,056 bytes: 8 experts of l1, 69,632 each
        first_block(d)["structure"]["tuple"] = [node] * 30

    edit_manifest(mega, repeat)
    want = (r"block 'layers\.0' rank 0: structure: its tensor nodes come to 16711680 bytes, more than the \d+ tensor "
            r"bytes of the 1 shard\(s\) they name; a tensor is named over and over")
    problems = verify(str(mega)).problems
    assert len(problems) == 1 and re.search(want, problems[0]), problems
    monkeypatch.setattr(loader, "read_output_tensors", lambda *a, **k: pytest.fail("read before the check"))
    with pytest.raises(InputError, match=want):
        loader.load_transformed_weights(mega, "layers.0")


DAMAGED_RANKS = {  # a change of the `layers` records of a megamoe output -> {(block, rank): the problem}
    "structure-a-string": (lambda d: first_block(d).update(structure="tuple"),
                           {("layers.0", 0): r"structure is 'tuple'; expected an object with the keys none \| "}),
    "experts-missing": (lambda d: first_block(d).pop("experts"), {("layers.0", 0): r"experts is missing"}),
    "rank-a-list": (lambda d: d["layers"]["layers.0"].update({"1": []}),
                    {("layers.0", 1): r"the record is a list \(0 items\); expected an object"}),
    "two-blocks-at-once": (lambda d: [d["layers"][b]["0"]["structure"]["tuple"][0].update(shape=[-1])
                                      for b in ("layers.0", "layers.1")],
                           {(b, 0): r"structure\.tuple\[0\]\.shape\[0\] is -1; expected an integer"
                            for b in ("layers.0", "layers.1")}),
}


@pytest.mark.parametrize("case", DAMAGED_RANKS)
def test_a_damaged_rank_record_is_one_problem_of_verify_and_refused_by_the_loader(mega, case):
    from fimoe_convert.files.output.manifest import read_manifest
    from fimoe_convert.inspection import inspect

    change, want = DAMAGED_RANKS[case]
    edit_manifest(mega, change)
    before = (mega / "fimoe-manifest.json").read_bytes()
    read_manifest(mega, require_complete=True)  # the rest of the manifest is still read
    assert inspect(str(mega)).complete
    problems = verify(str(mega)).problems
    assert len(problems) == len(want), problems
    for problem, ((block, rank), match) in zip(problems, sorted(want.items())):
        assert f"block {block!r} rank {rank}: " in problem and re.search(match, problem), problem
    for (block, rank), match in want.items():
        with pytest.raises(InputError, match=rf"block {re.escape(repr(block))} rank {rank}: .*{match}"):
            loader.load_transformed_weights(mega, block, rank)
    assert (mega / "fimoe-manifest.json").read_bytes() == before


def drop_last_shard(out: Path, renumber: bool) -> None:
    """Remove the last shard and every record of it (index, total_size, manifest): a consistent edit; with
    `renumber`, the others renamed model-I-of-(N-1) everywhere too."""
    import hashlib

    from fimoe_convert.files.safetensors.header import read_header

    shards = sorted(out.glob("model-*.safetensors"))
    last = shards[-1]
    names = {s.name: (s.name.replace(f"-of-{len(shards):05d}", f"-of-{len(shards) - 1:05d}") if renumber else s.name)
             for s in shards[:-1]}
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["metadata"]["total_size"] -= sum(i.nbytes for i in read_header(last).tensors.values())
    index["weight_map"] = {n: names[f] for n, f in index["weight_map"].items() if f != last.name}
    index_path.write_text(json.dumps(index))
    last.unlink()
    for old, new in names.items():
        (out / old).rename(out / new)

    def forget(d):
        d["files"].pop(last.name)
        d["status"].pop(last.name, None)
        d["files"] = {names.get(k, k): v for k, v in d["files"].items()}
        d["status"] = {names.get(k, k): v for k, v in d["status"].items()}
        d["files"][index_path.name] = {**d["files"][index_path.name], "size": index_path.stat().st_size,
                                       "sha256": hashlib.sha256(index_path.read_bytes()).hexdigest()}

    edit_manifest(out, forget)


def test_a_shard_dropped_with_its_records_is_found_by_its_numbering(bf16_out_of, tmp_path):
    out = Path(shutil.copytree(bf16_out_of("7MB"), tmp_path / "out"))
    drop_last_shard(out, renumber=False)
    problems = verify(str(out)).problems
    assert len(problems) == 1 and re.search(r"fimoe-manifest\.json: lists 2 shards named model-I-of-N, numbered "
                                            r"\[1, 2\], for N = \[3\]; a shard is missing", problems[0]), problems


def test_deep_verify_re_derives_the_set_of_tensors_from_the_source(bf16_out_of, tiny_ckpt, tmp_path):
    out = Path(shutil.copytree(bf16_out_of("7MB"), tmp_path / "out"))
    drop_last_shard(out, renumber=True)
    assert verify(str(out)).problems == []  # consistent records, numbered 1 to N: only the source can tell
    problems = verify(str(out), deep=True, src=str(tiny_ckpt)).problems
    want = (r"model\.safetensors\.index\.json: holds \d+ tensors, a conversion of the source with the manifest's "
            r"options gives \d+ \(missing \d+, e\.g\. '[^']+'; in another shard \d+, e\.g\. '[^']+'\); the manifest "
            r"is damaged")
    assert len(problems) == 1 and re.search(want, problems[0]), problems


def test_a_complete_manifest_with_an_empty_status_is_refused(bf16_out_of, tmp_path):
    out = Path(shutil.copytree(bf16_out_of("7MB"), tmp_path / "out"))
    edit_manifest(out, lambda d: d.update(status={}))
    problems = verify(str(out)).problems
    assert len(problems) == 1 and re.search(r"shard 'model-00001-of-00003\.safetensors' is not recorded as written, "
                                            r"yet complete is true", problems[0]), problems


# ------------------------------------------------------------------ a Hub that echoes the Authorization header

def test_a_token_echoed_by_the_hub_is_not_printed(monkeypatch):
    import threading
    from http.server import BaseHTTPRequestHandler

    from helpers.hub_files import QuietServer

    import fimoe_convert.files.sources.http_range as http_range

    token = "hf_EchoedTokenMustNotShow0123456789"

    class Echo(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps({"error": f"refused: {self.headers.get('Authorization')}"}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = QuietServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    monkeypatch.setattr(http_range, "BACKOFF_SECONDS", (0.0,))
    try:
        with pytest.raises(InputError) as e:
            http_range.read_range(f"http://127.0.0.1:{server.server_address[1]}/org/x/resolve/main/a.safetensors",
                                  0, 10, lambda pos, n: memoryview(bytearray(n)), token=token,
                                  where="org/x/a.safetensors")
    finally:
        server.shutdown()
        server.server_close()
    assert "EchoedToken" not in str(e.value) and "refused: Bearer <token>" in str(e.value), str(e.value)


# ------------------------------------------------------------------ shard headers

def test_a_shard_header_naming_a_tensor_twice_is_refused(tmp_path):
    import struct

    from fimoe_convert.files.safetensors.header import read_header

    entry = '{"dtype":"U8","shape":[4],"data_offsets":[0,4]}'
    header = ('{"w":' + entry + ',"w":' + entry + '}').encode()
    path = tmp_path / "twice.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(InputError, match=r"twice\.safetensors: header names 'w' twice; the file is corrupt"):
        read_header(path)


def retype(shard: Path, name: str, old: str, new: str) -> None:
    """Change one tensor's dtype in a shard header, keeping its length (and so every offset)."""
    import struct

    data = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    assert header[name]["dtype"] == old and len(old) == len(new)
    header[name]["dtype"] = new
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    shard.write_bytes(bytes(data[:8]) + text + bytes(data[8 + n:]))


def rehash(out: Path, rel: str) -> None:
    import hashlib

    edit_manifest(out, lambda d: d["files"][rel].update(size=(out / rel).stat().st_size,
                                                          sha256=hashlib.sha256((out / rel).read_bytes()).hexdigest()))


def test_a_retyped_shard_header_is_refused_by_verify_as_by_the_loader(mega):
    name = "layers.0.ffn.experts.ep0.l1.weight_global_scale"
    index = json.loads((mega / "model.safetensors.index.json").read_text())["weight_map"]
    retype(mega / index[name], name, "F32", "I32")
    rehash(mega, index[name])
    want = r"tensor 'layers\.0\.ffn\.experts\.ep0\.l1\.weight_global_scale' is stored as int32"
    problems = verify(str(mega)).problems
    assert len(problems) == 1 and re.search(want + r", its node says float32", problems[0]), problems
    with pytest.raises(InputError, match=want):
        loader.load_transformed_weights(mega, "layers.0")


def test_the_loader_refuses_a_shard_the_manifest_does_not_list(mega):
    index = json.loads((mega / "model.safetensors.index.json").read_text())["weight_map"]
    shard = index["layers.0.ffn.experts.ep0.l1.weight"]
    edit_manifest(mega, lambda d: d["files"].pop(shard))
    assert verify(str(mega)).problems
    with pytest.raises(InputError, match=rf"places its tensors in '{shard}', which the manifest does not list"):
        loader.load_transformed_weights(mega, "layers.0")


# ------------------------------------------------------------------ --config

def test_a_config_path_to_a_missing_file_is_not_the_shipped_preset(tmp_path):
    from click.testing import CliRunner

    from fimoe_convert.cli import main
    from fimoe_convert.files.preset import preset_names

    name = preset_names()[0]
    r = CliRunner().invoke(main, ["SRC", str(tmp_path / "out"), "--config", f"nodir/{name}.toml"])
    assert r.exit_code == 2, r.output
    assert f"error: --config nodir/{name}.toml: no such file; the shipped preset of that name is --config {name}" \
        in r.output


@pytest.mark.parametrize("text", ["a = " + "[" * 5000 + "]" * 5000 + "\n", "a = " + "{b = " * 5000 + "1" + "}" * 5000],
                         ids=["arrays", "inline-tables"])
def test_a_preset_nested_thousands_deep_is_one_usage_line(tmp_path, text):
    from click.testing import CliRunner

    from fimoe_convert.cli import main

    path = tmp_path / "deep.toml"
    path.write_text(text)
    r = CliRunner().invoke(main, ["SRC", str(tmp_path / "out"), "--config", str(path)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --config {path}: "), r.output


def test_verify_racing_a_rewrite_of_out_says_so(bf16_out_of, tmp_path, monkeypatch):
    from click.testing import CliRunner

    import fimoe_convert.files.hashing as hashing
    from fimoe_convert.cli import main

    out = Path(shutil.copytree(bf16_out_of("7MB"), tmp_path / "out"))
    real = hashing.hash_files

    def overwritten_meanwhile(paths, progress=None, threads=None):
        paths[0].unlink()  # what --overwrite does first, after verify listed the files
        return real(paths, progress, threads)

    monkeypatch.setattr(hashing, "hash_files", overwritten_meanwhile)
    r = CliRunner().invoke(main, ["verify", str(out)])
    assert r.exit_code == 1
    assert re.search(r"^error: .*: vanished while OUT was verified; a conversion into .* is running or just ran",
                     r.output, re.M), r.output


# ------------------------------------------------------------------ a Hub file list naming a path outside the repo

@pytest.mark.parametrize("bad", ["../x.json", "/x.json"])
def test_a_hub_file_list_naming_a_path_outside_the_repo_is_one_line(tiny_ckpt, tmp_path, monkeypatch, bad):
    import hashlib

    from helpers.hub_files import HubFiles, point_hf_at

    from fimoe_convert.files.sources.stream import open_streamed

    repo, commit = "org/tiny-v4", "e" * 40
    with HubFiles(repo, tiny_ckpt, commit) as hub:
        def tree(h):  # the real listing, plus one entry whose path leaves the repo
            entries = [{"type": "file", "path": p.name, "size": p.stat().st_size,
                        "oid": hashlib.sha1(b"blob %d\0" % p.stat().st_size + p.read_bytes()).hexdigest(),
                        **({"lfs": {"oid": hashlib.sha256(p.read_bytes()).hexdigest(), "size": p.stat().st_size,
                                    "pointerSize": 134}} if p.suffix == ".safetensors" else {})}
                       for p in sorted(tiny_ckpt.iterdir()) if p.is_file()]
            entries.append({"type": "file", "path": bad, "size": 2, "oid": "0" * 40})
            payload = json.dumps(entries).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)

        hub._tree = tree
        point_hf_at(hub.url, monkeypatch, tmp_path / "cache", token=None)
        want = r"^SRC 'org/tiny-v4': the Hub's file list names a path outside the repo \(.*" + re.escape(repr(bad))
        with pytest.raises(InputError, match=want):
            open_streamed(repo, None)
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "cache" / "x.json").exists()


# ------------------------------------------------------------------ --stream: the header read and the header streamed

def test_a_streamed_header_other_than_the_planned_one_is_refused(served, tmp_path):  # noqa: F811
    """The Hub answers the header read (the first MB) with w1 and w3 of one expert swapped, and the stream with the
    file it records: the plan would cut each from the other's bytes."""
    from test_stream import REPO

    shard = "model-00001-of-00004.safetensors"  # over the 1 MB of the header read
    size = (served.folder / shard).stat().st_size

    def swapped_in_the_header_read(name, start, part):
        if name != shard or len(part) == size:
            return part
        a, b = b"layers.0.ffn.experts.0.w1.weight", b"layers.0.ffn.experts.0.w3.weight"
        return part.replace(a, b"\0" * len(a)).replace(b, a).replace(b"\0" * len(a), b)

    served.fault = swapped_in_the_header_read
    want = (rf"{REPO}/{shard}@c{{40}}: the header streamed differs from the one read to plan the conversion "
            r"\(e\.g\. \['layers\.0\.ffn\.experts\.0\.w[13]\.weight'\]")
    with pytest.raises(InputError, match=want):
        convert(REPO, str(tmp_path / "out"), "bf16", stream=True)


# ------------------------------------------------------------------ a signal during the first request to the Hub

@pytest.mark.parametrize("args", [lambda t: ["inspect", "org/tiny-v4"], lambda t: ["org/tiny-v4", str(t / "out")],
                                  lambda t: ["org/tiny-v4", str(t / "out"), "--stream"]],
                         ids=["inspect", "convert", "stream"])
def test_sigterm_during_a_stalled_first_request_ends_the_command_at_once(tmp_path, args):
    import signal
    import socket
    import subprocess
    import sys
    import threading
    import time

    from test_reliability import child_env

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    asked = threading.Event()
    held = []

    def accept():  # take the connection, read the request, answer nothing
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            conn.recv(65536)
            asked.set()

    threading.Thread(target=accept, daemon=True).start()
    env = child_env(HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}", HF_HUB_CACHE=str(tmp_path / "cache"),
                    HF_HUB_DISABLE_TELEMETRY="1", HF_TOKEN="", FIMOE_DEBUG="", HF_HUB_OFFLINE=None)
    proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", *args(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert asked.wait(60), "the HEAD never came"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        server.close()
        for c in held:
            c.close()
    assert proc.returncode == 128 + signal.SIGTERM, err
    # the exit takes ~0.01 s; 3 s leaves room for a 2-core machine under load, below the HEAD's own timeout (5 s)
    assert took < 3.0, took
    assert err.strip().splitlines()[-1].startswith("error: interrupted (SIGTERM)"), err
