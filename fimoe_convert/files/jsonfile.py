"""The one loader for every JSON file the tool reads (SRC's config.json and index, OUT's manifest and status
files): a byte limit per kind of file, a strict parse (UTF-8, no duplicate keys, no NaN or Infinity, integers
of at most 64 bits), a depth limit; records.py's strict reader then checks the fields. These files may come from
anyone (a downloaded checkpoint, an OUT fetched from the Hub), so every violation is an InputError naming the file
and the field, never another exception."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError
from ..sizes import human
from .safe_open import open_regular

# Bytes per kind of file. The largest real ones: V4-Pro's index ~12 MB (145,116 tensors); a kernel target's manifest
# for V4-Pro with EP 8 < 2 MB (62 blocks x 8 ranks of structures); a status file < 1 MB. About five times that: the
# bytes and their decoded text (up to 4 bytes a character) stay under ~600 MB.
MAX_BYTES = {"config": 16 << 20, "index": 64 << 20, "manifest": 64 << 20, "status": 16 << 20}
# JSON items (keys, values, containers) per file, counted before parsing: an item costs up to ~160 bytes of Python
# objects (`{},` is 3 bytes), so 2 M of them stay under ~350 MB. The largest real file, V4-Pro's index, has ~0.3 M.
MAX_ITEMS = 2_000_000
BYTES_PER_ITEM = 160  # the most a parsed item was measured to cost (an empty object in a list)
MAX_DEPTH = 64  # nesting levels; the deepest real file (a FlashInfer structure in the manifest) has < 12
MAX_INT = 2**63 - 1  # absolute value; larger integers are no count, size or offset of a real file
MAX_INT_DIGITS = 20  # digits read before the value is even built (json.loads' own cap is 4300)


class _Refused(ValueError):
    """Raised by the parse hooks; turned into an InputError naming the file."""


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS or abs(v := int(text)) > MAX_INT:
        raise _Refused(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is out of range "
                       f"(at most {MAX_INT} in absolute value)")
    return v


def _float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise _Refused(f"number {text[:24]} is out of range")
    return v


def _constant(text: str):
    raise _Refused(f"{text} is not JSON")


def _object(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"key {dup[:80]!r} appears twice in one object")
    return obj


def count_items(data: bytes) -> int:
    """An upper bound on the keys, values and containers in the JSON text `data`, at the speed of bytes.count: every
    value but a container's first follows a `,`, every key a `:`, every first value a `[` or `{` (the same characters
    inside strings only raise the bound)."""
    return 1 + sum(data.count(c) for c in (b",", b":", b"[", b"{"))


def check_items(data: bytes, where: str, fix: str, limit: int | None = None) -> None:
    """Refuse, before json.loads builds it, JSON whose objects would cost far more memory than its bytes."""
    limit = MAX_ITEMS if limit is None else limit
    if (n := count_items(data)) > limit:
        raise InputError(f"{where}: about {n} JSON items (keys, values and containers), more than the {limit} such a "
                         f"file may hold (reading them would take ~{human(n * BYTES_PER_ITEM)}); {fix}")


def parse_json(data: bytes, where: str, fix: str = "the file is damaged"):
    """The value in `data` (strict, see the module docstring); errors start with `where` and end with `fix`."""
    check_items(data, where, fix)
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_object, parse_int=_int, parse_float=_float,
                           parse_constant=_constant)
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 text (byte {e.start}); {fix}") from None
    except _Refused as e:
        raise InputError(f"{where}: {e}; {fix}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}") from None
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the C parser's stack
        raise InputError(f"{where}: not valid JSON ({e.__class__.__name__}: nested too deep or too long); "
                         f"{fix}") from None
    _check_depth_and_text(value, where, fix)
    return value


def _check_depth_and_text(value, where: str, fix: str) -> None:
    """No nesting deeper than MAX_DEPTH, and every string encodable as UTF-8 (a lone surrogate from a \\ud800
    escape would fail later, as a file name or in a written file)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items = list(v.items())
            for k, _ in items:
                _check_text(k, where, fix)
            children = [x for _, x in items]
        elif isinstance(v, list):
            children = v
        else:
            if isinstance(v, str):
                _check_text(v, where, fix)
            continue
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; {fix}")
        stack.extend((x, depth + 1) for x in children if isinstance(x, (dict, list, str)))


def _check_text(s: str, where: str, fix: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{where}: the string {s[:40]!r} is not valid Unicode (a lone surrogate); {fix}") from None


def read_json(path: Path, kind: str, *, fix: str = "the file is damaged", missing: str | None = None):
    """The JSON value of the file `path`, of `kind` (a key of MAX_BYTES).
    Every error names the file; `fix` ends those about its content (what to do), `missing` the one for a file
    that does not exist."""
    path = Path(path)
    limit = MAX_BYTES[kind]
    try:
        with open_regular(path) as f:  # a FIFO would block: refused
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: not found" + (f"; {missing}" if missing else "")) from None
    except OSError as e:
        why = e.strerror or e.__class__.__name__
        raise InputError(f"{path}: cannot read it ({why}); expected a JSON file") from None
    if len(data) > limit:
        raise InputError(f"{path}: larger than {limit} bytes, the most a {kind} file may have; {fix}")
    value = parse_json(data, str(path), fix)
    return value
