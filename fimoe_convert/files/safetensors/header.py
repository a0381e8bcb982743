"""The safetensors header: its format (length, JSON, 8-byte alignment), strict validation with errors that name
the tensor, and the header bytes of a file to write.

Hand-written because the `safetensors` package neither validates a header with errors that name the tensor, nor
builds a header for a file written piece by piece; files read and written here stay readable by
`safetensors.safe_open` (tests check it)."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ...dtypes import DTYPES, tensor_nbytes, torch_dtype
from ...errors import CONTROL, InputError
from ..jsonfile import check_items
from ..safe_open import open_regular

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own cap
MAX_HEADER_ITEMS = 4_000_000  # JSON items (~11 a tensor): a single-file V4-Pro header would have ~1.6 M
HEADER_ALIGN = 8  # bytes; headers are space-padded so data starts 8-aligned


@dataclass(frozen=True)
class TensorInfo:
    """One header entry; offsets are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Header:
    path: Path
    file_size: int
    data_start: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]


class _Twice(ValueError):
    pass


def _once(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        raise _Twice(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def parse_header(raw_len: bytes, read_json, file_size: int, where: str) -> Header:
    """Validate a safetensors header. `read_json(n)` returns the n header bytes; `where` names
    the file in errors. Checks: length vs file size, JSON, dtypes, shapes, offsets contiguous,
    in bounds, and bytes == shape x dtype."""
    if file_size < 8 or len(raw_len) < 8:
        raise InputError(f"{where}: file is {file_size} bytes, too short for a safetensors header "
                         "(8-byte length expected); the download is truncated, fetch it again")
    (n,) = struct.unpack("<Q", raw_len)
    if n > MAX_HEADER_BYTES:
        raise InputError(f"{where}: header length {n} bytes exceeds the {MAX_HEADER_BYTES}-byte limit; "
                         "the file is corrupt or not safetensors")
    if 8 + n > file_size:
        raise InputError(f"{where}: header length {n} bytes runs past the end of the {file_size}-byte file; "
                         "the download is truncated, fetch it again")
    raw = read_json(n)
    check_items(raw, f"{where}: header", "the file is corrupt or not safetensors", MAX_HEADER_ITEMS)
    try:
        obj = json.loads(raw, object_pairs_hook=_once)
    except _Twice as e:  # two entries of one name: which of them a reader takes is its own choice
        raise InputError(f"{where}: header names {e.args[0][:120]!r} twice; the file is corrupt or not one safetensors "
                         "writes (each tensor once): fetch or convert it again") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, >4300-digit ints, deep nesting
        raise InputError(f"{where}: header is not valid JSON ({e.__class__.__name__}: {e}); "
                         "the file is corrupt or not safetensors") from None
    if not isinstance(obj, dict):
        raise InputError(f"{where}: header is a JSON {type(obj).__name__}, expected an object")
    metadata = obj.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise InputError(f"{where}: __metadata__ must map strings to strings")
    data_start = 8 + n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        if CONTROL.search(name) or not name.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == name:
            raise InputError(f"{where}: tensor name {name[:60]!r} holds a control character or a lone surrogate (not "
                             "valid Unicode); the file is corrupt or not safetensors")
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise InputError(f"{where}: tensor {name!r}: header entry must have exactly dtype, shape, "
                             f"data_offsets; saw {entry!r:.200}")
        dtype, shape, offs = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise InputError(f"{where}: tensor {name!r}: unknown dtype {dtype!r}; expected one of "
                             f"{', '.join(DTYPES)}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise InputError(f"{where}: tensor {name!r}: shape {shape!r} is not a list of non-negative ints")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)
                and 0 <= offs[0] <= offs[1]):
            raise InputError(f"{where}: tensor {name!r}: data_offsets {offs!r} are not [begin, end] "
                             "with 0 <= begin <= end")
        want = tensor_nbytes(dtype, shape)
        if offs[1] - offs[0] != want:
            raise InputError(f"{where}: tensor {name!r}: {offs[1] - offs[0]} bytes in the file, but "
                             f"{dtype} {shape} needs {want}; the file is corrupt")
        tensors[name] = TensorInfo(name, dtype, tuple(shape), data_start + offs[0], data_start + offs[1])
    cursor = data_start
    for t in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if t.start != cursor:
            kind = "overlaps the previous tensor" if t.start < cursor else f"leaves a hole of {t.start - cursor} bytes"
            raise InputError(f"{where}: tensor {t.name!r} at data offset {t.start - data_start} {kind} "
                             f"(expected offset {cursor - data_start}); the file is corrupt")
        cursor = t.end
    if cursor != file_size:
        what = "is truncated" if cursor > file_size else "has trailing bytes"
        raise InputError(f"{where}: data ends at byte {cursor} but the file has {file_size} bytes: it {what}; "
                         "fetch it again")
    return Header(Path(where), file_size, data_start, tensors, metadata)


def read_header(path: Path, where: str | None = None) -> Header:
    """Read and validate the header of the safetensors file at `path` (no tensor data)."""
    where = where or str(path)
    try:
        with open_regular(path) as f:  # a FIFO would block: refused
            size = os.fstat(f.fileno()).st_size
            header = parse_header(f.read(8), f.read, size, where)
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e.strerror})") from None
    return Header(path, header.file_size, header.data_start, header.tensors, header.metadata)



def as_typed(raw, dtype: str, shape: tuple[int, ...]):
    """View raw uint8 bytes (a torch tensor) as a typed tensor of `shape` (F4 keeps its packed byte shape)."""
    tdtype = torch_dtype(dtype)
    if dtype == "F4":
        shape = (*shape[:-1], shape[-1] // 2)
    return raw.view(tdtype).reshape(shape)



@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


def build_header(tensors: list[PlannedTensor], metadata: dict[str, str] | None) -> bytes:
    """Header bytes (length prefix included) with data laid out in list order and JSON keys sorted."""
    entries: dict[str, object] = {}
    offset = 0
    for t in tensors:
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    if metadata:
        entries["__metadata__"] = dict(metadata)
    body = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    body += b" " * (-(8 + len(body)) % HEADER_ALIGN)
    return struct.pack("<Q", len(body)) + body

