"""A Hub checkpoint described without downloading its weights: config.json and the index are fetched into the
Hugging Face cache (small files), and each shard's header is read from the Hub with two ranged requests (its
length, then its JSON), then validated exactly as a local header is. For `inspect` and `--dry-run` of a repo id
whose weights are not in the cache: at V4 size a download would take hours before anything is said.
Hand-written beside huggingface_hub's `parse_safetensors_file_metadata`, which returns parsed tensors without the
header's bytes or the file's size: the strict checks a local header gets (offsets within the file) need both."""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import InputError
from .safetensors import MAX_HEADER_BYTES, Header, parse_header

FIRST_BYTES = 1 << 20  # the first request asks for this much: most headers (V4's are about 100-300 KB) fit


def _get(url: str, start: int, end: int, token) -> tuple[bytes, int]:
    """Bytes [start, end] of the file at `url` and the file's total size (from Content-Range)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    try:
        r = get_session().get(url, headers={**build_hf_headers(token=token), "Range": f"bytes={start}-{end}"},
                              follow_redirects=True)
    except OSError:
        raise
    except Exception as e:  # the HTTP client's transport errors are not OSErrors: made one, as a socket's would be
        raise ConnectionError(f"{e.__class__.__name__}: {e}") from e
    hf_raise_for_status(r)
    total = r.headers.get("Content-Range", "").rpartition("/")[2]
    size = int(total) if total.isdigit() else int(r.headers.get("Content-Length", len(r.content)))
    return r.content, size


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
