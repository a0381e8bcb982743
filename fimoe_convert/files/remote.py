"""A Hub checkpoint described without downloading its weights: config.json and the index are fetched into the
Hugging Face cache (small files), and each shard's header is read from the Hub with two ranged requests (its
length, then its JSON), then validated exactly as a local header is. For `inspect` and `--dry-run` of a repo id
whose weights are not in the cache: at V4 size a download would take hours before anything is said.
Hand-written beside huggingface_hub's `parse_safetensors_file_metadata`, which returns parsed tensors without the
header's bytes or the file's size: the strict checks a local header gets (offsets within the file) need both."""

from __future__ import annotations

import os
import queue
import struct
import threading
import time
from pathlib import Path

from ..errors import InputError
from .output import MANIFEST_NAME
from .safetensors import INDEX_NAME, MAX_HEADER_BYTES, Header, parse_header

FIRST_BYTES = 1 << 20  # the first request asks for this much: most headers (V4's are about 100-300 KB) fit
HEADER_THREADS = 8  # shard headers read from the Hub at once (V4-Pro has about 64 shards)
REQUEST_DEADLINE_S = 60.0  # seconds one ranged request may take in all (a read timeout restarts on every byte)
WAIT_STEP_S = 0.5  # the main thread wakes this often while headers are read: a signal is handled at once


def _get(url: str, start: int, end: int, token) -> tuple[bytes, int]:
    """Bytes [start, end] of the file at `url` and the file's total size. At most end + 1 bytes are read, also
    from a server that ignores Range and sends the whole file (a shard is gigabytes)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    try:
        headers = {**build_hf_headers(token=token), "Range": f"bytes={start}-{end}"}
        with get_session().stream("GET", url, headers=headers, follow_redirects=True) as r:
            if r.status_code >= 400:
                r.read()  # the error's body, for hf_raise_for_status's message
            hf_raise_for_status(r)
            first = start if r.status_code == 206 else 0  # the file offset of the body's first byte
            body = _read_at_most(r.iter_bytes(), end + 1 - first, time.monotonic() + REQUEST_DEADLINE_S)
            total = r.headers.get("Content-Range", "").rpartition("/")[2]
            size = int(total) if total.isdigit() else int(r.headers.get("Content-Length", first + len(body)))
    except OSError:
        raise
    except Exception as e:  # the HTTP client's transport errors are not OSErrors: made one, as a socket's would be
        raise ConnectionError(f"{e.__class__.__name__}: {e}") from e
    return body[start - first:], size


def _read_at_most(chunks, limit: int, deadline: float = float("inf")) -> bytes:
    """The first `limit` bytes of a stream of chunks; the rest is not read. A TimeoutError past `deadline`
    (time.monotonic()): a server sending a byte at a time never trips a read timeout."""
    got: list[bytes] = []
    n = 0
    for chunk in chunks:
        got.append(chunk)
        n += len(chunk)
        if n >= limit:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} of {limit} bytes after {REQUEST_DEADLINE_S:.0f} s, the most one request may take")
    return b"".join(got)[:limit]


def remote_header(repo_id: str, filename: str, revision: str, token=None) -> Header:
    """The validated header of the safetensors file `filename` of `repo_id` at `revision`, read from the Hub."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=revision)
    where = f"{repo_id}/{filename}@{revision}"
    data, size = _get(url, 0, FIRST_BYTES - 1, token)
    if len(data) < 8:
        raise InputError(f"{where}: {size} bytes, too short for a safetensors header; the file on the Hub is not a "
                         "safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data) and n <= MAX_HEADER_BYTES and 8 + n <= size:
        data += _get(url, len(data), 8 + n - 1, token)[0]
    header = parse_header(data[:8], lambda k: data[8:8 + k], size, where)
    return Header(Path(filename), header.file_size, header.data_start, header.tensors, header.metadata)


def describing_files(repo_id: str, revision: str | None) -> Path:
    """The revision's snapshot folder, holding the files that describe the checkpoint (config.json; the index and
    a manifest where the repo has them), downloaded into the cache: kilobytes, where the weights are hundreds of
    GB. Shards an earlier download left in that folder are used as they are."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE")
    config = Path(huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache))
    commit = config.parent.name  # pinned: the other files and the headers come from the same commit
    for name in (INDEX_NAME, MANIFEST_NAME):
        try:
            huggingface_hub.hf_hub_download(repo_id, name, revision=commit, cache_dir=cache)
        except EntryNotFoundError:
            pass
    return config.parent


def remote_headers(repo_id: str, revision: str, names: list[str]) -> tuple[dict[str, Header], list[str]]:
    """({shard: header} read from the Hub, problems), on a few threads: one round trip per shard, each small."""
    def one(rel: str):
        try:
            return remote_header(repo_id, rel, revision), None
        except InputError as e:
            return None, str(e)
        except OSError as e:  # huggingface_hub's HTTP errors; transport errors (_get raises them as ConnectionError)
            return None, (f"{repo_id}/{rel}@{revision}: reading its header from the Hub failed "
                          f"({e.__class__.__name__}: {' '.join(str(e).split())[:200]}); check the network and token")

    results = _on_daemon_threads(one, list(dict.fromkeys(names)), HEADER_THREADS)
    return {r: h for r, (h, _) in results.items() if h is not None}, [p for _, p in results.values() if p]


def _on_daemon_threads(fn, items: list, threads: int) -> dict:
    """{item: fn(item)} computed on daemon threads, which a Ctrl-C or SIGTERM does not wait for (a pool's
    threads are joined at exit, and a stuck request would hold the process); the main thread wakes every
    WAIT_STEP_S, so its signal handler runs at once."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()
    for item in items:
        todo.put(item)

    def work():
        while True:
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((item, fn(item), None))
            except BaseException as e:  # noqa: BLE001 - raised again in the main thread, which would wait forever
                done.put((item, None, e))

    for _ in range(min(threads, len(items))):
        threading.Thread(target=work, daemon=True, name="fimoe-remote-header").start()
    results: dict = {}
    while len(results) < len(items):
        try:
            item, value, error = done.get(timeout=WAIT_STEP_S)
        except queue.Empty:
            continue
        if error is not None:
            raise error
        results[item] = value
    return {item: results[item] for item in items}
