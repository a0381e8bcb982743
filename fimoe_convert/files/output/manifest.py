"""The manifest file (`fimoe-manifest.json`), the contract between a conversion, --resume, verify, inspect, the
model card, upload and the runtime: read (checked by records.py's strict reader, errors naming the file and the
field) and written (canonical JSON) here only; and the per-rank status files of a torchrun launch, which hold the
same file records. The records themselves are records.py's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import InputError
from ...records import SCHEMA, FileRecord, Manifest, RankStatus, read_record
from ..jsonfile import read_json
from ..names import MANIFEST_NAME, RANK_STATUS
from ..paths import name_problem
from .atomic import atomic_write_bytes

# What to do about a manifest that is damaged or of another schema, by what was being done with it. Never the
# command that just failed.
REMEDY = {
    "read": "convert into this folder again with --overwrite (or, for another schema, use the fimoe-convert version "
            "that wrote it)",
    "resume": "--resume cannot continue from it: run the command with --overwrite in place of --resume (it "
              "replaces this folder's conversion), or choose an empty OUT",
}


def dumps(obj) -> bytes:
    """Canonical JSON of a record or a JSON value: sorted keys, fixed indentation, trailing newline (byte-identical
    across runs)."""
    value = obj.to_json() if hasattr(obj, "to_json") else obj
    return (json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


# ----------------------------------------------------------------------------------------------- the files

def write_manifest(out_dir: Path, manifest: Manifest) -> None:
    atomic_write_bytes(Path(out_dir) / MANIFEST_NAME, dumps(manifest))


def read_manifest(out_dir: Path, require_complete: bool = False, purpose: str = "read") -> Manifest:
    """OUT's manifest, checked: JSON limits, then the schema name, then every field the code relies on. A damaged
    or other-schema manifest is an InputError saying what to do for `purpose` (a key of REMEDY)."""
    out_dir = Path(out_dir)
    path = out_dir / MANIFEST_NAME
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"OUT {out_dir}: is a file; expected a folder written by fimoe-convert")
    fix = f"the manifest is damaged: {REMEDY[purpose]}"
    outside = path.is_symlink() and name_problem(MANIFEST_NAME, out_dir, str(path), "manifest", "OUT")
    if outside:  # a link out of OUT: what it points to is not this output's
        raise InputError(f"{outside}; {fix}")
    data = read_json(path, "manifest", fix=fix, missing=f"{out_dir} is not a fimoe-convert output folder "
                                                         "(run fimoe-convert SRC OUT first)")
    seen = data.get("schema") if isinstance(data, dict) else None
    if isinstance(data, dict) and seen != SCHEMA:
        raise InputError(f"{path}: schema is {str(seen)[:60]!r}, expected {SCHEMA!r}; it was not written by this "
                         f"version of fimoe-convert: {REMEDY[purpose]}")
    manifest = read_record(Manifest, data, str(path), fix)
    manifest.out_dir = out_dir
    if require_complete and manifest.complete is not True:
        raise InputError(f"{path}: the conversion did not finish (complete is not true); "
                         "run the same fimoe-convert command with --resume")
    return manifest


def manifest_problem(out_dir: Path, purpose: str) -> str | None:
    """Why OUT's manifest cannot be used for `purpose`, or None."""
    try:
        read_manifest(out_dir, purpose=purpose)
    except InputError as e:
        return str(e)
    return None


def has_manifest(out_dir: Path) -> bool:
    return (Path(out_dir) / MANIFEST_NAME).exists()


class LiveManifest:
    """The manifest of a running conversion, changed by several threads (lanes, input hashers) and rewritten
    (atomically) after each change when `write`; a change made with `defer` (an input's sha256) waits for the next
    write, at most DEFER_S later (each write is the whole manifest: one per input was quadratic in the inputs).
    `close()` stops further changes (the hashers of a failed run may still finish)."""

    DEFER_S = 5.0  # seconds a deferred change may wait; lost in a kill, it only means that input is hashed again

    def __init__(self, out_dir: Path, manifest: Manifest, write: bool):
        self.out_dir, self.manifest, self.write = Path(out_dir), manifest, write
        self.lock = threading.Lock()
        self.closed = False
        self.pending = False  # a deferred change not written yet
        self.written_at = time.monotonic()  # the first manifest is written as this object is made

    def update(self, change: Callable[[Manifest], None], defer: bool = False) -> None:
        with self.lock:
            if self.closed:
                return
            change(self.manifest)
            if not self.write:
                return
            if defer and time.monotonic() - self.written_at < self.DEFER_S:
                self.pending = True
            else:
                self._write()

    def flush(self) -> None:
        """Write the deferred changes now (the last input hashed, the end of the run)."""
        with self.lock:
            if self.pending and self.write and not self.closed:
                self._write()

    def _write(self) -> None:
        write_manifest(self.out_dir, self.manifest)
        self.pending = False
        self.written_at = time.monotonic()

    def close(self) -> None:
        with self.lock:
            self.closed = True


def write_rank_status(out_dir: Path, rank: int, files: dict[str, FileRecord]) -> None:
    """Shards one rank of a distributed run has finished."""
    atomic_write_bytes(Path(out_dir) / RANK_STATUS.format(rank=rank), dumps(RankStatus(rank, dict(files))))


def read_rank_status(out_dir: Path) -> dict[str, FileRecord]:
    files: dict[str, FileRecord] = {}
    for p in sorted(Path(out_dir).glob(RANK_STATUS.format(rank="*"))):
        try:
            files.update(read_record(RankStatus, read_json(p, "status"), str(p)).files)
        except InputError:
            continue  # a torn or damaged status file only means those shards are redone
    return files


def remove_rank_status(out_dir: Path) -> None:
    for p in Path(out_dir).glob(RANK_STATUS.format(rank="*")):
        if p.is_symlink() or p.is_file():
            p.unlink()
