"""`fimoe-convert upload` against a fake Hugging Face Hub served inside the tests.

`FakeHub` below is a small threaded HTTP server on 127.0.0.1 (a random port) answering the
endpoints huggingface_hub calls for `create_repo`, `repo_info`, `create_branch` and
`upload_folder`: validate-yaml, preupload, the LFS batch API, LFS PUT and verify, and commit.
It keeps what a real Hub keeps across calls (repos, branches of files, LFS objects by sha256),
so a second upload of the same bytes is told they are already there, which is what makes an
interrupted upload resume. `fail_once` makes one matching request fail (after reading its body).

hf_xet uploads to a separate xet storage service that cannot be faked here, so most tests set
HF_HUB_DISABLE_XET (huggingface_hub then uses plain LFS uploads and a single commit); one test
runs the default multi-commit pipeline with every file answered as a regular (non-LFS) file.
No network beyond loopback."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

import huggingface_hub.constants as hf_constants
import pytest
from click.testing import CliRunner
from helpers.hub_files import QuietServer

from fimoe_convert import upload
from fimoe_convert.cli import main
from fimoe_convert.errors import InputError, UsageError
from fimoe_convert.files.output.folder import MANIFEST_NAME

# ---------------------------------------------------------------------------------------------- fake Hub

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
LFS_THRESHOLD = 10 * 2**20  # files above this go through LFS even when not *.safetensors

_REPO = r"(?P<repo>[^/]+/[^/]+)"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, regular_only: bool = False):
        self.regular_only = regular_only  # answer "regular" for every file (no LFS / xet storage needed)
        self.repos: dict[str, dict] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[dict] = []  # {"method", "path", "auth"}
        self.puts: list[str] = []  # oids PUT successfully, in order
        self._fail: list[list] = []  # [method, path regex, status, matches to let through first]
        # whoami-v2 by token: who it is and what it may do (a read-only token, another user: edit per test)
        self.tokens: dict[str, dict] = {TOKEN: {"name": "fimoe-test", "orgs": [{"name": "fimoe-org"}],
                                                "auth": {"accessToken": {"role": "write"}}}}
        self.prs: list[dict] = []  # commits made with create_pr, as {"repo", "paths", "files"}
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._handle(self)

            def do_POST(self):
                hub._handle(self)

            def do_PUT(self):
                hub._handle(self)

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), name="fake-hub", daemon=True)

    # ------------------------------------------------------------------ control
    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail_once(self, method: str, path_regex: str, status: int = 400, after: int = 0) -> None:
        """Fail the next request matching (method, path) once, after letting `after` of them through.
        400 by default: huggingface_hub retries 5xx on its own, a 4xx ends the run (an interruption)."""
        with self.lock:
            self._fail.append([method, re.compile(path_regex), status, after])

    def add_repo(self, repo_id: str, private: bool = False) -> None:
        with self.lock:
            self._new_repo(repo_id, private)

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return dict(self.repos[repo_id]["branches"][branch]["files"])

    def commits(self, repo_id: str, branch: str = "main") -> list[dict]:
        return list(self.repos[repo_id]["branches"][branch]["commits"])

    # ------------------------------------------------------------------ internals
    def _new_repo(self, repo_id: str, private: bool) -> None:
        files = {".gitattributes": GITATTRIBUTES}
        sha = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = {"private": private,
                               "branches": {"main": {"files": files, "sha": sha,
                                                     "commits": [{"sha": sha, "summary": "initial commit",
                                                                  "paths": [".gitattributes"]}]}}}

    @staticmethod
    def _body(h: BaseHTTPRequestHandler) -> bytes:
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(h.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += h.rfile.read(size)
                h.rfile.readline()
        n = int(h.headers.get("Content-Length") or 0)
        return h.rfile.read(n) if n else b""

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, obj=None, headers: dict | None = None) -> None:
        data = b"" if obj is None else json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = urlsplit(h.path).path
        body = self._body(h)
        with self.lock:
            self.requests.append({"method": h.command, "path": path, "auth": h.headers.get("Authorization")})
            for i, (m, rx, status, after) in enumerate(self._fail):
                if m == h.command and rx.search(path):
                    if after:
                        self._fail[i][3] -= 1
                        break
                    del self._fail[i]
                    return self._send(h, status, {"error": "simulated failure (fake hub)"})
            try:
                if path == "/api/whoami-v2":
                    who = self.tokens.get((h.headers.get("Authorization") or "").removeprefix("Bearer "))
                    status, obj, headers = (200, who, None) if who else (401, {"error": "Invalid credentials"}, None)
                elif "/commit/" in path and "create_pr=1" in (urlsplit(h.path).query or ""):
                    status, obj, headers = self._pr(path, body)
                else:
                    status, obj, headers = self._route(h.command, path, body)
            except Exception as e:  # a bug in the fake: make it loud
                status, obj, headers = 599, {"error": f"fake hub: {type(e).__name__}: {e}"}, None
        self._send(h, status, obj, headers)

    def _branch(self, repo: str, rev: str):
        r = self.repos.get(repo)
        if r is None:
            return None, (404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        b = r["branches"].get(unquote(rev))
        if b is None:
            return None, (404, {"error": f"Invalid rev id: {rev}"}, {"X-Error-Code": "RevisionNotFound"})
        return b, None

    def _pr(self, path: str, body: bytes):
        """A commit made as a pull request: recorded beside the branches, which it leaves as they are."""
        m = re.fullmatch(rf"/api/models/{_REPO}/commit/(?P<rev>.+)", path)
        lines = [json.loads(x) for x in body.splitlines() if x.strip()]
        files = {x["value"]["path"]: (base64.b64decode(x["value"]["content"]) if x["key"] == "file"
                                      else self.lfs[x["value"]["oid"]])
                 for x in lines if x["key"] in ("file", "lfsFile")}
        num = len(self.prs) + 1
        self.prs.append({"repo": m["repo"], "files": files})
        return 200, {"commitUrl": f"{self.url}/{m['repo']}/commit/pr{num}", "commitOid": f"{num:040x}",
                     "pullRequestUrl": f"{self.url}/{m['repo']}/discussions/{num}"}, None

    def _route(self, method: str, path: str, body: bytes):
        js = (lambda: json.loads(body))
        if method == "POST" and path == "/api/repos/create":
            p = js()
            repo = f"{p['organization']}/{p['name']}" if p.get("organization") else p["name"]
            if repo in self.repos:
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo}"}, None
            self._new_repo(repo, p.get("visibility") == "private" or bool(p.get("private")))
            return 200, {"url": f"{self.url}/{repo}", "name": repo}, None
        if method == "POST" and path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}, None
        if m := re.fullmatch(rf"/api/models/{_REPO}(?:/revision/(?P<rev>.+))?", path):
            if method != "GET":
                return 405, {"error": "method"}, None
            b, err = self._branch(m["repo"], m["rev"] or "main")
            if err:
                return err
            return 200, {"id": m["repo"], "sha": b["sha"], "private": self.repos[m["repo"]]["private"],
                         "siblings": [{"rfilename": f} for f in sorted(b["files"])]}, None
        if m := re.fullmatch(rf"/api/models/{_REPO}/branch/(?P<branch>.+)", path):
            b, err = self._branch(m["repo"], "main")
            if err:
                return err
            name = unquote(m["branch"])
            branches = self.repos[m["repo"]]["branches"]
            if name in branches:
                return 409, {"error": "Reference already exists"}, None
            branches[name] = {"files": dict(b["files"]), "sha": b["sha"], "commits": list(b["commits"])}
            return 200, {}, None
        if m := re.fullmatch(rf"/api/models/{_REPO}/preupload/(?P<rev>.+)", path):
            b, err = self._branch(m["repo"], m["rev"])
            if err:
                return err
            out = []
            for f in js()["files"]:
                lfs = not self.regular_only and (f["path"].endswith(".safetensors") or f["size"] > LFS_THRESHOLD)
                have = b["files"].get(f["path"])
                oid = None if have is None else (hashlib.sha256(have).hexdigest() if lfs else git_blob_sha1(have))
                out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                            "oid": oid})
            return 200, {"files": out}, None
        if m := re.fullmatch(rf"/{_REPO}\.git/info/lfs/objects/batch", path):
            if m["repo"] not in self.repos:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            objs = []
            for o in js()["objects"]:
                rec = {"oid": o["oid"], "size": o["size"]}
                if o["oid"] not in self.lfs:
                    rec["actions"] = {"upload": {"href": f"{self.url}/lfs-storage/{o['oid']}"},
                                      "verify": {"href": f"{self.url}/lfs-verify/{m['repo']}"}}
                objs.append(rec)
            return 200, {"transfer": "basic", "objects": objs}, None
        if m := re.fullmatch(r"/lfs-storage/(?P<oid>[0-9a-f]{64})", path):
            if method != "PUT":
                return 405, {"error": "method"}, None
            if hashlib.sha256(body).hexdigest() != m["oid"]:
                return 400, {"error": "sha256 mismatch"}, None
            self.lfs[m["oid"]] = body
            self.puts.append(m["oid"])
            return 200, {}, None
        if re.fullmatch(rf"/lfs-verify/{_REPO}", path):
            o = js()
            ok = o.get("oid") in self.lfs and len(self.lfs[o["oid"]]) == o.get("size")
            return (200, {}, None) if ok else (404, {"error": "object not found"}, None)
        if m := re.fullmatch(rf"/api/models/{_REPO}/commit/(?P<rev>.+)", path):
            b, err = self._branch(m["repo"], m["rev"])
            if err:
                return err
            lines = [json.loads(x) for x in body.splitlines() if x.strip()]
            header = next(x["value"] for x in lines if x["key"] == "header")
            files = dict(b["files"])
            paths = []
            for x in lines:
                v = x["value"]
                if x["key"] == "file":
                    files[v["path"]] = base64.b64decode(v["content"])
                elif x["key"] == "lfsFile":
                    if v["oid"] not in self.lfs:
                        return 422, {"error": f"lfsFile {v['path']}: object {v['oid']} was never uploaded"}, None
                    files[v["path"]] = self.lfs[v["oid"]]
                elif x["key"] in ("deletedFile", "deletedFolder"):
                    files.pop(v["path"], None)
                else:
                    continue
                paths.append(v["path"])
            sha = hashlib.sha1((b["sha"] + body.decode()).encode()).hexdigest()
            b.update(files=files, sha=sha)
            b["commits"].append({"sha": sha, "summary": header["summary"], "paths": paths})
            return 200, {"commitUrl": f"{self.url}/{m['repo']}/commit/{sha}", "commitOid": sha,
                         "pullRequestUrl": None}, None
        return 404, {"error": f"fake hub: no route for {method} {path}"}, None


# ---------------------------------------------------------------------------------------------- tests

TOKEN = "hf_FakeUploadToken0123456789abcdef"
REPO = "fimoe-test/tiny-bf16"


@pytest.fixture
def bf16_out(bf16_out_of) -> Path:
    """A finished bf16 OUT with three shards (read-only for tests: copy before damaging)."""
    return bf16_out_of("7MB")


@pytest.fixture
def out_copy(bf16_out, tmp_path) -> Path:
    return Path(shutil.copytree(bf16_out, tmp_path / "out"))


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A fake Hub on loopback; the token comes from HF_TOKEN (the usual source); plain LFS (no hf_xet)."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)  # no xet storage server here: plain LFS
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "hf-home" / "xet"))
    asked: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def loopback_only(host, *args, **kwargs):  # no network beyond loopback, whatever a library tries
        if host not in ("127.0.0.1", "localhost", "::1"):
            asked.append(str(host))
            raise OSError(f"test_upload: no network beyond loopback (asked for {host})")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)
    # huggingface_hub also fetches a registry from constants.ENDPOINT when telemetry is on (user agent):
    # point every default at the fake and turn that off, so nothing but the fake is ever asked.
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
    with FakeHub() as h:
        monkeypatch.setattr(hf_constants, "ENDPOINT", h.url)
        yield h
    assert asked == []


def expected_files(out: Path) -> dict[str, bytes]:
    """What must arrive: every file the manifest lists, plus the manifest; nothing else."""
    m = json.loads((out / MANIFEST_NAME).read_text())
    return {rel: (out / rel).read_bytes() for rel in sorted([*m["files"], MANIFEST_NAME])}


def arrived(hub: FakeHub, repo: str, branch: str = "main") -> dict[str, bytes]:
    files = hub.files(repo, branch)
    assert files.pop(".gitattributes") == GITATTRIBUTES  # made by the Hub with the repo
    return files


def test_dry_run_lists_files_and_bytes_and_sends_nothing(out_copy, hub):
    (out_copy / "notes.txt").write_text("local scratch")
    r = upload(str(out_copy), REPO, dry_run=True, endpoint=hub.url)
    want = expected_files(out_copy)
    assert [f.file for f in r.list] == list(want)
    assert {f.file: f.bytes for f in r.list} == {k: len(v) for k, v in want.items()}
    assert r.bytes == sum(len(v) for v in want.values()) and r.files == len(want)
    assert r.not_uploaded == ["notes.txt"] and r.token_found is True
    assert TOKEN not in json.dumps(r.to_json())
    assert hub.requests == []

    res = CliRunner().invoke(main, ["upload", str(out_copy), REPO, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"would upload {len(want)} files" in res.output and f"to {REPO}@main" in res.output
    for name, data in want.items():
        assert f"  {name}  {len(data)} bytes" in res.output
    assert "not uploaded (not in the manifest): notes.txt" in res.output
    assert "token: found (not shown)" in res.output and TOKEN not in res.output
    assert hub.requests == []


def test_refuses_unfinished_out_naming_the_manifest(out_copy, hub):
    m = json.loads((out_copy / MANIFEST_NAME).read_text())
    m["complete"] = False
    (out_copy / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(InputError, match=re.escape(str(out_copy / MANIFEST_NAME)) + ".*did not finish"):
        upload(str(out_copy), REPO, endpoint=hub.url)
    res = CliRunner().invoke(main, ["upload", str(out_copy), REPO, "--dry-run"])
    assert res.exit_code == 1 and MANIFEST_NAME in res.output
    assert hub.requests == []


def test_refuses_damaged_out_naming_the_file(out_copy, hub):
    shards = sorted(out_copy.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2
    shard = shards[1]  # a shard of routed experts, whatever the plan's shard count
    good = shard.read_bytes()
    shard.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    with pytest.raises(InputError, match=re.escape(str(shard)) + r": sha256 .*refusing to upload"):
        upload(str(out_copy), REPO, endpoint=hub.url)
    shard.write_bytes(good)
    (out_copy / "tokenizer.json").unlink()
    with pytest.raises(InputError, match="tokenizer.json: listed in the manifest but missing"):
        upload(str(out_copy), REPO, dry_run=True)
    assert [q["path"] for q in hub.requests] == ["/api/whoami-v2"]  # the token, checked before OUT is hashed


def test_refuses_a_folder_that_is_not_an_output(tmp_path, hub):
    with pytest.raises(InputError, match=re.escape(str(tmp_path / MANIFEST_NAME)) + ": not found"):
        upload(str(tmp_path), REPO, endpoint=hub.url)
    with pytest.raises(UsageError, match="REPO_ID 'tiny-bf16': expected NAMESPACE/NAME"):
        upload(str(tmp_path), "tiny-bf16", endpoint=hub.url)
    assert hub.requests == []


def test_no_token_or_offline_is_refused_before_any_request(out_copy, hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(InputError, match="no Hugging Face token found: set HF_TOKEN or run `hf auth login`"):
        upload(str(out_copy), REPO, endpoint=hub.url)
    assert upload(str(out_copy), REPO, dry_run=True).token_found is False
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="HF_HUB_OFFLINE is set: an upload needs the network"):
        upload(str(out_copy), REPO, endpoint=hub.url)
    assert upload(str(out_copy), REPO, dry_run=True).token_found is True
    assert hub.requests == []


def test_upload_sends_exactly_the_manifest_files_with_the_configured_token(out_copy, hub, capfd, caplog):
    (out_copy / "notes.txt").write_text("local scratch")
    r = upload(str(out_copy), REPO, endpoint=hub.url)
    want = expected_files(out_copy)
    assert arrived(hub, REPO) == want  # exact list, exact bytes
    assert hub.repos[REPO]["private"] is False
    # Shards went through LFS (checked against their sha256 by the fake), small files in the commit.
    shards = {hashlib.sha256(v).hexdigest() for k, v in want.items() if k.endswith(".safetensors")}
    assert set(hub.puts) == shards and len(hub.puts) == 3
    commits = hub.commits(REPO)
    assert len(commits) == 2 and sorted(commits[-1]["paths"]) == list(want)
    assert r.commit == commits[-1]["sha"] and r.url == f"{hub.url}/{REPO}"
    # The token went in the Authorization header of every Hub API call (LFS storage PUTs carry none,
    # as with pre-signed storage URLs) and appears in no output.
    api = [q for q in hub.requests if not q["path"].startswith("/lfs-storage/")]
    assert api and all(q["auth"] == f"Bearer {TOKEN}" for q in api)
    assert all(q["auth"] is None for q in hub.requests if q["path"].startswith("/lfs-storage/"))
    out, err = capfd.readouterr()
    assert TOKEN not in out + err + caplog.text + json.dumps(r.to_json())


def test_private_repo_on_a_new_branch(out_copy, hub):
    r = upload(str(out_copy), REPO, private=True, revision="fimoe-bf16", endpoint=hub.url)
    assert hub.repos[REPO]["private"] is True
    assert arrived(hub, REPO, "fimoe-bf16") == expected_files(out_copy)
    assert arrived(hub, REPO, "main") == {}
    assert r.revision == "fimoe-bf16" and r.url.endswith(f"{REPO}/tree/fimoe-bf16")
    # Again into the existing repo and branch: create_repo and create_branch accept what exists,
    # and nothing changed, so nothing is sent and no commit is made.
    n_commits = len(hub.commits(REPO, "fimoe-bf16"))
    upload(str(out_copy), REPO, private=True, revision="fimoe-bf16", endpoint=hub.url)
    assert len(hub.commits(REPO, "fimoe-bf16")) == n_commits and len(hub.puts) == 3


def test_private_is_refused_for_an_existing_public_repo(out_copy, hub):
    hub.add_repo(REPO, private=False)
    with pytest.raises(InputError, match=f"REPO_ID {REPO}: exists and is public; --private does not change"):
        upload(str(out_copy), REPO, private=True, endpoint=hub.url)
    assert arrived(hub, REPO) == {} and not any("/preupload/" in q["path"] for q in hub.requests)


def test_interrupted_upload_resumes_and_sends_only_what_is_missing(out_copy, hub, capfd):
    want = expected_files(out_copy)
    shards = {hashlib.sha256(v).hexdigest() for k, v in want.items() if k.endswith(".safetensors")}
    hub.fail_once("PUT", r"^/lfs-storage/", after=1)  # the second shard's upload breaks
    with pytest.raises(InputError) as e:
        upload(str(out_copy), REPO, endpoint=hub.url)
    msg = str(e.value)
    assert msg.startswith(f"upload to {REPO}@main failed at preupload: ")
    assert f"finish it with `fimoe-convert upload {out_copy} {REPO}`" in msg and TOKEN not in msg
    assert arrived(hub, REPO) == {}  # no commit: the repo does not show a half upload
    stored = set(hub.puts)
    assert 1 <= len(stored) < len(shards)
    first_run_puts = len(hub.puts)

    upload(str(out_copy), REPO, endpoint=hub.url)
    assert arrived(hub, REPO) == want
    assert set(hub.puts[first_run_puts:]) == shards - stored  # only the missing objects were sent
    assert len(hub.puts) == len(shards)

    upload(str(out_copy), REPO, endpoint=hub.url)  # a third run finds everything there
    assert len(hub.puts) == len(shards) and len(hub.commits(REPO)) == 2
    out, err = capfd.readouterr()
    assert TOKEN not in out + err


@pytest.mark.slow
def test_with_hf_xet_a_failed_commit_is_finished_by_the_upload_command(out_copy, hub, monkeypatch):
    """With hf_xet installed (the default path): the fake has no xet storage, so it answers "regular" for every file;
    the commit fails, nothing is on the Hub, and the command the error names commits everything in one commit."""
    pytest.importorskip("hf_xet")
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", False)
    hub.regular_only = True
    hub.fail_once("POST", r"/commit/")
    with pytest.raises(InputError, match=f"finish it with `fimoe-convert upload {re.escape(str(out_copy))} {REPO}`"):
        upload(str(out_copy), REPO, endpoint=hub.url)
    assert arrived(hub, REPO) == {}
    upload(str(out_copy), REPO, endpoint=hub.url)
    assert arrived(hub, REPO) == expected_files(out_copy) and len(hub.commits(REPO)) == 2


@pytest.mark.slow
def test_cli_reads_hf_endpoint_and_never_prints_the_token(bf16_out, hub, tmp_path):
    """The command as users run it: HF_ENDPOINT and HF_TOKEN from the environment, huggingface_hub's
    debug logging on (HF_DEBUG=1), one failure then the resuming re-run."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home"),
           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_DEBUG": "1",
           "HF_XET_CACHE": str(tmp_path / "hf-home" / "xet"), "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, "-m", "fimoe_convert", "upload", str(bf16_out), REPO, "--revision", "v1"]
    hub.fail_once("POST", r"/commit/")
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 1, first.stderr
    assert f"error: upload to {REPO}@v1 failed at create_commit" in first.stderr
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "uploaded 10 files, " in second.stdout and f"{hub.url}/{REPO}/tree/v1" in second.stdout
    assert arrived(hub, REPO, "v1") == expected_files(bf16_out)
    assert all(q["auth"] == f"Bearer {TOKEN}" for q in hub.requests if not q["path"].startswith("/lfs-storage/"))
    for p in (first, second):
        assert TOKEN not in p.stdout + p.stderr
    assert "<TOKEN>" in first.stderr + second.stderr  # the debug log ran, with the header redacted
