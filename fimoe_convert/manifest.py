"""`fimoe-manifest.json` (schema `fimoe-manifest/1`): write atomically, read, verify an output folder,
and read output tensors by name (for `verify --deep` and the runtime shim)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import InputError
from .safetensors_io import TMP_SUFFIX, atomic_write_bytes, read_header, read_tensors, sha256_file

SCHEMA = "fimoe-manifest/1"
MANIFEST_NAME = "fimoe-manifest.json"
INDEX_NAME = "model.safetensors.index.json"


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


def is_temporary(name: str) -> bool:
    return name.endswith(TMP_SUFFIX)


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


def verify_files(out_dir: Path, manifest: dict | None = None) -> VerifyResult:
    """Re-hash every file the manifest lists; check the index, the manifest and every shard header agree."""
    out_dir = Path(out_dir)
    manifest = manifest or read_manifest(out_dir)
    problems: list[str] = []
    if manifest.get("complete") is not True:
        problems.append(f"{out_dir / MANIFEST_NAME}: complete is not true; the conversion did not finish "
                        "(run it again with --resume)")
    files = manifest.get("files") or {}
    total = 0
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
        sha = sha256_file(path)
        if sha != want["sha256"]:
            problems.append(f"{path}: sha256 {sha[:16]}..., manifest says {want['sha256'][:16]}...; "
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


def read_output_tensors(out_dir: Path, names: list[str], device: str = "cpu") -> dict[str, torch.Tensor]:
    """Tensors by name from a converted folder, straight to `device`, opening only the shards that hold them."""

    out_dir = Path(out_dir)
    weight_map = json.loads((out_dir / INDEX_NAME).read_text())["weight_map"]
    by_file: dict[str, list[str]] = {}
    for name in names:
        if name not in weight_map:
            raise InputError(f"{out_dir / INDEX_NAME}: tensor {name!r} not found; the output was made by another "
                             "target or version, convert again")
        by_file.setdefault(weight_map[name], []).append(name)
    out: dict[str, torch.Tensor] = {}
    for rel, ns in sorted(by_file.items()):
        out.update(read_tensors(out_dir / rel, ns, device))
    return out
