"""A fake Hugging Face Hub that serves one repo's files for download, on 127.0.0.1: HEAD and GET (with Range) of
`/{org}/{name}/resolve/{revision}/{path}`, answering the headers huggingface_hub reads (X-Repo-Commit, ETag,
Content-Length, Content-Range; for a *.safetensors file, stored in LFS on the real Hub, X-Linked-Etag (its sha256) and
X-Linked-Size, with a git blob sha1 as ETag). It counts the bytes it sends, so a test can tell that no weights were
downloaded. Faults for tests: `fault(name, start, part) -> bytes` changes what a GET sends (fewer bytes than its
Content-Length: the connection is then closed, as a dropped one), `errors[name] = [status, ...]` answers those
statuses first. `other`: an object whose `_handle(h)` answers every other request (POST, PUT, other repos), so that
one endpoint serves both reads and uploads, as the real Hub does. `storage`: large files are stored elsewhere, as
the Hub's Xet-backed files are: the resolve URL of a *.safetensors file answers 302 (with its LFS record) to a
second server, the storage host, at a signed URL that takes Range; `storage_refusals` answers that many of its
GETs 403 (a signature expired)."""

from __future__ import annotations

import hashlib
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

POLL_S = 0.02  # seconds between serve_forever's shutdown checks: its default 0.5 s is paid at every test's end


def point_hf_at(url: str, monkeypatch, cache: Path, token: str | None = "") -> None:
    """huggingface_hub pointed at the fake Hub at `url`, online, no telemetry, its cache in `cache`; HF_TOKEN set to
    `token` (None: left as it is)."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "ENDPOINT", url)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    if token is not None:
        monkeypatch.setenv("HF_TOKEN", token)


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up or stalls mid-answer (a stopped stream, a test's end) is no error to print: socketserver
    writes its traceback to sys.stderr, which a later test's CliRunner may be capturing."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):  # a hang-up, a reset, a timeout
            super().handle_error(request, client_address)


class HubFiles:
    def __init__(self, repo_id: str, folder: Path, commit: str, ignore_range: bool = False, storage: bool = False):
        """`ignore_range`: answer every GET with the whole file (200), as a server without Range support does."""
        self.repo_id, self.folder, self.commit, self.ignore_range = repo_id, Path(folder), commit, ignore_range
        self.sent = 0  # body bytes sent, over all requests
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.authorizations: list[str | None] = []  # the Authorization header of each request
        self.lock = threading.Lock()
        self.fault = None
        self.errors: dict[str, list[int]] = {}
        self.other = None
        self.storage = _Storage(self) if storage else None
        self.storage_refusals = 0
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

            def do_POST(self):
                hub._pass(self)

            def do_PUT(self):
                hub._pass(self)

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(POLL_S,), name="hub-files", daemon=True)

    def __enter__(self) -> "HubFiles":
        self.thread.start()
        if self.storage:
            self.storage.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for server in [self.server, *([self.storage.server] if self.storage else [])]:
            server.shutdown()
            server.server_close()

    def _pass(self, h: BaseHTTPRequestHandler) -> None:
        if self.other is None:
            h.send_response(405)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self.other._handle(h)

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        if self.other is not None and not path.startswith((f"/{self.repo_id}/", f"/api/models/{self.repo_id}/tree/")):
            return self._pass(h)
        with self.lock:
            self.requests.append((h.command, path, h.headers.get("Range")))
            self.authorizations.append(h.headers.get("Authorization"))
        if path.startswith(f"/api/models/{self.repo_id}/tree/") and body:
            return self._tree(h)
        m = re.fullmatch(rf"/{re.escape(self.repo_id)}/resolve/([^/]+)/(.+)", path)
        file = self.folder / m.group(2) if m else None
        if file is None or not file.is_file() or m.group(1) not in ("main", self.commit):
            h.send_response(404)
            h.send_header("X-Error-Code", "EntryNotFound")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        data = file.read_bytes()
        etag = hashlib.sha256(data).hexdigest()
        with self.lock:
            status = self.errors.get(m.group(2), []).pop(0) if body and self.errors.get(m.group(2)) else None
        if status:
            h.send_response(status)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if self.storage and file.suffix == ".safetensors":  # the LFS record here, the bytes on the storage host
            h.send_response(302)
            h.send_header("X-Repo-Commit", self.commit)
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(len(data)))
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            h.send_header("ETag", f'"{blob}"')
            h.send_header("Location", f"{self.storage.url}/blobs/{etag}?name={m.group(2)}"
                                      f"&signature=s{self.storage.signed}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self._send_file(h, body, m.group(2), data, etag, file.suffix == ".safetensors")

    def _send_file(self, h: BaseHTTPRequestHandler, body: bool, name: str, data: bytes, etag: str, lfs: bool) -> None:
        """`data` (the file `name`), or the part its Range asks for, with the headers huggingface_hub reads."""
        start, end, status = 0, len(data) - 1, 200
        rng = None if self.ignore_range else h.headers.get("Range")
        if rng:
            a, b = re.fullmatch(r"bytes=(\d+)-(\d*)", rng).groups()
            start, end, status = int(a), min(int(b) if b else len(data) - 1, len(data) - 1), 206
        part = data[start:end + 1]
        h.send_response(status)
        h.send_header("X-Repo-Commit", self.commit)
        if lfs:
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(len(data)))
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        h.send_header("ETag", f'"{etag}"')
        h.send_header("Content-Length", str(len(part) if status == 206 else len(data)))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        h.end_headers()
        if body:
            sent = self.fault(name, start, part) if self.fault else part
            if len(sent) < len(part):
                h.close_connection = True
            part = sent
            h.wfile.write(part)
            with self.lock:
                self.sent += len(part)

    def _tree(self, h: BaseHTTPRequestHandler) -> None:
        """The repo's file list (`list_repo_tree`, one page, as the Hub answers it; snapshot_download reads it)."""
        import json

        entries = []
        for f in sorted(p for p in self.folder.iterdir() if p.is_file()):
            data = f.read_bytes()
            entry = {"type": "file", "path": f.name, "size": len(data),
                     "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
            if f.suffix == ".safetensors":
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        payload = json.dumps(entries).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)


class _Storage:
    """The storage host `HubFiles(storage=True)` redirects to: /blobs/{sha256}?name=...&signature=... with Range.
    `requests`: (path, Range, Authorization) of each request; a signature older than `signed` is refused (403)."""

    def __init__(self, hub: HubFiles):
        self.requests: list[tuple[str, str | None, str | None]] = []
        self.signed = 1  # the signature the Hub hands out now
        storage = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                storage._serve(hub, self)

            def do_HEAD(self):
                storage._serve(hub, self)

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"  # another origin than the Hub's: its port
        self.thread = threading.Thread(target=self.server.serve_forever, args=(POLL_S,), name="hub-storage",
                                       daemon=True)

    def _serve(self, hub: HubFiles, h: BaseHTTPRequestHandler) -> None:
        from urllib.parse import parse_qs

        url = urlsplit(h.path)
        query = parse_qs(url.query)
        with hub.lock:
            self.requests.append((url.path, h.headers.get("Range"), h.headers.get("Authorization")))
            refuse = h.command == "GET" and hub.storage_refusals > 0
            if refuse:
                hub.storage_refusals -= 1
                self.signed += 1  # the Hub signs anew; the signature used here has expired
        name = query.get("name", [""])[0]
        file = hub.folder / name
        if refuse or not file.is_file() or query.get("signature") != [f"s{self.signed}"]:
            h.send_response(403)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        data = file.read_bytes()
        hub._send_file(h, h.command == "GET", name, data, hashlib.sha256(data).hexdigest(), True)
