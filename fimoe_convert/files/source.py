"""The input checkpoint: a local folder or a Hub snapshot; config, index, every shard header
validated before any tensor data is read; tensors read by name from whichever shard holds them."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..checkpoint import (EXPERT_LEGS, ModelSpec, expected_expert_tensors, model_spec_from_config, natural_key,
                          parse_expert_name)
from ..errors import InputError, UsageError, ValidationError
from .safetensors import INDEX_NAME, SINGLE_NAME, Header, TensorInfo, as_typed, read_bytes, read_header, sha256_file

# What a Hub download fetches: weights, configs, tokenizer files; not code or docs folders.
HUB_PATTERNS = ["*.safetensors", "*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "tokenizer*"]
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_EXAMPLES = 3  # missing tensors named per block in an error


@dataclass(frozen=True)
class FileRecord:
    size: int
    sha256: str | None  # None until hashed


@dataclass
class Source:
    """A validated checkpoint. `spec` is SRC as the user gave it (recorded, never resolved)."""

    spec: str
    root: Path
    repo_id: str | None
    revision: str | None
    config: dict
    model: ModelSpec
    weight_map: dict[str, str]
    headers: dict[str, Header]
    extra_files: list[str]
    _known_sha: dict[str, str] = field(default_factory=dict)

    def info(self, name: str) -> TensorInfo:
        return self.headers[self.weight_map[name]].tensors[name]

    def path_of(self, name: str) -> Path:
        return self.root / self.weight_map[name]

    def read_raw(self, name: str, out=None):
        """Raw bytes of tensor `name` (uint8, CPU)."""
        return read_bytes(self.path_of(name), self.info(name), out)

    def read_range(self, name: str, start: int, end: int):
        """Bytes [start, end) of tensor `name` (uint8, CPU), for streaming large copies."""
        info = self.info(name)
        part = TensorInfo(name, info.dtype, info.shape, info.start + start, info.start + end)
        return read_bytes(self.path_of(name), part)

    def read(self, name: str, pin: bool = False):
        """Tensor `name` with its checkpoint dtype and shape (CPU; in pinned memory with `pin`, so a copy
        to the GPU can run without waiting)."""
        import torch

        info = self.info(name)
        out = torch.empty(info.nbytes, dtype=torch.uint8, pin_memory=True) if pin else None
        return as_typed(self.read_raw(name, out), info.dtype, info.shape)

    def input_files(self) -> list[str]:
        """Every file the conversion reads: config, index, shards, copied files (sorted)."""
        names = {"config.json", *self.headers, *self.extra_files}
        if (self.root / INDEX_NAME).exists():
            names.add(INDEX_NAME)
        return sorted(names)

    def file_record(self, rel: str, compute_hash: bool = True) -> FileRecord:
        """Size and sha256 of an input file. No hashing for a Hub cache blob (named by its sha256) or a file that
        `hf download --local-dir` recorded and that has not changed since."""
        path = self.root / rel
        size = path.stat().st_size
        sha = self._known_sha.get(rel)
        if sha is None and path.is_symlink():
            target = Path(os.readlink(path)).name
            if _SHA256_RE.match(target):
                sha = target
        if sha is None:
            sha = local_dir_sha256(self.root, rel)
        if sha is None and compute_hash:
            sha = sha256_file(path)
            self._known_sha[rel] = sha
        return FileRecord(size, sha)

    def non_expert_tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (safetensors dtype, shape) of every tensor but the routed experts, in the index's order."""
        return {n: (self.info(n).dtype, self.info(n).shape) for n in self.weight_map if parse_expert_name(n) is None}

    def file_size(self, rel: str) -> int:
        """Bytes of an input file, 0 if it cannot be read (the error comes when it is read)."""
        try:
            return (self.root / rel).stat().st_size
        except OSError:
            return 0

    @property
    def total_bytes(self) -> int:
        return sum(h.file_size for h in self.headers.values())


# What `hf download --local-dir` leaves beside each file: commit, etag (an LFS file's sha256), download time.
LOCAL_DIR_METADATA = ".cache/huggingface/download/{rel}.metadata"


def local_dir_sha256(root: Path, rel: str) -> str | None:
    """The sha256 huggingface_hub recorded when it downloaded `rel` into the folder `root` (`--local-dir`), if the
    file has not changed since (huggingface_hub's own rule: mtime at most 1 s past the recorded time); else None.
    Read here without huggingface_hub's reader, which takes a lock file and deletes bad metadata: SRC is only read."""
    meta = root / LOCAL_DIR_METADATA.format(rel=rel)
    try:
        lines = meta.read_text().splitlines()
        etag, stamp = lines[1].strip(), float(lines[2])
        fresh = (root / rel).stat().st_mtime - 1 <= stamp
    except (OSError, IndexError, ValueError):
        return None
    return etag if fresh and _SHA256_RE.match(etag) else None


def download(spec: str, revision: str | None) -> dict:
    """Fetch the files a conversion of the Hub repo `spec` reads into the Hugging Face cache (resumable)."""
    if not _is_repo_id(spec):
        raise UsageError(f"SRC {spec!r}: not a Hub repo id (org/name); only a Hub repo is downloaded")
    root = resolve_source_root(spec, revision, offline=False)[0]
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {"repo_id": spec, "revision": root.name, "path": str(root), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files)}


def _is_repo_id(spec: str) -> bool:
    return bool(_REPO_ID_RE.match(spec)) and not spec.startswith((".", "/"))


def resolve_source_root(spec: str, revision: str | None, offline: bool) -> tuple[Path, Path, str | None, str | None]:
    """(root, allowed_root, repo_id, revision): a local folder as is; a Hub repo id downloaded
    (or found in the cache when offline) with huggingface_hub."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if revision:
            raise UsageError(f"--revision {revision}: SRC {spec!r} is a local folder; --revision applies to Hub repos only")
        root = path.resolve()
        return root, root, None, None
    if path.exists():
        raise UsageError(f"SRC {spec!r} is a file; expected a checkpoint folder or a Hub repo id (org/name)")
    if not _is_repo_id(spec):
        raise UsageError(f"SRC {spec!r}: no such folder, and not a Hub repo id (org/name)")
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = offline or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    try:
        # The cache location is read now, not at huggingface_hub's import, so a changed HF_HUB_CACHE counts.
        snap = Path(huggingface_hub.snapshot_download(spec, revision=revision, allow_patterns=HUB_PATTERNS,
                                                      local_files_only=offline,
                                                      cache_dir=os.environ.get("HF_HUB_CACHE")))
    except LocalEntryNotFoundError:
        hint = "run once without --offline/HF_HUB_OFFLINE=1 to fetch it" if offline else "check the network"
        raise InputError(f"SRC {spec!r} (revision {revision or 'main'}): not in the local Hugging Face cache; {hint}") from None
    except HfHubHTTPError as e:
        raise InputError(f"SRC {spec!r}: the Hub refused the download ({e.__class__.__name__}); "
                         "check the repo id, --revision and your token (HF_TOKEN)") from None
    # A cache snapshot is snapshots/<commit>/ whose files link into ../../blobs of the same repo.
    commit = snap.name if re.fullmatch(r"[0-9a-f]{40}", snap.name) else revision
    allowed = snap.parent.parent.resolve() if snap.parent.name == "snapshots" else snap.resolve()
    return snap, allowed, spec, commit


def _check_rel_path(rel: str, root: Path, allowed: Path, where: str) -> str | None:
    """Problem text when `rel` (from the index) could leave the snapshot, else None."""
    p = PurePosixPath(rel)
    if (not rel or not p.parts or p.is_absolute() or "\\" in rel or "\0" in rel
            or any(part in ("..", "") for part in rel.split("/")) or ":" in p.parts[0]):
        return f"{where}: shard file name {rel!r} is not a plain relative path inside the checkpoint; refusing it"
    full = root / rel
    try:
        resolved = full.resolve(strict=False)
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        return f"{where}: shard {rel!r} cannot be resolved ({getattr(e, 'strerror', None) or 'symlink loop'})"
    if not resolved.is_relative_to(allowed):
        return f"{where}: shard {rel!r} is a link to {resolved}, outside the checkpoint folder {allowed}; refusing it"
    return None


def _load_json(path: Path, what: str) -> dict:
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found; expected a DeepSeek V4 checkpoint folder") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: {what} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: {what} is a JSON {type(obj).__name__}; expected an object")
    return obj


def open_source(spec: str, revision: str | None = None, offline: bool = False) -> Source:
    """Resolve SRC and validate everything that can be checked without reading tensor data."""
    root, allowed, repo_id, commit = resolve_source_root(spec, revision, offline)
    config = _load_json(root / "config.json", "config.json")
    model = model_spec_from_config(config, where=str(root / "config.json"))
    problems: list[str] = []
    index_path = root / INDEX_NAME
    if index_path.exists():
        index = _load_json(index_path, "index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError(f"{index_path}: weight_map must map tensor names to shard file names")
    elif (root / SINGLE_NAME).exists():
        weight_map = {n: SINGLE_NAME for n in read_header(root / SINGLE_NAME).tensors}
    else:
        raise InputError(f"{root}: neither {INDEX_NAME} nor {SINGLE_NAME} found; expected a safetensors checkpoint")
    where = str(index_path)

    headers: dict[str, Header] = {}
    for rel in sorted(set(weight_map.values())):
        bad = _check_rel_path(rel, root, allowed, where)
        if bad:
            problems.append(bad)
            continue
        if not (root / rel).exists():
            hint = ("the Hub snapshot is incomplete: run again without --offline to finish the download"
                    if repo_id else "copy the missing file into the folder")
            problems.append(f"{where}: names shard {rel!r}, which does not exist; {hint}")
            continue
        try:
            headers[rel] = read_header(root / rel, where=str(root / rel))
        except InputError as e:
            problems.append(str(e))
    raise_if(problems)

    owner: dict[str, str] = {}
    for rel, header in headers.items():
        for name in header.tensors:
            if name in owner:
                problems.append(f"tensor {name!r} is in two shards, {owner[name]!r} and {rel!r}; "
                                "the checkpoint is ambiguous")
            owner[name] = rel
    for name, rel in sorted(weight_map.items()):
        if rel in headers and name not in headers[rel].tensors:
            problems.append(f"{where}: names tensor {name!r} in shard {rel!r}, which does not hold it")
    for name, rel in sorted(owner.items()):
        if name not in weight_map:
            problems.append(f"{root / rel}: holds tensor {name!r}, which the index does not list")
    raise_if(problems)
    tensors = {name: headers[rel].tensors[name] for name, rel in weight_map.items()}
    problems += check_experts(model, tensors)
    raise_if(problems)

    extra = sorted(p.name for p in root.iterdir()
                   if p.is_file() and not p.name.startswith(".") and p.name not in ("config.json", INDEX_NAME)
                   and not p.name.endswith(".safetensors") and p.resolve().is_relative_to(allowed))
    return Source(spec=spec, root=root, repo_id=repo_id, revision=commit, config=config, model=model,
                  weight_map=dict(weight_map), headers=headers, extra_files=extra)


def raise_if(problems: list[str]) -> None:
    if problems:
        raise ValidationError(problems)


def check_experts(model: ModelSpec, tensors: dict[str, TensorInfo]) -> list[str]:
    """Every routed expert of every MoE block has weight and scale of the expected dtype and shape,
    and no expert tensor lies outside the blocks and expert range the config declares."""
    problems: list[str] = []
    blocks = set(model.moe_blocks)
    expected = {leg: expected_expert_tensors(model, leg) for leg in EXPERT_LEGS}
    stray: list[str] = []
    wrong: list[tuple[tuple, str]] = []  # (sort key, problem) per expert tensor of the wrong dtype/shape
    for name, info in tensors.items():
        key = parse_expert_name(name)
        if key is None:
            continue
        if key.block not in blocks or key.expert >= model.n_routed_experts:
            stray.append(name)
            continue
        dtype, shape = expected[key.leg][key.kind]
        if key.kind == "scale" and model.expert_dtype == "fp8" and info.dtype == "F8_E8M0":
            dtype = "F8_E8M0"  # FP8 repackages (and fp8_block's default) keep E8M0 tile scales
        if (info.dtype, info.shape) != (dtype, shape):
            hint = ""
            if key.kind == "weight" and info.dtype == "F8_E4M3" and model.expert_dtype == "fp4":
                hint = "; these look like FP8 (Base) experts: set expert_dtype to 'fp8' in config.json"
            wrong.append(((key.kind != "weight", natural_key(name)),
                          f"tensor {name!r}: {info.dtype} {list(info.shape)}, expected {dtype} {list(shape)} "
                          f"(expert_dtype {model.expert_dtype}, hidden_size {model.hidden_size}, "
                          f"moe_intermediate_size {model.moe_intermediate_size}){hint}"))
    if len(wrong) > MAX_EXAMPLES:  # one line, not one per expert tensor, when config.json contradicts them all
        examples = "; ".join(text for _, text in sorted(wrong)[:MAX_EXAMPLES])
        problems.append(f"{len(wrong)} routed-expert tensors do not match config.json, e.g. {examples}; "
                        "config.json contradicts the tensors")
    else:
        problems += [text for _, text in wrong]
    if stray:
        problems.append(f"{len(stray)} routed-expert tensors lie outside the {len(blocks)} MoE blocks x "
                        f"{model.n_routed_experts} experts that config.json declares, e.g. {', '.join(sorted(stray)[:MAX_EXAMPLES])}; "
                        "config.json contradicts the tensors")
    for block in model.moe_blocks:
        missing = [f"{block}.ffn.experts.{j}.{leg}.{kind}"
                   for j in range(model.n_routed_experts) for leg in EXPERT_LEGS for kind in ("weight", "scale")
                   if f"{block}.ffn.experts.{j}.{leg}.{kind}" not in tensors]
        if missing:
            problems.append(f"{block}: {len(missing)} routed-expert tensors missing, e.g. "
                            f"{', '.join(missing[:MAX_EXAMPLES])}; the checkpoint is incomplete or config.json "
                            "declares more layers/experts than it holds")
    return problems
