"""The OUT folder: its manifest (`fimoe-manifest.json`, schema `fimoe-manifest/1`) and per-rank status files,
written atomically and read back; checks of OUT before a conversion; clearing an earlier conversion; verifying
a finished folder; reading output tensors by name (for `verify --deep` and the runtime shim)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .safetensors import INDEX_NAME, TMP_SUFFIX, atomic_write_bytes, read_header, read_tensors, sha256_file

SCHEMA = "fimoe-manifest/1"
MANIFEST_NAME = "fimoe-manifest.json"
SHARD_GLOB = "model-*-of-*.safetensors"


def dumps(obj: dict) -> bytes:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline (byte-identical across runs)."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, dumps(obj))


def write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_manifest(out_dir: Path, manifest: dict) -> None:
    write_json(Path(out_dir) / MANIFEST_NAME, manifest)


def read_manifest(out_dir: Path, require_complete: bool = False) -> dict:
    path = Path(out_dir) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: not found; {out_dir} is not a fimoe-convert output folder "
                         "(run fimoe-convert SRC OUT first)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e}); the output is damaged, convert again with --overwrite") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        seen = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise InputError(f"{path}: schema is {seen!r}, expected {SCHEMA!r}; convert again with this version")
    if require_complete and data.get("complete") is not True:
        raise InputError(f"{path}: the conversion did not finish (complete is not true); "
                         "run the same fimoe-convert command with --resume")
    return data


RANK_STATUS = "fimoe-status.rank{rank}.json"


def write_rank_status(out_dir: Path, rank: int, files: dict) -> None:
    """Shards one rank of a distributed run has finished ({file: {size, sha256}})."""
    write_json(Path(out_dir) / RANK_STATUS.format(rank=rank), {"rank": rank, "files": files})


def read_rank_status(out_dir: Path) -> dict:
    files: dict = {}
    for p in sorted(Path(out_dir).glob(RANK_STATUS.format(rank="*"))):
        try:
            files.update(json.loads(p.read_text())["files"])
        except (json.JSONDecodeError, KeyError, OSError):
            continue  # a torn status file only means those shards are redone
    return files


def remove_rank_status(out_dir: Path) -> None:
    for p in Path(out_dir).glob(RANK_STATUS.format(rank="*")):
        p.unlink()


def copy_file(src: Path, dst: Path) -> None:
    """Copy a small file through a temporary name (tokenizer files and the like)."""
    atomic_write_bytes(dst, Path(src).read_bytes())


def remove_temporaries(out_dir: Path) -> None:
    for p in Path(out_dir).glob("*" + TMP_SUFFIX):
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
    """Re-hash every file the manifest lists (in parallel; `progress(done bytes, total bytes)`); check the index,
    the manifest and every shard header agree."""
    from .hashing import hash_files

    out_dir = Path(out_dir)
    manifest = manifest or read_manifest(out_dir)
    problems: list[str] = []
    if manifest.get("complete") is not True:
        problems.append(f"{out_dir / MANIFEST_NAME}: complete is not true; the conversion did not finish "
                        "(run it again with --resume)")
    files = manifest.get("files") or {}
    total = 0
    sized: list[Path] = []
    for rel in sorted(files):
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
    index_path = out_dir / INDEX_NAME
    if INDEX_NAME in files and index_path.is_file() and not problems:
        index = json.loads(index_path.read_text())
        shards = {rel for rel in files if rel.endswith(".safetensors")}
        held: dict[str, str] = {}
        total_size = 0
        for rel in sorted(shards):
            try:
                header = read_header(out_dir / rel)
            except InputError as e:
                problems.append(str(e))
                continue
            for name, info in header.tensors.items():
                held[name] = rel
                total_size += info.nbytes
        if index.get("weight_map") != held:
            diff = sorted(set(index.get("weight_map", {}).items()) ^ set(held.items()))
            problems.append(f"{index_path}: weight_map disagrees with the shard headers, e.g. {diff[:2]}")
        if index.get("metadata", {}).get("total_size") != total_size:
            problems.append(f"{index_path}: metadata.total_size is {index.get('metadata', {}).get('total_size')}, "
                            f"the shards hold {total_size} tensor bytes")
    return VerifyResult(len(files), total, problems)


def read_output_tensors(out_dir: Path, names: list[str], device: str = "cpu") -> dict:
    """Tensors by name from a converted folder, straight to `device`, opening only the shards that hold them."""

    out_dir = Path(out_dir)
    weight_map = json.loads((out_dir / INDEX_NAME).read_text())["weight_map"]
    by_file: dict[str, list[str]] = {}
    for name in names:
        if name not in weight_map:
            raise InputError(f"{out_dir / INDEX_NAME}: tensor {name!r} not found; the output was made by another "
                             "target or version, convert again")
        by_file.setdefault(weight_map[name], []).append(name)
    out: dict = {}
    for rel, ns in sorted(by_file.items()):
        out.update(read_tensors(out_dir / rel, ns, device))
    return out


def check_out(src: Path, out: Path, resume: bool, overwrite: bool) -> list[str]:
    """Problems with OUT as the destination of a conversion of the checkpoint folder `src`."""
    problems = []
    out_r = out.resolve()
    if out_r == src or out_r.is_relative_to(src):
        problems.append(f"OUT {out}: lies inside SRC {src}; choose a folder outside the checkpoint "
                        "(fimoe-convert never writes into its input)")
        return problems  # OUT == SRC would also 'contain SRC' and 'not be empty': one line says it
    if src.is_relative_to(out_r):
        problems.append(f"OUT {out}: contains SRC {src}; choose an empty folder elsewhere")
    parent = out_r if out_r.exists() else out_r.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        problems.append(f"OUT {out}: {parent} is not writable; choose a folder you can write to")
    if out_r.exists() and not out_r.is_dir():
        problems.append(f"OUT {out}: is a file; expected a folder")
    elif out_r.is_dir() and any(out_r.iterdir()) and not (resume or overwrite):
        problems.append(f"OUT {out}: is not empty; pass --resume to finish an interrupted conversion, "
                        "--overwrite to replace it, or choose an empty folder")
    elif overwrite and out_r.is_dir() and any(out_r.iterdir()) and not (out_r / MANIFEST_NAME).exists():
        problems.append(f"OUT {out}: --overwrite replaces only a fimoe-convert output, and this folder has no "
                        f"{MANIFEST_NAME}; choose an empty folder")
    return problems


def free_disk(out: Path) -> tuple[Path, int]:
    """(the nearest existing folder of OUT, its free bytes)."""
    root = out.resolve()
    while not root.exists():
        root = root.parent
    return root, shutil.disk_usage(root).free


def prepare_out(out_dir: Path, overwrite: bool) -> None:
    """Create OUT; with `overwrite`, first remove what an earlier conversion wrote (the manifest's files,
    shards, status files, temporaries); temporaries of an interrupted run go in any case."""
    if overwrite and out_dir.exists():
        old = read_manifest(out_dir)
        for rel in list(old.get("files", {})) + list(old.get("status", {})):
            (out_dir / rel).unlink(missing_ok=True)
        for p in out_dir.glob(SHARD_GLOB):
            p.unlink()
        remove_temporaries(out_dir)
        remove_rank_status(out_dir)
        (out_dir / MANIFEST_NAME).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_temporaries(out_dir)


def strays(out_dir: Path, names: set[str]) -> list[str]:
    """Files under OUT (relative, sorted) other than `names`."""
    return sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*")
                  if p.is_file() and p.relative_to(out_dir).as_posix() not in names)


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
