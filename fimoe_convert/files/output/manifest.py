"""The manifest (`fimoe-manifest.json`, schema `fimoe-manifest/1`), the contract between a conversion, --resume,
verify, inspect, the model card, upload and the runtime: typed here once, read (every field the code relies on
checked, errors naming the file and the field) and written (canonical JSON) here only; and the per-rank status
files of a torchrun launch, which hold the same file records."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import InputError
from ..jsonfile import BOOL, HEX64, INT, LIST, NONNEG, OBJ, STR, Fields, nullable, read_json, sub
from ..names import MANIFEST_NAME, RANK_STATUS
from ..paths import name_problem
from .atomic import atomic_write_bytes

SCHEMA = "fimoe-manifest/1"
STATUSES = ("pending", "written")
STATUS = ("one of " + ", ".join(repr(s) for s in STATUSES), lambda v: isinstance(v, str) and v in STATUSES)

# What to do about a manifest that is damaged or of another schema, by what was being done with it. Never the
# command that just failed.
REMEDY = {
    "read": "convert into this folder again with --overwrite (or, for another schema, use the fimoe-convert version "
            "that wrote it)",
    "resume": "--resume cannot continue from it: run the command with --overwrite in place of --resume (it "
              "replaces this folder's conversion), or choose an empty OUT",
}


def dumps(obj: dict) -> bytes:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline (byte-identical across runs)."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


# ------------------------------------------------------------------------------------------------ checking

# ----------------------------------------------------------------------------------------------- the records

@dataclass
class FileRecord:
    """A file of OUT: its size and sha256; for a shard, the target's report on the units whose first output
    it holds."""

    size: int
    sha256: str
    report: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d, path: str, f: Fields) -> FileRecord:
        f.value(d, OBJ, path)
        return cls(f.get(d, "size", NONNEG, path), f.get(d, "sha256", HEX64, path), f.obj(d, "report", path, {}))

    def to_json(self) -> dict:
        return {"size": self.size, "sha256": self.sha256, **({"report": self.report} if self.report else {})}


@dataclass
class SourceFile:
    """An input file of SRC: size and sha256 (None until hashed); while the run is in progress also its identity
    (mtime_ns, inode, dev, ctime_ns), so that --resume knows an unchanged file without reading it."""

    size: int
    sha256: str | None
    mtime_ns: int | None = None
    inode: int | None = None
    dev: int | None = None
    ctime_ns: int | None = None  # every write sets it and nothing sets it back (`touch -r` restores mtime only)

    @classmethod
    def from_json(cls, d, path: str, f: Fields) -> SourceFile:
        f.value(d, OBJ, path)
        return cls(f.get(d, "size", NONNEG, path), f.get(d, "sha256", nullable(HEX64), path),
                   f.get(d, "mtime_ns", INT, path, None), f.get(d, "inode", NONNEG, path, None),
                   f.get(d, "dev", NONNEG, path, None), f.get(d, "ctime_ns", INT, path, None))

    def identity(self) -> dict:
        return {k: v for k, v in (("size", self.size), ("mtime_ns", self.mtime_ns), ("ctime_ns", self.ctime_ns),
                                  ("inode", self.inode), ("dev", self.dev)) if v is not None}

    def to_json(self) -> dict:
        return {**self.identity(), "sha256": self.sha256}


@dataclass
class SourceRecord:
    spec: str  # SRC as it was given
    repo_id: str | None
    revision: str | None
    files: dict[str, SourceFile]

    @classmethod
    def from_json(cls, d: dict, path: str, f: Fields) -> SourceRecord:
        files = f.mapping(d, "files", path, lambda v, p: SourceFile.from_json(v, p, f))
        return cls(f.get(d, "spec", STR, path), f.get(d, "repo_id", nullable(STR), path, None),
                   f.get(d, "revision", nullable(STR), path, None), files)

    def to_json(self) -> dict:
        return {"spec": self.spec, "repo_id": self.repo_id, "revision": self.revision,
                "files": {rel: rec.to_json() for rel, rec in self.files.items()}}


@dataclass(frozen=True)
class Options:
    """The options that must match for --resume."""

    target: str
    shard_size: int
    ep_size: int
    arch: str | None
    allow_lossy: bool
    params: dict[str, str]

    @classmethod
    def from_json(cls, d: dict, path: str, f: Fields) -> Options:
        return cls(f.get(d, "target", STR, path), f.get(d, "shard_size", NONNEG, path),
                   f.get(d, "ep_size", NONNEG, path), f.get(d, "arch", nullable(STR), path),
                   f.get(d, "allow_lossy", BOOL, path), f.mapping(d, "params", path, lambda v, p: f.value(v, STR, p)))

    def to_json(self) -> dict:
        return {"target": self.target, "shard_size": self.shard_size, "ep_size": self.ep_size, "arch": self.arch,
                "allow_lossy": self.allow_lossy, "params": dict(self.params)}


@dataclass(frozen=True)
class TargetRecord:
    """The kernel's facts the runtime and the model card need, and the --param values it was converted with."""

    name: str
    kernel_name: str | None
    vllm_moe_backend: str | None = None
    capabilities: tuple[str, ...] = ()
    weight_format: str = ""
    activation_format: str = ""
    needs_nvshmem: bool = False
    runtime_module: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict, path: str, f: Fields) -> TargetRecord:
        g = f.get
        return cls(g(d, "name", STR, path), g(d, "kernel_name", nullable(STR), path),
                   g(d, "vllm_moe_backend", nullable(STR), path, None),
                   tuple(f.strings(d, "capabilities", path, [])), g(d, "weight_format", STR, path, ""),
                   g(d, "activation_format", STR, path, ""), g(d, "needs_nvshmem", BOOL, path, False),
                   g(d, "runtime_module", nullable(STR), path, None),
                   f.mapping(d, "parameters", path, lambda v, p: f.value(v, STR, p)) if "parameters" in d else {})

    def to_json(self) -> dict:
        return {"name": self.name, "kernel_name": self.kernel_name, "vllm_moe_backend": self.vllm_moe_backend,
                "capabilities": list(self.capabilities), "weight_format": self.weight_format,
                "activation_format": self.activation_format, "needs_nvshmem": self.needs_nvshmem,
                "runtime_module": self.runtime_module, "parameters": dict(self.parameters)}


@dataclass(frozen=True)
class EpRecord:
    world_size: int
    expert_ranges: tuple[tuple[int, int], ...]  # each rank's experts [first, last)

    @classmethod
    def from_json(cls, d: dict, path: str, f: Fields) -> EpRecord:
        ranges = []
        for i, r in enumerate(f.get(d, "expert_ranges", LIST, path)):
            where = sub(sub(path, "expert_ranges"), i)
            ranges.append(tuple(f.value(x, INT, sub(where, j)) for j, x in enumerate(f.value(r, LIST, where))))
        return cls(f.get(d, "world_size", NONNEG, path), tuple(ranges))

    def to_json(self) -> dict:
        return {"world_size": self.world_size, "expert_ranges": [list(r) for r in self.expert_ranges]}


@dataclass(frozen=True)
class Tool:
    """The versions that wrote the output (None: not installed)."""

    name: str
    version: str
    torch: str | None
    safetensors: str | None
    flashinfer: str | None

    @classmethod
    def from_json(cls, d: dict, path: str, f: Fields) -> Tool:
        return cls(*(f.get(d, k, STR if k in ("name", "version") else nullable(STR), path)
                     for k in ("name", "version", "torch", "safetensors", "flashinfer")))

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version, "torch": self.torch, "safetensors": self.safetensors,
                "flashinfer": self.flashinfer}


MODEL_FIELDS = ("hidden_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "moe_blocks")


@dataclass
class Manifest:
    """OUT's manifest. `model` is the checkpoint's geometry (ModelSpec.to_json, the MODEL_FIELDS checked);
    `layers` what the runtime needs to rebuild each block's objects ({block: {rank: record}}, the target's);
    `complete` None: a manifest without the field (the conversion did not finish); `out_dir` where it was read
    from (not written)."""

    tool: Tool
    options: Options
    source: SourceRecord
    model: dict
    target: TargetRecord
    ep: EpRecord
    layers: dict[str, dict]
    files: dict[str, FileRecord]
    status: dict[str, str]
    complete: bool | None = False
    report: dict | None = None
    schema: str = SCHEMA
    out_dir: Path | None = field(default=None, compare=False)

    @classmethod
    def from_json(cls, d, where: str, fix: str | None = None) -> Manifest:
        """The manifest in the parsed JSON `d`, every field the code relies on checked (`where`: the file)."""
        f = Fields(where, fix)
        f.value(d, OBJ, "")
        schema = f.get(d, "schema", STR, "")
        tool = Tool.from_json(f.obj(d, "tool", ""), "tool", f)
        model = f.obj(d, "model", "")
        for key in MODEL_FIELDS:
            f.get(model, key, NONNEG, "model")
        options = Options.from_json(f.obj(d, "options", ""), "options", f)
        source = SourceRecord.from_json(f.obj(d, "source", ""), "source", f)
        target = TargetRecord.from_json(f.obj(d, "target", ""), "target", f)
        ep = EpRecord.from_json(f.obj(d, "ep", ""), "ep", f)
        layers = f.mapping(d, "layers", "", lambda v, p: f.value(v, OBJ, p))
        files = f.mapping(d, "files", "", lambda v, p: FileRecord.from_json(v, p, f))
        status = f.mapping(d, "status", "", lambda v, p: f.value(v, STATUS, p))
        return cls(tool, options, source, model, target, ep, layers, files, status,
                   f.get(d, "complete", BOOL, "", None), f.obj(d, "report", "", None), schema)

    def to_json(self) -> dict:
        d = {"schema": self.schema, "tool": self.tool.to_json(), "options": self.options.to_json(),
             "source": self.source.to_json(), "model": self.model, "target": self.target.to_json(),
             "ep": self.ep.to_json(), "layers": self.layers,
             "files": {rel: rec.to_json() for rel, rec in self.files.items()}, "status": dict(self.status)}
        if self.complete is not None:
            d["complete"] = self.complete
        if self.report is not None:
            d["report"] = self.report
        return d

    @property
    def ep_size(self) -> int:
        return self.ep.world_size

    def written(self) -> dict[str, FileRecord | None]:
        """{shard: its record} of the shards recorded as written."""
        return {f: self.files.get(f) for f, st in self.status.items() if st == "written"}

    def layer_record(self, layer: str, rank: int) -> dict:
        """The `layers` record of MoE block `layer` and EP rank `rank` (an InputError naming what exists)."""
        where = self.out_dir if self.out_dir is not None else Path(".")
        if layer not in self.layers:
            known = ", ".join(list(self.layers)[:6])
            raise InputError(f"{where}: no MoE block {layer!r} in this output; blocks are {known}, ...")
        ranks = self.layers[layer]
        if str(rank) not in ranks:
            raise InputError(f"{where}: rank {rank} not in this output, which was sharded for "
                             f"--ep-size {self.ep_size} (ranks 0..{self.ep_size - 1})")
        rec = ranks[str(rank)]
        if not isinstance(rec, dict) or not isinstance(rec.get("structure"), dict):
            raise self.damaged(f"layers[{layer!r}][{str(rank)!r}] has no structure object")
        return rec

    def damaged(self, what: str) -> InputError:
        where = self.out_dir if self.out_dir is not None else Path(".")
        return InputError(f"{where / MANIFEST_NAME}: {what}; the manifest is damaged: convert into {where} again "
                          "with --overwrite")


# ----------------------------------------------------------------------------------------------- the files

def write_manifest(out_dir: Path, manifest: Manifest) -> None:
    atomic_write_bytes(Path(out_dir) / MANIFEST_NAME, dumps(manifest.to_json()))


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
    manifest = Manifest.from_json(data, str(path), fix)
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
    data = {"rank": rank, "files": {rel: rec.to_json() for rel, rec in files.items()}}
    atomic_write_bytes(Path(out_dir) / RANK_STATUS.format(rank=rank), dumps(data))


def read_rank_status(out_dir: Path) -> dict[str, FileRecord]:
    files: dict[str, FileRecord] = {}
    for p in sorted(Path(out_dir).glob(RANK_STATUS.format(rank="*"))):
        try:
            data = read_json(p, "status")
            f = Fields(str(p))
            f.value(data, OBJ, "")
            f.get(data, "rank", NONNEG, "")
            files.update(f.mapping(data, "files", "", lambda v, q, f=f: FileRecord.from_json(v, q, f)))
        except InputError:
            continue  # a torn or damaged status file only means those shards are redone
    return files


def remove_rank_status(out_dir: Path) -> None:
    for p in Path(out_dir).glob(RANK_STATUS.format(rank="*")):
        if p.is_symlink() or p.is_file():
            p.unlink()
