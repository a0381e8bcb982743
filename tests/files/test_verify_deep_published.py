"""`verify ORG/NAME --deep`: a conversion published on the Hub re-derived in part from its Hub source, both read by
range from a fake Hub that serves the two repos (the output, and the source it names)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from reference import HUB_COMMIT, HUB_REPO

from fimoe_convert import convert, verify
from fimoe_convert.cli import main
from fimoe_convert.errors import InputError, UsageError
from fimoe_convert.testing import make_checkpoint, seed_hub_cache

PUBLISHED, PUBLISHED_COMMIT = "fimoe-test/published-deep", "e" * 40
KERNEL = "megamoe_sm90_mxfp4"  # a kernel target the CPU converts (FlashInfer's transform on the host)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """The tiny checkpoint with 32 experts a block in 2 shards: each shard (7 MB, 11 MB) well past the 1 MiB that a
    header read asks for, so that a shard sent whole is told from a header and some ranges."""
    return make_checkpoint(tmp_path_factory.mktemp("deep-src") / "ckpt", "tiny", experts=32, shards=2)


@pytest.fixture(scope="module")
def outputs(ckpt, tmp_path_factory):
    """{target: an OUT converted from HUB_REPO@HUB_COMMIT}, each made once (read-only: copy before damaging)."""
    base = tmp_path_factory.mktemp("deep")
    seed_hub_cache(ckpt, base / "cache", HUB_REPO, HUB_COMMIT)
    made: dict[str, Path] = {}

    def get(target: str) -> Path:
        if target not in made:
            import os

            before = os.environ.get("HF_HUB_CACHE")
            os.environ["HF_HUB_CACHE"] = str(base / "cache")
            try:
                kw = {"ep_size": 2} if target == KERNEL else {}
                convert(HUB_REPO, str(base / target), target, offline=True, shard_size="2MB", **kw)
            finally:
                if before is None:
                    os.environ.pop("HF_HUB_CACHE", None)
                else:
                    os.environ["HF_HUB_CACHE"] = before
            made[target] = base / target
        return made[target]

    return get


class Hubs:
    """The output repo and the source repo on one fake Hub endpoint (the output's server passes the rest on)."""

    def __init__(self, out_hub, src_hub):
        self.out, self.src = out_hub, src_hub

    def _handle(self, h) -> None:
        self.src._serve(h, body=h.command == "GET")


@pytest.fixture
def serve(outputs, ckpt, tmp_path, monkeypatch):
    """`serve(target)`: that target's OUT published as PUBLISHED@PUBLISHED_COMMIT, the tiny checkpoint as
    HUB_REPO@HUB_COMMIT (`ckpt`), on one fake Hub, with an empty Hugging Face cache (nothing of either is here)."""
    import contextlib

    from helpers.hub_files import HubFiles, point_hf_at

    stack = contextlib.ExitStack()

    def start(target: str, edit=None, edit_source=None) -> Hubs:
        folder = Path(shutil.copytree(outputs(target), tmp_path / "published"))
        if edit:
            edit(folder)
        src = Path(shutil.copytree(ckpt, tmp_path / "src"))
        if edit_source:
            edit_source(src)
        src_hub = stack.enter_context(HubFiles(HUB_REPO, src, HUB_COMMIT))
        out_hub = stack.enter_context(HubFiles(PUBLISHED, folder, PUBLISHED_COMMIT))
        hubs = Hubs(out_hub, src_hub)
        out_hub.other = hubs
        point_hf_at(out_hub.url, monkeypatch, tmp_path / "empty-cache")
        return hubs

    with stack:
        yield start


def shard_bytes(hub) -> dict[str, dict[str, int]]:
    """{shard: {"size": its bytes, "sent": bytes the server sent of it, "ranged": of those, to requests that did not
    start at byte 0 (a header is read from byte 0, 1 MiB at once; tensors by their offsets), "largest": the most
    one of those got}} for every shard of `hub`'s repo."""
    out = {}
    for f in sorted(hub.folder.glob("*.safetensors")):
        size = f.stat().st_size
        sent = ranged = largest = 0
        for method, path, rng in hub.requests:
            if method != "GET" or not path.endswith("/" + f.name):
                continue
            start, end = (int(x) for x in re.fullmatch(r"bytes=(\d+)-(\d+)", rng).groups())
            n = min(end, size - 1) - start + 1
            sent += n
            if start:
                ranged, largest = ranged + n, max(largest, n)
        out[f.name] = {"size": size, "sent": sent, "ranged": ranged, "largest": largest}
    return out


@pytest.mark.parametrize("target", ["bf16", KERNEL])
def test_deep_verify_of_a_published_conversion_reads_no_whole_shard(serve, target):
    if target == KERNEL:
        pytest.importorskip("flashinfer.megamoe")
    hubs = serve(target)
    r = verify(PUBLISHED, deep=True)
    assert r.problems == [] and r.source == f"{HUB_REPO}@{HUB_COMMIT}" and r.revision == PUBLISHED_COMMIT
    assert r.deep_checked >= 8 and r.copies_checked >= 2
    for hub in (hubs.out, hubs.src):
        shards = shard_bytes(hub)
        assert all(s["largest"] < s["size"] and s["ranged"] < s["size"] for s in shards.values()), shards
        assert sum(s["ranged"] for s in shards.values()) < sum(s["size"] for s in shards.values()), shards
        if target == "bf16":  # headers included; the kernel target's toy output has 16 units, most of them sampled
            assert sum(s["sent"] for s in shards.values()) < sum(s["size"] for s in shards.values()), shards
    assert r.range_bytes == sum(s["ranged"] for hub in (hubs.out, hubs.src) for s in shard_bytes(hub).values())
    if target == KERNEL:
        return  # the line below is the same for every target
    res = CliRunner().invoke(main, ["verify", PUBLISHED, "--deep"])
    assert res.exit_code == 0, res.output
    assert re.search(rf"\nok: {r.deep_checked} units re-derived from {HUB_REPO}@{HUB_COMMIT}, byte-identical, and "
                     rf"{r.copies_checked} copied tensors; {r.files} files' sha256 \([0-9.]+ [kM]B\) match the "
                     r"manifest, from the Hub's records; the [0-9.]+ [kM]B read by range were compared, not hashed "
                     r"whole\n", res.output), res.output


def _alter(tensor: str):
    """An edit of a published folder: one byte of `tensor` flipped in its shard, and the manifest's size and
    sha256 of that shard updated with it, so that the shallow check passes."""
    def edit(folder: Path) -> None:
        from fimoe_convert.files.safetensors.header import read_header

        index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
        shard = folder / index[tensor]
        info = read_header(shard).tensors[tensor]
        data = bytearray(shard.read_bytes())
        data[info.start + info.nbytes // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        manifest = json.loads((folder / "fimoe-manifest.json").read_text())
        manifest["files"][shard.name]["sha256"] = hashlib.sha256(data).hexdigest()
        (folder / "fimoe-manifest.json").write_text(json.dumps(manifest, indent=2))
    return edit


@pytest.mark.parametrize("target, tensor", [
    ("bf16", "layers.0.ffn.experts.0.w2.weight"),  # the first unit of its block kind: always in the sample
    ("bf16", None),  # the first copied tensor of layers.0, a sampled block
    (KERNEL, "layers.0.ffn.experts.ep1.l2.weight"),
], ids=["expert", "copy", "kernel"])
def test_deep_verify_names_the_altered_tensor(serve, ckpt, target, tensor):
    if target == KERNEL:
        pytest.importorskip("flashinfer.megamoe")
    if tensor is None:
        from fimoe_convert.checkpoint import parse_expert_name

        index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
        tensor = next(n for n in index if n.startswith("layers.0.") and parse_expert_name(n) is None)
    serve(target, _alter(tensor))
    assert verify(PUBLISHED).problems == []  # the shallow check: every sha256 is the manifest's
    r = verify(PUBLISHED, deep=True)
    assert len(r.problems) == 1, r.problems
    assert re.search(rf"^{PUBLISHED}@{PUBLISHED_COMMIT}/model-\d{{5}}-of-\d{{5}}\.safetensors: tensor "
                     rf"{re.escape(repr(tensor))} differs from .*{HUB_REPO}@{HUB_COMMIT}.* \(its bytes' sha256 "
                     r"(?P<got>[0-9a-f]{16})\.\.\., (?P<dtype>[A-Z0-9_]+) (?P<shape>\([0-9, ]+\)); expected "
                     r"(?!(?P=got))[0-9a-f]{16}\.\.\., (?P=dtype) (?P=shape)\); the published output is not "
                     r"an exact conversion of its source: do not load it; convert again and publish with "
                     r"`fimoe-convert upload`$",
                     r.problems[0]), r.problems
    res = CliRunner().invoke(main, ["verify", PUBLISHED, "--deep"])
    assert res.exit_code == 1 and f"tensor {tensor!r} differs" in res.output, res.output


@pytest.mark.parametrize("spec", ["ckpt", "/data/ckpt"])
def test_deep_verify_needs_a_hub_source(serve, spec):
    def local_source(folder: Path) -> None:
        manifest = json.loads((folder / "fimoe-manifest.json").read_text())
        manifest["source"].update(spec=spec, repo_id=None, revision=None)
        text = json.dumps(manifest, indent=2)
        (folder / "fimoe-manifest.json").write_text(text)

    serve("bf16", local_source)
    with pytest.raises(UsageError, match=rf"^verify {PUBLISHED} --deep: needs a Hub source pinned to a commit, and "
                                         rf"the manifest records the source as {re.escape(repr(spec))}; `hf download "
                                         rf"{PUBLISHED} --local-dir OUT`, then `fimoe-convert verify OUT --deep --src "
                                         r"SRC` with that source's folder$"):
        verify(PUBLISHED, deep=True)
    res = CliRunner().invoke(main, ["verify", PUBLISHED, "--deep"])
    assert res.exit_code == 2 and res.output.startswith(f"error: verify {PUBLISHED} --deep: needs a Hub source")
    assert len(res.output.strip().splitlines()) == 1, res.output  # said before any file is checked


def _flip_last_byte(name: str):
    def edit(folder: Path) -> None:
        path = sorted(folder.glob(name))[0]
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    return edit


@pytest.mark.parametrize("name, problem", [
    ("config.json", r"config\.json: sha256 [0-9a-f]{16}\.\.\. on the Hub, manifest says [0-9a-f]{16}\.\.\.; "),
    ("model-*.safetensors", r"model-00001-of-00002\.safetensors: sha256 [0-9a-f]{16}\.\.\. on the Hub, manifest "
                            r"says [0-9a-f]{16}\.\.\.; "),
], ids=["config", "shard"])
def test_deep_verify_refuses_a_source_that_is_not_the_one_recorded(serve, name, problem):
    hubs = serve("bf16", edit_source=_flip_last_byte(name))
    r = verify(PUBLISHED, deep=True)
    assert len(r.problems) == 1 and r.deep_checked == 0, r.problems
    assert re.search(rf"^{HUB_REPO}@{HUB_COMMIT}/{problem}the source on the Hub is not the one {PUBLISHED}@"
                     rf"{PUBLISHED_COMMIT}'s manifest records: do not load", r.problems[0]), r.problems
    assert all(s["ranged"] == 0 for s in shard_bytes(hubs.src).values())  # no tensor read from it


def test_deep_verify_of_a_hub_output_takes_no_src():
    with pytest.raises(UsageError, match=rf"^--src other/ckpt: verify {PUBLISHED} --deep re-derives from the Hub "
                                         r"source its manifest records; to use another copy, `hf download "):
        verify(PUBLISHED, deep=True, src="other/ckpt")


def test_deep_verify_refuses_options_no_conversion_takes(serve):
    def ep_size_3(folder: Path) -> None:
        manifest = json.loads((folder / "fimoe-manifest.json").read_text())
        manifest["options"]["ep_size"] = 3
        (folder / "fimoe-manifest.json").write_text(json.dumps(manifest, indent=2))

    hubs = serve("bf16", ep_size_3)
    with pytest.raises(InputError, match=rf"^verify {PUBLISHED} --deep: the conversion {PUBLISHED}@{PUBLISHED_COMMIT}/"
                                         r"fimoe-manifest\.json records \(target 'bf16', EP size 3\) cannot be re-run "
                                         r"here on the CPU: --ep-size 3: must divide the 32 routed experts"):
        verify(PUBLISHED, deep=True)
    assert all(s["ranged"] == 0 for hub in (hubs.out, hubs.src) for s in shard_bytes(hub).values())
