"""The ranged reader itself (files/sources/http_range.py): bytes land in the caller's buffers, one connection per
host is kept and used again, a kept connection the server closed meanwhile is opened again at once (no retry, no
back-off), a proxy from the environment carries the request, a redirect to another host drops the token."""

import base64
import re
import threading
from http.server import BaseHTTPRequestHandler

import pytest
from helpers.hub_files import QuietServer

import fimoe_convert.files.sources.http_range as http_range
from fimoe_convert.errors import InputError

DATA = bytes(range(256)) * 64  # 16 KiB, every offset's byte known
TOKEN = "hf_range_test_token"


class _Server:
    """A file served with Range on 127.0.0.1; records each request (request line, Authorization, the client's
    port: its connection); `close_after`: each answer ends with the connection closed although HTTP/1.1 keeps it
    (a server's idle timeout)."""

    def __init__(self, close_after: bool = False, redirect_to: str | None = None, proxy: bool = False):
        self.requests: list[tuple[str, str | None, int]] = []
        self.proxy_auth: list[str | None] = []  # each request's Proxy-Authorization
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                owner.requests.append((self.requestline, self.headers.get("Authorization"), self.client_address[1]))
                owner.proxy_auth.append(self.headers.get("Proxy-Authorization"))
                if redirect_to and self.path.startswith("/org/"):  # the Hub's resolve URL
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                start, end = int(m.group(1)), int(m.group(2))
                self.send_response(206)
                self.send_header("Content-Length", str(end + 1 - start))
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(DATA)}")
                self.end_headers()
                self.wfile.write(DATA[start:end + 1])
                if close_after:
                    self.close_connection = True

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def no_sleep(monkeypatch):
    """http_range's back-off sleeps, recorded and skipped: a retry shows as a sleep."""
    slept: list[float] = []
    monkeypatch.setattr(http_range.time, "sleep", slept.append)
    monkeypatch.setattr(http_range, "_local", threading.local())  # no connection kept from another test
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "")
    return slept


def read(url: str, start: int, end: int, token=None) -> bytes:
    buf = bytearray(end - start)
    view = memoryview(buf)
    http_range.read_range(url, start, end, lambda pos, n: view[pos - start:pos - start + n], token=token,
                          where="org/x/a.safetensors")
    return bytes(buf)


@pytest.mark.parametrize("close_after, connections", [
    (False, 1),  # kept: the second read goes on the first one's connection
    (True, 2),  # closed by the server after each answer: opened again, without a retry
])
def test_reads_keep_one_connection_and_open_another_when_the_server_closed_it(no_sleep, close_after, connections):
    server = _Server(close_after=close_after)
    try:
        url = f"{server.url}/org/x/resolve/main/a.safetensors"
        assert read(url, 0, 5000) == DATA[:5000]
        assert read(url, 5000, len(DATA)) == DATA[5000:]
    finally:
        server.close()
    assert len(server.requests) == 2 and len({c for *_, c in server.requests}) == connections
    assert no_sleep == []


@pytest.mark.parametrize("credentials, sent", [
    ("", None),
    ("me:s%40cret@", "Basic " + base64.b64encode(b"me:s@cret").decode()),  # the proxy URL's, percent-decoded
])
def test_a_proxy_from_the_environment_carries_the_request(no_sleep, monkeypatch, credentials, sent):
    """HTTP_PROXY names a proxy: the GET goes there with the whole URL on its request line and the proxy's
    credentials (the proxy here serves the bytes itself); NO_PROXY naming the host goes direct, without them."""
    proxy, origin = _Server(), _Server()
    try:
        url = f"{origin.url}/org/x/resolve/main/a.safetensors"
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", f"http://{credentials}"))
        assert read(url, 100, 300) == DATA[100:300]
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setattr(http_range, "_local", threading.local())
        assert read(url, 300, 400) == DATA[300:400]
    finally:
        proxy.close()
        origin.close()
    assert [r for r, *_ in proxy.requests] == [f"GET {url} HTTP/1.1"] and proxy.proxy_auth == [sent]
    assert [r for r, *_ in origin.requests] == ["GET /org/x/resolve/main/a.safetensors HTTP/1.1"]
    assert origin.proxy_auth == [None]


@pytest.mark.parametrize("same_host", [True, False])
def test_a_redirect_keeps_the_token_on_its_host_only(no_sleep, same_host):
    """The Hub's resolve URL answers 302: to a path of its own host the token goes along; to a storage host (a
    signed URL) it does not."""
    storage = None if same_host else _Server()
    hub = _Server(redirect_to="/storage/a?sig=1" if same_host else f"{storage.url}/storage/a?sig=1")
    try:
        assert read(f"{hub.url}/org/x/resolve/main/a.safetensors", 0, 100, token=TOKEN) == DATA[:100]
    finally:
        hub.close()
        if storage:
            storage.close()
    if same_host:
        assert [(r, a) for r, a, _ in hub.requests] == [
            ("GET /org/x/resolve/main/a.safetensors HTTP/1.1", f"Bearer {TOKEN}"),
            ("GET /storage/a?sig=1 HTTP/1.1", f"Bearer {TOKEN}")]
    else:
        assert [a for _, a, _ in hub.requests] == [f"Bearer {TOKEN}"]
        assert [(r, a) for r, a, _ in storage.requests] == [("GET /storage/a?sig=1 HTTP/1.1", None)]


def test_a_refusal_is_one_line_with_the_hubs_reason(no_sleep):
    class Refuse(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Error-Message", "Entry not found")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = QuietServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        with pytest.raises(InputError, match=r"^org/x/a\.safetensors: the Hub refused bytes 0-9 \(HTTP 404 "
                                             r"EntryNotFound: Entry not found\); check the repo id, revision and "
                                             r"token$"):
            read(f"http://127.0.0.1:{server.server_address[1]}/org/x/resolve/main/a.safetensors", 0, 10)
    finally:
        server.shutdown()
        server.server_close()
    assert no_sleep == []
