"""The OUT folder, apart from its manifest (files/output/manifest.py): checks of OUT before a conversion; clearing an
earlier conversion; copying SRC's small files in; verifying a finished folder against its manifest; reading
output tensors by name (for `verify --deep` and the runtime shim)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...errors import InputError
from ...records import FileRecord, Manifest, OutIndex, VerifyResult, read_record
from ..hashing import sha256_file
from ..jsonfile import read_json
from ..names import INDEX_NAME, LOCK_NAME, MANIFEST_NAME, RANK_STATUS, TMP_SUFFIX
from ..paths import name_problem
from ..safetensors.header import read_header
from ..safetensors.reader import read_tensors
from .atomic import atomic_write_bytes, atomic_write_stream
from .manifest import dumps, manifest_problem, read_manifest

SHARD_GLOB = "model-*-of-*.safetensors"
COPY_BLOCK = 16 * 2**20  # bytes per read when copying SRC's small files (a tokenizer can be tens of MB)
OUT_DAMAGED = "the output is damaged: convert into it again with --overwrite"


def write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, dumps(obj))


def write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


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


def file_record(path: Path) -> FileRecord:
    return FileRecord(path.stat().st_size, sha256_file(path))


def read_out_index(index_path: Path) -> tuple[dict[str, str], int]:
    """(weight_map, metadata.total_size) of OUT's index, checked."""
    data = read_json(index_path, "index", fix=OUT_DAMAGED)
    index = read_record(OutIndex, data, str(index_path), OUT_DAMAGED)
    return index.weight_map, index.metadata.total_size


def verify_files(out_dir: Path, manifest: Manifest | None = None, progress=None) -> VerifyResult:
    """Re-hash every file the manifest lists (in parallel; `progress(done bytes, total bytes)`; names outside OUT
    refused, never opened); check that it lists the index and shards, and that the index, the manifest and every
    shard header agree."""
    from ..hashing import hash_files

    out_dir = Path(out_dir)
    manifest = manifest or read_manifest(out_dir)
    where = str(out_dir / MANIFEST_NAME)
    problems: list[str] = []
    if manifest.complete is not True:
        problems.append(f"{where}: complete is not true; the conversion did not finish (run it again with --resume)")
    files = manifest.files
    shards = sorted(rel for rel in files if rel.endswith(".safetensors"))
    if not shards or INDEX_NAME not in files:
        problems.append(f"{where}: lists {len(files)} files, {'no index' if INDEX_NAME not in files else 'an index'} "
                        f"and {len(shards)} shards; a complete conversion lists its index and its shards: convert "
                        "into this folder again with --overwrite")
    unwritten = sorted({f for f, st in manifest.status.items() if st != "written" or f not in files} |
                       {f for f in shards if manifest.status.get(f) != "written"})  # each shard recorded, and done
    if unwritten and manifest.complete is True:
        problems.append(f"{where}: shard {unwritten[0]!r} is not recorded as written, yet complete is true; the "
                        "manifest is damaged: convert into this folder again with --overwrite")
    numbered = _numbering_problem(shards)
    if numbered:
        problems.append(f"{where}: {numbered}; a shard is missing with its records: {OUT_DAMAGED}")
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
        if size != want.size:
            problems.append(f"{path}: {size} bytes, manifest says {want.size}")
            continue
        sized.append(path)
    hashes = hash_files(sized, progress)
    for path in sized:
        want = files[path.relative_to(out_dir).as_posix()]
        if hashes[path] != want.sha256:
            problems.append(f"{path}: sha256 {hashes[path][:16]}..., manifest says {want.sha256[:16]}...; "
                            "the file is damaged, convert again with --resume")
    if not problems:
        problems += _check_index(out_dir, shards)
    return VerifyResult(len(files), total, problems)


def _numbering_problem(shards: list[str]) -> str | None:
    """The shards named model-I-of-N must be N, numbered 1 to N (what the conversion writes)."""
    import re

    found = [m for rel in shards if (m := re.fullmatch(r"model-(\d{5})-of-(\d{5})\.safetensors", rel))]
    if not found:
        return None
    counts = sorted({int(m.group(2)) for m in found})
    numbers = sorted(int(m.group(1)) for m in found)
    if len(counts) != 1 or numbers != list(range(1, counts[0] + 1)):
        return (f"lists {len(found)} shards named model-I-of-N, numbered {numbers[:6]}"
                f"{'...' if len(numbers) > 6 else ''}, for N = {counts[:3]}")
    return None


def _check_index(out_dir: Path, shards: list[str]) -> list[str]:
    """The index against the headers of the manifest's shards (already checked against their records)."""
    index_path = out_dir / INDEX_NAME
    try:
        weight_map, index_total = read_out_index(index_path)
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
    if weight_map != held:
        diff = sorted(set(weight_map.items()) ^ set(held.items()))
        problems.append(f"{index_path}: weight_map disagrees with the shard headers, e.g. {diff[:2]}")
    if index_total != total_size:
        problems.append(f"{index_path}: metadata.total_size is {index_total}, "
                        f"the shards hold {total_size} tensor bytes")
    return problems


def read_output_tensors(out_dir: Path, names: list[str], device: str = "cpu") -> dict:
    """Tensors by name from a converted folder, straight to `device`, opening only the shards that hold them
    (and only shards the index names inside OUT)."""

    out_dir = Path(out_dir)
    index_path = out_dir / INDEX_NAME
    weight_map = read_out_index(index_path)[0]
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


def output_tensor_facts(out_dir: Path, names: list[str] | None = None
                        ) -> tuple[dict[str, int], dict[str, str], dict[str, tuple[str, int]]]:
    """({tensor: stored bytes}, {tensor: stored torch dtype name}, {tensor: (its shard, the tensor bytes of that
    shard)}) from the headers of the shards the index names inside OUT (only those holding `names` when given): what
    verify and the loader check a structure against, the same way."""
    from ...dtypes import DTYPES

    index_path = Path(out_dir) / INDEX_NAME
    weight_map = read_out_index(index_path)[0]
    wanted = set(weight_map.values()) if names is None else {weight_map[n] for n in names if n in weight_map}
    nbytes: dict[str, int] = {}
    dtypes: dict[str, str] = {}
    shards: dict[str, tuple[str, int]] = {}
    for rel in sorted(wanted):
        bad = name_problem(rel, Path(out_dir), str(index_path), "shard", "OUT")
        if bad:
            raise InputError(f"{bad}; {OUT_DAMAGED}")
        tensors = read_header(Path(out_dir) / rel).tensors
        total = sum(info.nbytes for info in tensors.values())
        for n, info in tensors.items():
            nbytes[n], dtypes[n], shards[n] = info.nbytes, DTYPES[info.dtype][1], (rel, total)
    return nbytes, dtypes, shards


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
    folder, and for a Hub snapshot the repo's cache folder; none: OUT alone). Folders are compared by device and
    inode, so that a link or a bind mount to SRC is SRC."""
    problems = []
    src = src_dirs[0] if src_dirs else None  # none: SRC is not opened yet (a Hub repo), only OUT is judged
    out_ids = ancestor_ids(out)
    out_self = same_file_id(out)
    for d in src_dirs:
        sid = same_file_id(d)
        if sid is not None and sid in out_ids:
            problems.append(f"OUT {out}: lies inside SRC {src} (the same folder, through its path, a link or a bind "
                            "mount); choose a folder outside the checkpoint (fimoe-convert never writes into its "
                            "input)")
            return problems  # OUT == SRC would also 'contain SRC' and 'not be empty': one line says it
    if src is not None and out_self is not None and out_self in ancestor_ids(src):
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
            _what_out_holds(out, len(others) - 1)
            if damaged is None else f"it holds an earlier conversion whose manifest cannot be used ({damaged}); pass "
                                    "--overwrite to replace it, or choose an empty folder"))
    return problems


def _what_out_holds(out: Path, entries: int) -> str:
    """What OUT's (readable) manifest says it holds, and only the flags that work on it."""
    m = read_manifest(out)
    o = m.options
    what = f"--target {o.target}" + (f" --ep-size {o.ep_size}" if o.ep_size != 1 else "") + "".join(
        f" --param {k}={v}" for k, v in sorted(o.params.items()))
    if m.complete:
        return (f"it holds a complete conversion ({what}, {entries} files); pass --overwrite to replace it, or "
                "choose an empty folder")
    return (f"it holds an unfinished conversion ({what}); pass --resume with those flags to finish it, --overwrite "
            "to replace it, or choose an empty folder")


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
        named = [*old.files, *old.status]
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


def matching_records(out_dir: Path, records: dict[str, FileRecord], progress=None) -> set[str]:
    """The names in `records` whose file in OUT has that size and sha256 (hashed in
    parallel; `progress(done bytes, total bytes)`)."""
    from ..hashing import hash_files

    sized = {out_dir / rel: rel for rel, rec in records.items()
             if (out_dir / rel).is_file() and (out_dir / rel).stat().st_size == rec.size}
    hashes = hash_files(list(sized), progress)
    return {rel for path, rel in sized.items() if hashes[path] == records[rel].sha256}
