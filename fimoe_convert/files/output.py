"""The OUT folder: its manifest (`fimoe-manifest.json`, schema `fimoe-manifest/1`) and per-rank status files,
written atomically and read back; checks of OUT before a conversion; clearing an earlier conversion; verifying
a finished folder; reading output tensors by name (for `verify --deep` and the runtime shim)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import InputError
from .jsonfile import Hex64, ListOf, MapOf, NonNeg, Nullable, Obj, OneOf, check, read_json
from .lock import LOCK_NAME
from .paths import name_problem
from .safetensors import (INDEX_NAME, TMP_SUFFIX, atomic_write_bytes, atomic_write_stream, read_header, read_tensors,
                          sha256_file)

SCHEMA = "fimoe-manifest/1"
MANIFEST_NAME = "fimoe-manifest.json"
SHARD_GLOB = "model-*-of-*.safetensors"
RANK_STATUS = "fimoe-status.rank{rank}.json"
COPY_BLOCK = 16 * 2**20  # bytes per read when copying SRC's small files (a tokenizer can be tens of MB)

# What the code relies on in a manifest; a file that does not fit is refused naming the field. `source.files`
# entries carry the input's identity (mtime_ns, ctime_ns, inode, dev) while the run is in progress (complete: false).
FILE_RECORD = Obj({"size": NonNeg, "sha256": Hex64}, {"report": Obj()})
SOURCE_FILE = Obj({"size": NonNeg, "sha256": Nullable(Hex64)},
                  {"mtime_ns": int, "ctime_ns": int, "inode": NonNeg, "dev": NonNeg})
MANIFEST_SCHEMA = Obj({
    "schema": str, "tool": Obj(), "model": Obj(),
    "options": Obj({"target": str, "shard_size": NonNeg, "ep_size": NonNeg, "arch": Nullable(str),
                    "allow_lossy": bool, "params": MapOf(str)}),
    "source": Obj({"spec": str, "files": MapOf(SOURCE_FILE)}, {"repo_id": Nullable(str), "revision": Nullable(str)}),
    "target": Obj({"name": str, "kernel_name": Nullable(str)},
                  {"runtime_module": Nullable(str), "needs_nvshmem": bool, "capabilities": ListOf(str),
                   "parameters": MapOf(str), "vllm_moe_backend": Nullable(str), "weight_format": str,
                   "activation_format": str}),
    "ep": Obj({"world_size": NonNeg, "expert_ranges": ListOf(ListOf(int))}),
    "layers": MapOf(Obj()),
    "files": MapOf(FILE_RECORD),
    "status": MapOf(OneOf(("pending", "written"))),
}, {"complete": bool, "report": Obj()})  # no `complete`: the conversion did not finish
STATUS_SCHEMA = Obj({"rank": NonNeg, "files": MapOf(FILE_RECORD)})
OUT_INDEX_SCHEMA = Obj({"weight_map": MapOf(str), "metadata": Obj({"total_size": NonNeg})})

OUT_DAMAGED = "the output is damaged: convert into it again with --overwrite"
# What to do about a manifest that is damaged or of another schema, by what was being done with it. Never the
# command that just failed.
REMEDY = {
    "read": "convert into this folder again with --overwrite (or, for another schema, use the fimoe-convert version "
            "that wrote it)",
    "resume": "--resume cannot continue from it: run the command with --overwrite in place of --resume (it "
              "replaces this folder's conversion), or choose an empty OUT",
}


def is_tool_name(name: str) -> bool:
    """A file name this tool writes into OUT for its own bookkeeping (never copied from SRC)."""
    return (name in (MANIFEST_NAME, LOCK_NAME) or name.endswith(TMP_SUFFIX)
            or fnmatch.fnmatchcase(name, RANK_STATUS.format(rank="*")))


def dumps(obj: dict) -> bytes:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline (byte-identical across runs)."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, dumps(obj))


def write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_manifest(out_dir: Path, manifest: dict) -> None:
    write_json(Path(out_dir) / MANIFEST_NAME, manifest)


def read_manifest(out_dir: Path, require_complete: bool = False, purpose: str = "read") -> dict:
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
    check(data, MANIFEST_SCHEMA, str(path), fix=fix)
    if require_complete and data.get("complete") is not True:
        raise InputError(f"{path}: the conversion did not finish (complete is not true); "
                         "run the same fimoe-convert command with --resume")
    return data


def manifest_problem(out_dir: Path, purpose: str) -> str | None:
    """Why OUT's manifest cannot be used for `purpose`, or None."""
    try:
        read_manifest(out_dir, purpose=purpose)
    except InputError as e:
        return str(e)
    return None


class LiveManifest:
    """The manifest of a running conversion, changed by several threads (lanes, input hashers) and rewritten
    (atomically) after each change when `write`; `close()` stops further changes (the hashers of a failed run
    may still finish)."""

    def __init__(self, out_dir: Path, data: dict, write: bool):
        self.out_dir, self.data, self.write = Path(out_dir), data, write
        self.lock = threading.Lock()
        self.closed = False

    def update(self, change: Callable[[dict], None]) -> None:
        with self.lock:
            if self.closed:
                return
            change(self.data)
            if self.write:
                write_manifest(self.out_dir, self.data)

    def close(self) -> None:
        with self.lock:
            self.closed = True


def write_rank_status(out_dir: Path, rank: int, files: dict) -> None:
    """Shards one rank of a distributed run has finished ({file: {size, sha256}})."""
    write_json(Path(out_dir) / RANK_STATUS.format(rank=rank), {"rank": rank, "files": files})


def read_rank_status(out_dir: Path) -> dict:
    files: dict = {}
    for p in sorted(Path(out_dir).glob(RANK_STATUS.format(rank="*"))):
        try:
            files.update(read_json(p, "status", STATUS_SCHEMA)["files"])
        except InputError:
            continue  # a torn or damaged status file only means those shards are redone
    return files


def remove_rank_status(out_dir: Path) -> None:
    for p in Path(out_dir).glob(RANK_STATUS.format(rank="*")):
        if p.is_symlink() or p.is_file():
            p.unlink()


def copy_file(src: Path, dst: Path) -> None:
    """Copy a file of SRC (tokenizer and the like) through a temporary name, in blocks: never whole in memory."""
    try:
        with open(src, "rb") as f:
            atomic_write_stream(dst, lambda out: shutil.copyfileobj(f, out, COPY_BLOCK))
    except OSError as e:  # reading SRC: writing errors come as InputError from atomic_write_stream
        raise InputError(f"{src}: cannot read it to copy it into OUT ({e.strerror}); the source changed during the "
                         "conversion, restore it and run the same command with --resume") from None


def remove_temporaries(out_dir: Path) -> None:
    for p in Path(out_dir).glob("*" + TMP_SUFFIX):
        if p.is_symlink() or p.is_file():
            p.unlink()


def file_record(path: Path) -> dict:
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


@dataclass(frozen=True)
class VerifyResult:
    files: int
    bytes: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_files(out_dir: Path, manifest: dict | None = None, progress=None) -> VerifyResult:
    """Re-hash every file the manifest lists (in parallel; `progress(done bytes, total bytes)`; names outside OUT
    refused, never opened); check that it lists the index and shards, and that the index, the manifest and every
    shard header agree."""
    from .hashing import hash_files

    out_dir = Path(out_dir)
    manifest = manifest or read_manifest(out_dir)
    where = str(out_dir / MANIFEST_NAME)
    problems: list[str] = []
    if manifest.get("complete") is not True:
        problems.append(f"{where}: complete is not true; the conversion did not finish (run it again with --resume)")
    files = manifest.get("files") or {}
    shards = sorted(rel for rel in files if rel.endswith(".safetensors"))
    if not shards or INDEX_NAME not in files:
        problems.append(f"{where}: lists {len(files)} files, {'no index' if INDEX_NAME not in files else 'an index'} "
                        f"and {len(shards)} shards; a complete conversion lists its index and its shards: convert "
                        "into this folder again with --overwrite")
    unwritten = sorted(f for f, st in manifest.get("status", {}).items() if st != "written" or f not in files)
    if unwritten and manifest.get("complete") is True:
        problems.append(f"{where}: shard {unwritten[0]!r} is not recorded as written, yet complete is true; the "
                        "manifest is damaged: convert into this folder again with --overwrite")
    total = 0
    sized: list[Path] = []
    for rel in sorted(files):
        bad = name_problem(rel, out_dir, where, "file", "OUT")
        if bad:
            problems.append(bad)
            continue
        want = files[rel]
        path = out_dir / rel
        if not path.is_file():
            problems.append(f"{path}: listed in the manifest but missing")
            continue
        size = path.stat().st_size
        total += size
        if size != want["size"]:
            problems.append(f"{path}: {size} bytes, manifest says {want['size']}")
            continue
        sized.append(path)
    hashes = hash_files(sized, progress)
    for path in sized:
        want = files[path.relative_to(out_dir).as_posix()]
        if hashes[path] != want["sha256"]:
            problems.append(f"{path}: sha256 {hashes[path][:16]}..., manifest says {want['sha256'][:16]}...; "
                            "the file is damaged, convert again with --resume")
    if not problems:
        problems += _check_index(out_dir, shards)
    return VerifyResult(len(files), total, problems)


def _check_index(out_dir: Path, shards: list[str]) -> list[str]:
    """The index against the headers of the manifest's shards (already checked against their records)."""
    index_path = out_dir / INDEX_NAME
    try:
        index = read_json(index_path, "index", OUT_INDEX_SCHEMA, fix=OUT_DAMAGED)
    except InputError as e:
        return [str(e)]
    problems: list[str] = []
    held: dict[str, str] = {}
    total_size = 0
    for rel in shards:
        try:
            header = read_header(out_dir / rel)
        except InputError as e:
            problems.append(str(e))
            continue
        for name, info in header.tensors.items():
            held[name] = rel
            total_size += info.nbytes
    if index["weight_map"] != held:
        diff = sorted(set(index["weight_map"].items()) ^ set(held.items()))
        problems.append(f"{index_path}: weight_map disagrees with the shard headers, e.g. {diff[:2]}")
    if index["metadata"]["total_size"] != total_size:
        problems.append(f"{index_path}: metadata.total_size is {index['metadata']['total_size']}, "
                        f"the shards hold {total_size} tensor bytes")
    return problems


def read_output_tensors(out_dir: Path, names: list[str], device: str = "cpu") -> dict:
    """Tensors by name from a converted folder, straight to `device`, opening only the shards that hold them
    (and only shards the index names inside OUT)."""

    out_dir = Path(out_dir)
    index_path = out_dir / INDEX_NAME
    weight_map = read_json(index_path, "index", OUT_INDEX_SCHEMA, fix=OUT_DAMAGED)["weight_map"]
    by_file: dict[str, list[str]] = {}
    for name in names:
        if name not in weight_map:
            raise InputError(f"{index_path}: tensor {name!r} not found; the output was made by another "
                             "target or version, convert again")
        by_file.setdefault(weight_map[name], []).append(name)
    out: dict = {}
    for rel, ns in sorted(by_file.items()):
        bad = name_problem(rel, out_dir, str(index_path), "shard", "OUT")
        if bad:
            raise InputError(f"{bad}; {OUT_DAMAGED}")
        out.update(read_tensors(out_dir / rel, ns, device))
    return out


def output_tensor_bytes(out_dir: Path) -> dict[str, int]:
    """{tensor name: stored bytes} from the headers of the shards the index names (only names inside OUT)."""
    index_path = Path(out_dir) / INDEX_NAME
    weight_map = read_json(index_path, "index", OUT_INDEX_SCHEMA, fix=OUT_DAMAGED)["weight_map"]
    found: dict[str, int] = {}
    for rel in sorted(set(weight_map.values())):
        bad = name_problem(rel, Path(out_dir), str(index_path), "shard", "OUT")
        if bad:
            raise InputError(f"{bad}; {OUT_DAMAGED}")
        found.update({n: info.nbytes for n, info in read_header(Path(out_dir) / rel).tensors.items()})
    return found


def same_file_id(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of `path` (links followed), or None if it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def ancestor_ids(path: Path) -> list[tuple[int, int]]:
    """(st_dev, st_ino) of the nearest existing folder of `path` and of every folder above it: what `path` lies
    in, whatever links or bind mounts lead there."""
    ids = []
    p = Path(os.path.realpath(path))  # links resolved before each `..`, as the kernel does (abspath would not)
    while True:
        found = same_file_id(p)
        if found:
            ids.append(found)
        if p.parent == p:
            return ids
        p = p.parent


def leftovers(out: Path) -> list[str]:
    """OUT's entries other than what an earlier run leaves before it has written anything (its lock file, its
    first manifest's temporary)."""
    return sorted(p.name for p in out.iterdir() if p.name not in (LOCK_NAME, MANIFEST_NAME + TMP_SUFFIX))


def check_out(src_dirs: list[Path], out: Path, resume: bool, overwrite: bool) -> list[str]:
    """Problems with OUT as the destination of a conversion of the checkpoint whose files lie in `src_dirs` (the
    folder, and for a Hub snapshot the repo's cache folder). Folders are compared by device and inode, so that a
    link or a bind mount to SRC is SRC."""
    problems = []
    src = src_dirs[0]
    out_ids = ancestor_ids(out)
    out_self = same_file_id(out)
    for d in src_dirs:
        sid = same_file_id(d)
        if sid is not None and sid in out_ids:
            problems.append(f"OUT {out}: lies inside SRC {src} (the same folder, through its path, a link or a bind "
                            "mount); choose a folder outside the checkpoint (fimoe-convert never writes into its "
                            "input)")
            return problems  # OUT == SRC would also 'contain SRC' and 'not be empty': one line says it
    if out_self is not None and out_self in ancestor_ids(src):
        problems.append(f"OUT {out}: contains SRC {src}; choose an empty folder elsewhere")
    parent = out.resolve() if out.exists() else out.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        problems.append(f"OUT {out}: {parent} is not writable; choose a folder you can write to")
    if out.exists() and not out.is_dir():
        problems.append(f"OUT {out}: is a file; expected a folder")
        return problems
    others = leftovers(out) if out.is_dir() else []
    if not others:
        return problems
    if MANIFEST_NAME not in others:
        flag = "--resume continues" if resume else "--overwrite replaces" if overwrite else None
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        problems.append(f"OUT {out}: " + (f"{flag} only a fimoe-convert output, and this folder holds no "
                                          f"{MANIFEST_NAME} but {len(others)} other entries ({shown})" if flag else
                                          f"is not empty ({shown})") + "; choose an empty folder, or move them away")
        return problems
    damaged = None if overwrite else manifest_problem(out, "resume" if resume else "read")
    if resume and damaged:
        problems.append(damaged)
    elif not (resume or overwrite):
        problems.append(f"OUT {out}: is not empty; " + (
            "pass --resume to finish an interrupted conversion, --overwrite to replace it, or choose an empty folder"
            if damaged is None else f"it holds an earlier conversion whose manifest cannot be used ({damaged}); pass "
                                    "--overwrite to replace it, or choose an empty folder"))
    return problems


def free_disk(out: Path) -> tuple[Path, int]:
    """(the nearest existing folder of OUT, its free bytes)."""
    root = out.resolve()
    while not root.exists():
        root = root.parent
    return root, shutil.disk_usage(root).free


def earlier_files(out_dir: Path) -> list[Path]:
    """What --overwrite removes from OUT before converting, the manifest last: the files its manifest names (only
    names inside OUT, never the lock), shards, status files. A damaged or other-schema manifest is taken over:
    only the tool's own file names go (what a new conversion does not rewrite stays, listed in no manifest)."""
    try:
        old = read_manifest(out_dir)
        named = [*old["files"], *old["status"]]
    except InputError:
        named = []
    where = str(out_dir / MANIFEST_NAME)
    found = [out_dir / rel for rel in named if rel not in (LOCK_NAME, MANIFEST_NAME)
             and name_problem(rel, out_dir, where) is None]
    found += sorted(out_dir.glob(SHARD_GLOB)) + sorted(out_dir.glob(RANK_STATUS.format(rank="*")))
    found.append(out_dir / MANIFEST_NAME)
    return [p for p in dict.fromkeys(found) if p.is_symlink() or p.is_file()]


def prepare_out(out_dir: Path, overwrite: bool) -> None:
    """Create OUT; with `overwrite`, first remove an earlier conversion (`earlier_files`). Temporaries go in any
    case (OUT holds a manifest of this tool, or nothing but the tool's own leftovers: check_out made sure)."""
    if overwrite and out_dir.is_dir():
        for p in earlier_files(out_dir):
            p.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_temporaries(out_dir)


def strays(out_dir: Path, names: set[str]) -> list[str]:
    """Files under OUT (relative, sorted) other than `names`."""
    return sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*")
                  if p.is_file() and p.relative_to(out_dir).as_posix() not in names | {LOCK_NAME})


def path_kind(path: str | Path) -> str:
    """"folder", "file" or "missing" (anything else that exists counts as a file)."""
    p = Path(path)
    return "folder" if p.is_dir() else "file" if p.exists() else "missing"


def file_sizes(out_dir: Path, names: list[str]) -> dict[str, int]:
    return {n: (out_dir / n).stat().st_size for n in names}


def has_manifest(out_dir: Path) -> bool:
    return (out_dir / MANIFEST_NAME).exists()


def matching_records(out_dir: Path, records: dict[str, dict], progress=None) -> set[str]:
    """The names in `records` ({file: {size, sha256}}) whose file in OUT has that size and sha256 (hashed in
    parallel; `progress(done bytes, total bytes)`)."""
    from .hashing import hash_files

    sized = {out_dir / rel: rel for rel, rec in records.items()
             if (out_dir / rel).is_file() and (out_dir / rel).stat().st_size == rec["size"]}
    hashes = hash_files(list(sized), progress)
    return {rel for path, rel in sized.items() if hashes[path] == records[rel]["sha256"]}
