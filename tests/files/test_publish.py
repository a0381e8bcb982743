"""Publishing you can trust: the bytes a commit holds are the bytes that were verified, OUT stays locked while they
are sent, --upload-repo checks the token and the network before converting, a failed upload names the command that
finishes it, and `upload` takes the flags `hf upload` users reach for. Against the fake Hub of test_upload.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_upload import REPO, TOKEN, arrived, expected_files, hub  # noqa: F401 (the fixture)

import fimoe_convert.publish as publish
from fimoe_convert import convert, upload
from fimoe_convert.cli import main
from fimoe_convert.errors import InputError
from fimoe_convert.files.output.lock import OutLock


@pytest.fixture
def out_copy(bf16_out_of, tmp_path) -> Path:
    return Path(shutil.copytree(bf16_out_of("7MB"), tmp_path / "out"))


def after_verify(monkeypatch, act):
    """Run `act(out_dir)` right after upload's check of OUT, before anything is sent."""
    real = publish.upload_plan

    def plan(out, progress=None):
        found = real(out, progress)
        act(found[0])
        return found

    monkeypatch.setattr(publish, "upload_plan", plan)


SIZES = pytest.mark.parametrize("small", [None, 0], ids=["from-memory", "from-descriptor"])


def send_from_descriptor(monkeypatch, small):
    """Large files (all of them with `small` 0) are sent from their open descriptor, small ones from memory."""
    try:
        import fimoe_convert.files.output.pinned as pinned
    except ModuleNotFoundError:  # a tree without it sends every file by its name
        return
    if small is not None:
        monkeypatch.setattr(pinned, "SMALL_FILE_BYTES", small)


@SIZES
def test_a_shard_swapped_for_a_link_after_verify_is_not_sent(out_copy, hub, monkeypatch, tmp_path, small):  # noqa: F811
    send_from_descriptor(monkeypatch, small)
    outside = tmp_path / "outside.bin"

    def swap(out_dir):
        shard = sorted(out_dir.glob("model-*.safetensors"))[1]
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        outside.write_bytes(bytes(data))
        shard.unlink()
        shard.symlink_to(outside)

    after_verify(monkeypatch, swap)
    with pytest.raises(InputError, match=r"model-00002-of-00003\.safetensors: is a symbolic link; upload sends only"):
        upload(str(out_copy), REPO, endpoint=hub.url)
    assert hashlib.sha256(outside.read_bytes()).hexdigest() not in hub.lfs
    assert REPO not in hub.repos or arrived(hub, REPO) == {}


@SIZES
def test_bytes_changed_after_verify_are_not_committed(out_copy, hub, monkeypatch, small):  # noqa: F811
    send_from_descriptor(monkeypatch, small)

    def flip(out_dir):  # in place: the same file, other bytes, after the verify
        with open(sorted(out_dir.glob("model-*.safetensors"))[1], "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))

    after_verify(monkeypatch, flip)
    with pytest.raises(InputError, match=r"model-00002-of-00003\.safetensors: sha256 [0-9a-f]{16}\.\.\. as sent, "
                                         r"[0-9a-f]{16}\.\.\. in the manifest; it changed after it was verified"):
        upload(str(out_copy), REPO, endpoint=hub.url)
    assert REPO not in hub.repos or arrived(hub, REPO) == {}  # no commit


def test_a_shard_swapped_for_a_link_while_it_is_sent_sends_the_verified_bytes(out_copy, hub, monkeypatch, tmp_path):  # noqa: F811
    """A large file is sent from the descriptor opened (and checked) before: a link put in its place later is not
    followed."""
    send_from_descriptor(monkeypatch, 0)
    want = expected_files(out_copy)
    real_pin = publish.pin_files

    def pin_then_swap(out_dir, records):
        found = real_pin(out_dir, records)
        shard = sorted(out_dir.glob("model-*.safetensors"))[1]
        (tmp_path / "outside.bin").write_bytes(bytes(shard.stat().st_size))
        shard.unlink()
        shard.symlink_to(tmp_path / "outside.bin")
        return found

    monkeypatch.setattr(publish, "pin_files", pin_then_swap, raising=False)
    upload(str(out_copy), REPO, endpoint=hub.url)
    assert arrived(hub, REPO) == want


def test_upload_holds_outs_lock_throughout(out_copy, hub, monkeypatch):  # noqa: F811
    seen = []

    def try_lock(out_dir):
        other = OutLock(out_dir)
        try:
            other.acquire()
            seen.append("acquired")
            other.release()
        except InputError as e:
            seen.append(str(e))

    after_verify(monkeypatch, try_lock)
    upload(str(out_copy), REPO, endpoint=hub.url)
    assert len(seen) == 1 and re.search(r"another fimoe-convert run is writing into it \(pid \d+", seen[0]), seen
    assert arrived(hub, REPO) == expected_files(out_copy)
    assert not (out_copy / ".fimoe-lock").exists()


def test_upload_repo_publishes_while_the_conversion_holds_outs_lock(hub, tiny_ckpt, tmp_path, monkeypatch):  # noqa: F811
    out, seen = tmp_path / "out", []
    real = publish.upload

    def upload_checking_the_lock(out_dir, repo_id, **kwargs):
        try:
            OutLock(Path(out_dir)).acquire()
            seen.append("acquired")
        except InputError as e:
            seen.append(str(e))
        return real(out_dir, repo_id, **kwargs)

    monkeypatch.setattr(publish, "upload", upload_checking_the_lock)
    res = convert(str(tiny_ckpt), str(out), "bf16", shard_size="7MB", upload_repo=REPO)
    assert res.upload.files == 10
    assert len(seen) == 1 and "another fimoe-convert run is writing into it" in seen[0], seen
    assert arrived(hub, REPO) == expected_files(out)


@pytest.mark.parametrize("who, match", [
    (None, r"^--upload-repo fimoe-test/tiny-bf16: the Hub refuses the token \(HTTP 401\)"),
    ({"name": "fimoe-test", "orgs": [], "auth": {"accessToken": {"role": "read"}}},
     r"^--upload-repo fimoe-test/tiny-bf16: the token is read-only"),
    ({"name": "someone", "orgs": [{"name": "other"}], "auth": {"accessToken": {"role": "write"}}},
     r"^--upload-repo fimoe-test/tiny-bf16: the token is 'someone''s, who is not 'fimoe-test' nor a member of it"),
    ({"name": "fimoe-test", "orgs": [], "auth": {"accessToken": {"role": "fineGrained", "fineGrained": {
        "scoped": [{"entity": {"type": "user", "name": "fimoe-test"}, "permissions": ["repo.content.read"]}]}}}},
     r"^--upload-repo fimoe-test/tiny-bf16: the fine-grained token has no write permission \(repo\.write\)"),
], ids=["bad-token", "read-only", "other-namespace", "fine-grained-read"])
def test_upload_repo_checks_the_token_and_its_rights_before_converting(hub, tiny_ckpt, tmp_path, who, match):  # noqa: F811
    if who is None:
        hub.tokens.clear()
    else:
        hub.tokens[TOKEN] = who
    out = tmp_path / "out"
    with pytest.raises(InputError, match=match):
        convert(str(tiny_ckpt), str(out), "bf16", upload_repo=REPO)
    assert not out.exists()  # nothing converted
    assert TOKEN not in json.dumps(hub.requests[-1]["path"])


def test_upload_repo_checks_the_network_before_converting(hub, tiny_ckpt, tmp_path, monkeypatch):  # noqa: F811
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^--upload-repo fimoe-test/tiny-bf16: cannot reach http://127\.0\.0\.1:9 "):
        convert(str(tiny_ckpt), str(out), "bf16", upload_repo=REPO)
    assert not out.exists()


def test_a_failed_upload_repo_names_the_command_that_finishes_it(hub, tiny_ckpt, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    hub.fail_once("POST", r"/commit/")
    r = CliRunner().invoke(main, [str(tiny_ckpt), str(out), "--shard-size", "7MB", "--upload-repo", REPO])
    assert r.exit_code == 1
    cmd = f"fimoe-convert upload {out} {REPO}"
    assert f"finish it with `{cmd}`" in r.output, r.output
    r = CliRunner().invoke(main, cmd.split()[1:])
    assert r.exit_code == 0, r.output
    assert arrived(hub, REPO) == expected_files(out)


def test_upload_takes_hf_uploads_flags(out_copy, hub, monkeypatch):  # noqa: F811
    monkeypatch.delenv("HF_TOKEN")
    args = ["upload", str(out_copy), REPO, "--token", TOKEN, "--commit-message", "tiny bf16",
            "--commit-description", "made by the tests", "--private", "--revision", "v1"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert TOKEN not in r.output
    assert hub.repos[REPO]["private"] is True and arrived(hub, REPO, "v1") == expected_files(out_copy)
    assert hub.commits(REPO, "v1")[-1]["summary"] == "tiny bf16"
    r = CliRunner().invoke(main, ["upload", str(out_copy), REPO, "--token", TOKEN, "--create-pr"])
    assert r.exit_code == 0, r.output
    assert len(hub.prs) == 1 and hub.prs[0]["files"] == expected_files(out_copy)
    assert f"pull request: {hub.url}/{REPO}/discussions/1" in r.output
    assert arrived(hub, REPO) == {}  # main untouched: the change waits in the pull request


@pytest.mark.parametrize("target, library", [("bf16", "transformers"), ("megamoe_sm90_mxfp4", "flashinfer")])
def test_the_card_carries_the_sources_license_and_the_hubs_fields(tiny_copy, tmp_path, target, library):
    from huggingface_hub import ModelCard

    (tiny_copy / "README.md").write_text("---\nlicense: mit\nlibrary_name: transformers\n---\n\n# DeepSeek V4 tiny\n")
    out = tmp_path / "out"
    convert(str(tiny_copy), str(out), target)
    d = ModelCard.load(out / "README.md").data.to_dict()
    assert (d["license"], d["library_name"], d["pipeline_tag"]) == ("mit", library, "text-generation")
    assert {"deepseek_v4", "moe", target} <= set(d["tags"])


def test_the_card_of_a_hub_source_names_it_as_base_model(hub_cache, tmp_path):
    from huggingface_hub import ModelCard
    from reference import HUB_REPO

    out = tmp_path / "out"
    convert(HUB_REPO, str(out), "bf16", offline=True)
    d = ModelCard.load(out / "README.md").data.to_dict()
    assert d["base_model"] == HUB_REPO and d["pipeline_tag"] == "text-generation"


# ------------------------------------------------------------------ verify ORG/NAME: a published conversion

PUBLISHED, PUBLISHED_COMMIT = "fimoe-test/published-bf16", "d" * 40


@pytest.fixture
def published(bf16_out_of, tmp_path, monkeypatch):
    """A bf16 OUT served as PUBLISHED@PUBLISHED_COMMIT by a fake Hub (shards in LFS, the rest in git)."""
    from helpers.hub_files import HubFiles, point_hf_at

    folder = Path(shutil.copytree(bf16_out_of("7MB"), tmp_path / "published"))
    with HubFiles(PUBLISHED, folder, PUBLISHED_COMMIT) as h:
        point_hf_at(h.url, monkeypatch, tmp_path / "cache")
        yield h


def shard_bytes_sent(served) -> list[str]:
    return [r for m, p, r in served.requests if m == "GET" and p.endswith(".safetensors") and not
            (r and int(r.split("-")[1]) < 2**20)]


def test_verify_of_a_published_conversion_reads_no_shard(published):
    from fimoe_convert import verify

    r = verify(PUBLISHED)
    assert r.problems == [] and r.files == 9 and r.revision == PUBLISHED_COMMIT
    assert shard_bytes_sent(published) == []  # headers by range only
    res = CliRunner().invoke(main, ["verify", PUBLISHED])
    assert res.exit_code == 0 and "\nok: 9 files, 16.34 MB match the manifest" in res.output, res.output


@pytest.mark.parametrize("damage, problem", [
    ("shard", r"model-00002-of-00003\.safetensors: sha256 [0-9a-f]{16}\.\.\. on the Hub, manifest says "
              r"[0-9a-f]{16}\.\.\.; the published file is not the one the manifest records"),
    ("config.json", r"config\.json: sha256 [0-9a-f]{16}\.\.\. on the Hub, manifest says"),
    ("missing", r"'tokenizer\.json' is listed in the manifest but not in the repo"),
], ids=["shard", "config", "missing"])
def test_verify_of_a_published_conversion_names_the_file_that_differs(published, damage, problem):
    from fimoe_convert import verify

    folder = published.folder
    if damage == "missing":
        (folder / "tokenizer.json").unlink()
    else:
        path = sorted(folder.glob("model-*.safetensors"))[1] if damage == "shard" else folder / damage
        data = bytearray(path.read_bytes())
        data[-2] ^= 0x01
        path.write_bytes(bytes(data))
    r = verify(PUBLISHED)
    assert len(r.problems) == 1 and re.search(problem, r.problems[0]), r.problems
    assert shard_bytes_sent(published) == []


def test_under_torchrun_one_rank_uploads(tiny_ckpt, tmp_path):
    import subprocess
    import sys

    from test_stops_and_deadlines import _free_port
    from test_upload import FakeHub

    out = tmp_path / "out"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(_free_port()), "-m", "fimoe_convert", str(tiny_ckpt), str(out), "--shard-size",
              "1MB", "-q", "--upload-repo", REPO]
    with FakeHub() as fake:
        env = {**os.environ, "HF_ENDPOINT": fake.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home"),
               "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,localhost"}
        env.pop("HF_HUB_OFFLINE", None)
        r = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        creates = [q for q in fake.requests if q["path"] == "/api/repos/create"]
        assert len(creates) == 1, [q["path"] for q in fake.requests]
        assert arrived(fake, REPO) == expected_files(out)


def test_nothing_the_output_carries_names_a_path_of_the_converting_machine(tiny_copy, tmp_path, hub_cache):
    from reference import HUB_COMMIT, HUB_REPO

    local, remote = tmp_path / "local", tmp_path / "remote"
    convert(str(tiny_copy), str(local), "bf16")
    convert(HUB_REPO, str(remote), "bf16", offline=True)
    for out, spec in ((local, tiny_copy.name), (remote, f"{HUB_REPO}@{HUB_COMMIT}")):
        assert json.loads((out / "fimoe-manifest.json").read_text())["source"]["spec"] == spec
        for f in out.iterdir():
            data = f.read_bytes()
            for path in {str(tmp_path), str(tiny_copy), str(hub_cache), os.path.expanduser("~")} - {"~"}:
                assert path.encode() not in data, (f.name, path)
