"""Every record the tool writes or returns, typed once (pure: no file access): the manifest (`fimoe-manifest.json`,
schema `fimoe-manifest/1`) and its parts, the one file record, the rank status and index files, and the results of
convert, verify, inspect, upload and targets.

One strict reader and one writer serve them all, derived from the dataclass fields: a field's type (its
annotation) says what a JSON value must be, `Annotated[int, NONNEG]` or `Annotated[str, SHA256]` a limit, a default
that the key may be missing, `key=` (field metadata) a JSON key that is no Python name, `omit=` when the key is left
out. Whatever does not fit (a wrong type, a limit, a missing key, a key the record does not have) is one InputError
`{file}: {field} is {value}; expected {what}; {fix}`. A union of records is read as the first whose required keys
the object has (a structure's nodes); `Annotated[X, CONTAINED]` keeps a part that does not read as a Damaged value
(its problem and its JSON, written back as it was), so that one damaged block of `layers` is one problem of verify
and a refusal of the loader for that block, not a manifest that cannot be read."""

from __future__ import annotations

import enum
import functools
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from .errors import InputError

SCHEMA = "fimoe-manifest/1"
MANIFEST_NAME = "fimoe-manifest.json"
DEMO_WORKDIR = "demo-out"  # `fimoe-convert demo`'s folder (--workdir's default); verify --deep looks there too

# ------------------------------------------------------------------------------------------------ the reader


@dataclass(frozen=True)
class Kind:
    """A limit on a JSON value: what a message says it expected, and the test."""

    expected: str
    test: typing.Callable[[Any], bool]


_HEX = frozenset("0123456789abcdef")
NONNEG = Kind("an integer >= 0", lambda v: type(v) is int and v >= 0)
SHA256 = Kind("a sha256 (64 hex digits)", lambda v: isinstance(v, str) and len(v) == 64 and set(v) <= _HEX)
_STR = Kind("a string", lambda v: isinstance(v, str))
_INT = Kind("an integer", lambda v: type(v) is int)
_BOOL = Kind("true or false", lambda v: type(v) is bool)
_OBJ = Kind("an object", lambda v: isinstance(v, dict))
_LIST = Kind("a list", lambda v: isinstance(v, list))
_FLOAT = Kind("a number", lambda v: type(v) in (int, float))
_SCALARS = {str: _STR, int: _INT, bool: _BOOL, float: _FLOAT}


class With:
    """Annotated[R, With(name=type)]: R read with those of its fields typed otherwise (a stricter use of it)."""

    def __init__(self, **types):
        self.types = types


def key(name: str, **meta) -> dict:
    """Field metadata: the field's JSON key is `name`."""
    return {"key": name, **meta}


NOT_NULL = "not null"  # Annotated[X | None, NOT_NULL]: the key may be missing (None), but a null is refused
OMIT_NONE = {"omit": "none"}  # field metadata: the key is left out while the value is None
OMIT_EMPTY = {"omit": "empty"}  # ... while the value is empty (or None)
INTERNAL = {"internal": True}  # not part of the JSON
# Annotated[X, CONTAINED]: a value that does not read as X is a Damaged (its problem, its JSON as it was), not an
# error of the whole file: the rest of the file is still used, and every such part is reported at once
CONTAINED = "contained"


@dataclass(frozen=True)
class Damaged:
    """A CONTAINED value that did not read: why (`problem`, its path from the value itself), and its JSON as it
    was, written back unchanged."""

    problem: str
    raw: Any


def shown(value) -> str:
    """A value as an error message shows it: scalars as repr (cut), containers by kind and size."""
    if isinstance(value, dict):
        return f"an object ({len(value)} keys)"
    if isinstance(value, list):
        return f"a list ({len(value)} items)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def sub(path: str, name) -> str:
    """The path of `name` (a key or a list index) inside `path`, as messages show it."""
    if isinstance(name, int):
        return f"{path}[{name}]"
    plain = name.replace("_", "").isalnum() and name.isascii()
    return (f"{path}.{name}" if path else name) if plain else f"{path}[{name!r}]"


class Reader:
    """Reads parsed JSON into records; the first value that does not fit is an InputError naming the file
    (`where`) and the field, ending with `fix`."""

    def __init__(self, where: str | None, fix: str | None = None):
        self.where, self.fix = where, fix

    def wrong(self, path: str, seen: str, expected: str) -> InputError:
        what = f"{path or ('the file' if self.where is not None else 'the record')} is {seen}; expected {expected}"
        return InputError((f"{self.where}: {what}" if self.where is not None else what)
                          + (f"; {self.fix}" if self.fix else ""))

    def read(self, tp, value, path: str = ""):
        """`value` read as the type `tp` (a record, a container of them, a union of records told apart by their
        keys, or a scalar)."""
        tp, metas = _unwrap(tp)
        if CONTAINED in metas:  # read on its own: its paths start at the value, its problem is kept
            try:
                rest = tuple(m for m in metas if m != CONTAINED)
                return Reader(None).read(Annotated[(tp, *rest)] if rest else tp, value)
            except InputError as e:
                return Damaged(str(e), value)
        nullable = False
        if _is_optional(tp):
            if value is None and NOT_NULL not in metas:
                return None
            tp, more = _unwrap(next(a for a in typing.get_args(tp) if a is not type(None)))
            metas, nullable = metas + more, NOT_NULL not in metas
        if _is_union(tp):
            return self.read(self.member(tp, value, path), value, path)
        kind = _kind(tp, metas)
        if not kind.test(value):
            raise self.wrong(path, shown(value), kind.expected + (" or null" if nullable else ""))
        origin = typing.get_origin(tp)
        if is_dataclass(tp):
            overrides = next((m.types for m in metas if isinstance(m, With)), {})
            return self.record(tp, value, path, overrides=overrides)
        if origin is dict:
            item = typing.get_args(tp)[1]
            return {k: self.read(item, v, sub(path, k)) for k, v in value.items()}
        if origin in (tuple, list):
            args = typing.get_args(tp)
            item = args[0]
            items = [self.read(item, v, sub(path, i)) for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return tp(value)
        return value

    def member(self, tp, value, path: str):
        """The member of the union `tp` that `value` is: the first record whose required keys the object has (then
        read strictly: a key it does not have is named), else the first other member whose kind fits."""
        members = typing.get_args(tp)
        if isinstance(value, dict):
            for m in members:
                if is_dataclass(m) and all(k in value for k in _fields(m).required):
                    return m
        for m in members:
            if not is_dataclass(m) and _kind(*_unwrap(m)).test(value):
                return m
        records = [", ".join(_fields(m).required) for m in members if is_dataclass(m)]
        others = [_expected(m) for m in members if not is_dataclass(m)]
        raise self.wrong(path, shown(value), " or ".join(
            ([f"an object with the keys {' | '.join(records)}"] if records else []) + others))

    def record(self, cls: type, value: dict, path: str, *, overrides: dict | None = None):
        """The record `cls` from the object `value` (its type checked by the caller)."""
        spec = _fields(cls)
        if not getattr(cls, "EXTRA", False):
            unknown = [k for k in value if k not in spec.keys]
            if unknown:
                raise self.wrong(sub(path, unknown[0]), f"{shown(value[unknown[0]])}, a key it does not have",
                                 "only " + ", ".join(spec.keys))
        kwargs = {}
        for name, json_key, tp, default in spec.items:
            tp = (overrides or {}).get(name, tp)
            if json_key not in value:
                if default is MISSING:
                    raise self.wrong(sub(path, json_key), "missing", _expected(tp))
                continue
            kwargs[name] = self.read(tp, value[json_key], sub(path, json_key))
        return cls(**kwargs)


def _unwrap(tp) -> tuple[Any, tuple]:
    if typing.get_origin(tp) is Annotated:
        return typing.get_args(tp)[0], tuple(tp.__metadata__)
    return tp, ()


def _is_optional(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _kind(tp, metas: tuple) -> Kind:
    own = next((m for m in metas if isinstance(m, Kind)), None)
    if own is not None:
        return own
    origin = typing.get_origin(tp) or tp
    if origin in _SCALARS:
        return _SCALARS[origin]
    if origin is dict or is_dataclass(origin):
        return _OBJ
    if origin in (tuple, list):
        return _LIST
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = tuple(m.value for m in tp)  # a tuple: an unhashable value (a list) is compared, not hashed
        return Kind("one of " + ", ".join(map(repr, values)), lambda v: type(v) is type(values[0]) and v in values)
    raise TypeError(f"records: no JSON kind for {tp!r}")


def _expected(tp) -> str:
    tp, metas = _unwrap(tp)
    if _is_optional(tp):
        inner, more = _unwrap(next(a for a in typing.get_args(tp) if a is not type(None)))
        return _kind(inner, metas + more).expected + ("" if NOT_NULL in metas else " or null")
    return _kind(tp, metas).expected


@dataclass(frozen=True)
class _Spec:
    items: tuple  # (attribute, JSON key, type, default or MISSING) per field, in reading order
    keys: tuple
    required: tuple  # the keys without a default


@functools.cache
def _fields(cls: type) -> _Spec:
    hints = typing.get_type_hints(cls, include_extras=True)
    items = []
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        items.append((f.name, f.metadata.get("key", f.name), hints[f.name], None if has_default else MISSING))
    return _Spec(tuple(items), tuple(k for _, k, _, _ in items), tuple(k for _, k, _, d in items if d is MISSING))


def read_record(cls: type, value, where: str, fix: str | None = None):
    """The record `cls` in the parsed JSON `value` (`where`: the file), every field checked."""
    return Reader(where, fix).read(cls, value)


def to_json(value):
    """The JSON value of a record (or of a container of them): fields by their keys, `omit` honoured; a Damaged
    part as it was read."""
    if isinstance(value, Damaged):
        return value.raw
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            if f.metadata.get("internal"):
                continue
            v = getattr(value, f.name)
            omit = f.metadata.get("omit")
            if (omit == "none" and v is None) or (omit == "empty" and not v):
                continue
            out[f.metadata.get("key", f.name)] = to_json(v)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


class Record:
    """A record's two ends: `from_json` (the strict reader) and `to_json` (the writer). EXTRA: keys the record
    does not have are let through (files written by others) rather than refused (files written by this tool)."""

    EXTRA: ClassVar[bool] = False

    @classmethod
    def from_json(cls, value, where: str, fix: str | None = None):
        return read_record(cls, value, where, fix)

    def to_json(self) -> dict:
        return to_json(self)


# ----------------------------------------------------------------------------------------------- the manifest

Sha256 = Annotated[str, SHA256]
Count = Annotated[int, NONNEG]


class Status(enum.StrEnum):
    """A planned shard's state in the manifest."""

    PENDING = "pending"
    WRITTEN = "written"


@dataclass
class Fp8BlockReport(Record):
    """fp8_block's report: the expert matrices converted, their weight_block_size tiles, the lossy ones (only with
    --allow-lossy) with the worst error of a value, dequantized, and the first lossy tiles by name."""

    tensors: Count = 0
    tiles: Count = 0
    lossy_tiles: Count = 0
    lossy_tensors: Count = 0
    worst_abs_err: float = 0.0  # largest |FP8 - FP4| of a value
    worst_rel_err: float = 0.0
    examples: list[str] = field(default_factory=list, metadata=key("lossy_examples"))  # "tensor tile (r, c)"


@dataclass
class WindowReport(Record):
    """megamoe's report on the MXFP4 scale window: the scale groups with nonzero codes, those whose scale had to
    leave its exact value, the experts they are in, and the worst relative L2 error of one expert matrix."""

    groups: Count = 0
    clamped_groups: Count = 0
    lossy_experts: Count = 0
    worst_rel_l2: float = 0.0

    def merge(self, other: WindowReport) -> None:
        self.groups += other.groups
        self.clamped_groups += other.clamped_groups
        self.worst_rel_l2 = max(self.worst_rel_l2, other.worst_rel_l2)
        self.lossy_experts += other.lossy_experts


@dataclass(frozen=True)
class TargetReport(Record):
    """What a target found worth reporting on the units it converted, per output shard and merged (false, written
    as {}: nothing)."""

    fp8_block: Fp8BlockReport | None = field(default=None, metadata=OMIT_NONE)
    mxfp4_window: WindowReport | None = field(default=None, metadata=OMIT_NONE)

    def __bool__(self) -> bool:
        return self.fp8_block is not None or self.mxfp4_window is not None


@dataclass
class FileRecord(Record):
    """A file: its size and sha256 (None until hashed: an input of a run in progress); for an input while the run
    is in progress also its identity (mtime_ns, inode, dev, ctime_ns), so that --resume knows an unchanged file
    without reading it; for an output shard, the target's report on the units whose first output it holds."""

    size: Count
    sha256: Sha256 | None
    report: TargetReport = field(default_factory=TargetReport, metadata=OMIT_EMPTY)
    mtime_ns: Annotated[int | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    inode: Annotated[Count | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    dev: Annotated[Count | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    # ctime: every write sets it and nothing sets it back (`touch -r` restores mtime only)
    ctime_ns: Annotated[int | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)

    def identity(self) -> FileRecord:
        """This record as an identity: size, times, inode and device (no sha256, no report)."""
        return FileRecord(self.size, None, mtime_ns=self.mtime_ns, inode=self.inode, dev=self.dev,
                          ctime_ns=self.ctime_ns)


# An output file's record: its sha256 is known
OutFile = Annotated[FileRecord, With(sha256=Sha256)]


@dataclass(kw_only=True)
class SourceRecord(Record):
    """SRC as it was given (`spec`), its Hub repo and revision, and a record of every input file."""

    spec: str
    repo_id: str | None = None
    revision: str | None = None
    files: dict[str, FileRecord]


@dataclass(frozen=True)
class Options(Record):
    """The options that must match for --resume."""

    target: str
    shard_size: Count
    ep_size: Count
    arch: str | None
    allow_lossy: bool
    params: dict[str, str]


@dataclass(frozen=True)
class TargetRecord(Record):
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


@dataclass(frozen=True, kw_only=True)
class EpRecord(Record):
    expert_ranges: tuple[tuple[int, ...], ...]  # each rank's experts [first, last)
    world_size: Count


@dataclass(frozen=True)
class Tool(Record):
    """The versions that wrote the output (None: not installed)."""

    name: str
    version: str
    torch: str | None
    safetensors: str | None
    flashinfer: str | None


@dataclass(frozen=True)
class Geometry(Record):
    """A checkpoint's geometry (checkpoint.ModelSpec's fields, and its count of MoE blocks): the manifest's `model`,
    and what `inspect` says of a checkpoint."""

    model_type: str
    dialect: str
    hidden_size: Count
    moe_intermediate_size: Count
    n_routed_experts: Count
    num_experts_per_tok: Count
    num_hidden_layers: Count
    num_hash_layers: Count
    num_nextn_predict_layers: Count
    first_k_dense_replace: Count
    expert_dtype: str
    weight_block_size: tuple[int, ...]
    architectures: tuple[str, ...]
    moe_blocks: Count


# ------------------------------------------------------------------------ the layers: what the runtime rebuilds
# A FlashInfer object as stored: nested nodes, each one of these records (told apart by their keys). What a node may
# name (the kernel's classes, known dtypes, bytes the shards hold) is numerics/structure_check.py's to say.

MAX_DIM = 2**40  # elements along one dimension, and a stride: larger is not a tensor this tool writes
Dim = Annotated[int, Kind(f"an integer 0..{MAX_DIM}", lambda v: type(v) is int and 0 <= v <= MAX_DIM)]


@dataclass(frozen=True)
class NoneNode(Record):
    none: bool  # true: an empty slot (None)


@dataclass(frozen=True)
class TupleNode(Record):
    items: tuple[Node, ...] = field(metadata=key("tuple"))


@dataclass(frozen=True)
class ListNode(Record):
    items: tuple[Node, ...] = field(metadata=key("list"))


@dataclass(frozen=True)
class ValueNode(Record):
    value: int | bool | float | str  # a plain field of a dataclass


@dataclass(frozen=True)
class DataclassNode(Record):
    dataclass: str  # "module:qualname"
    fields: dict[str, Node]


@dataclass(frozen=True)
class TensorNode(Record):
    """A stored tensor by name, its torch dtype and shape; `stride`: a view of the stored span."""

    tensor: str
    dtype: str
    shape: tuple[Dim, ...]
    stride: Annotated[tuple[Dim, ...] | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)


Node = NoneNode | TupleNode | ListNode | ValueNode | DataclassNode | TensorNode


def read_node(value, where: str | None = None) -> Node:
    """A structure's JSON as nodes (an InputError naming the node's path, from `structure`)."""
    return Reader(where).read(Node, value, "structure")


@dataclass(frozen=True, kw_only=True)
class RankLayer(Record):
    """A kernel target's block on one EP rank: its experts [first, last) and the object to rebuild."""

    experts: tuple[Count, ...]
    structure: Node


@dataclass(frozen=True, kw_only=True)
class DenseLayout(Record):
    """A dense target's block: its experts under their names (`tensors`, a pattern) and their formats."""

    format: str
    tensors: str
    weight_dtype: Annotated[str | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    scale_dtype: Annotated[str | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    block: Annotated[tuple[Count, ...] | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    experts: tuple[Count, ...]


# A block of `layers`: a dense target's layout, or a kernel target's {rank: its record}; a rank's record that does
# not read is a Damaged (verify reports it with the others, the loader refuses that block and rank)
Block = DenseLayout | dict[str, Annotated[RankLayer, CONTAINED]]


@dataclass(kw_only=True)
class Manifest(Record):
    """OUT's manifest. `model` is the checkpoint's geometry; `layers` what the runtime needs to
    rebuild each block's objects ({block: {rank: record}}, the target's); `complete` None: a manifest without the
    field (the conversion did not finish); `out_dir` where it was read from (not written). Fields in the order
    they are read (the first problem is the one reported)."""

    schema: str = SCHEMA
    tool: Tool
    model: Geometry
    options: Options
    source: SourceRecord
    target: TargetRecord
    ep: EpRecord
    layers: dict[str, Block]
    files: dict[str, OutFile]
    status: dict[str, Status]
    complete: Annotated[bool | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    report: Annotated[TargetReport | None, NOT_NULL] = field(default=None, metadata=OMIT_NONE)
    out_dir: Path | None = field(default=None, compare=False, metadata=INTERNAL)

    @property
    def ep_size(self) -> int:
        return self.ep.world_size

    def written(self) -> dict[str, FileRecord | None]:
        """{shard: its record} of the shards recorded as written."""
        return {f: self.files.get(f) for f, st in self.status.items() if st == Status.WRITTEN}

    def layer_record(self, layer: str, rank: int) -> RankLayer:
        """The `layers` record of MoE block `layer` and EP rank `rank` (an InputError naming what exists, or what is
        damaged)."""
        where = self.out_dir if self.out_dir is not None else Path(".")
        if layer not in self.layers:
            known = ", ".join(list(self.layers)[:6])
            raise InputError(f"{where}: no MoE block {layer!r} in this output; blocks are {known}, ...")
        ranks = self.layers[layer]
        if not isinstance(ranks, dict):
            raise self.damaged(f"block {layer!r} rank {rank}: a dense layout where the target's ranks belong")
        if str(rank) not in ranks:
            raise InputError(f"{where}: rank {rank} not in this output, which was sharded for "
                             f"--ep-size {self.ep_size} (ranks 0..{self.ep_size - 1})")
        rec = ranks[str(rank)]
        if isinstance(rec, Damaged):
            raise self.damaged(f"block {layer!r} rank {rank}: {rec.problem}")
        return rec

    def damaged(self, what: str) -> InputError:
        where = self.out_dir if self.out_dir is not None else Path(".")
        return InputError(f"{where / MANIFEST_NAME}: {what}; the manifest is damaged: convert into {where} again "
                          "with --overwrite")


@dataclass
class RankStatus(Record):
    """A torchrun rank's status file: the shards it has finished."""

    rank: Count
    files: dict[str, OutFile]


# ------------------------------------------------------------------------------------------- index and config

@dataclass(frozen=True)
class IndexMetadata(Record):
    total_size: Count


@dataclass(frozen=True)
class OutIndex(Record):
    """OUT's `model.safetensors.index.json`."""

    weight_map: dict[str, str]
    metadata: IndexMetadata


@dataclass(frozen=True, kw_only=True)
class SourceIndex(Record):
    """The fields of SRC's index the code relies on (other keys are let through)."""

    EXTRA = True
    metadata: dict | None = None
    weight_map: dict[str, str]


@dataclass(frozen=True)
class TextConfig(Record):
    EXTRA = True
    quantization_config: dict | None = None


@dataclass(frozen=True)
class SourceConfig(Record):
    """The fields of SRC's config.json whose type the code relies on before the model spec checks the rest."""

    EXTRA = True
    quantization_config: dict | None = None
    architectures: tuple[str, ...] | None = None
    text_config: TextConfig | None = None


# ------------------------------------------------------------------------------------------------ the results

@dataclass(frozen=True)
class PlanRow(Record):
    """One output shard of a conversion's plan."""

    file: str
    rank: int | None
    tensors: int
    bytes: int
    kept: bool


@dataclass(frozen=True)
class UploadFile(Record):
    file: str
    bytes: int


@dataclass
class UploadResult(Record):
    """What `upload` sent (or, for a dry run, would send); never the token."""

    repo_id: str
    revision: str
    files: int
    bytes: int
    human: str
    dry_run: bool
    private: bool
    list: list[UploadFile]
    not_uploaded: list[str]
    token_found: bool
    commit: str | None = field(default=None, metadata=OMIT_NONE)
    url: str | None = field(default=None, metadata=OMIT_NONE)
    pr_url: str | None = field(default=None, metadata=OMIT_NONE)  # --create-pr: the pull request opened


@dataclass
class ConvertResult(Record):
    out: str
    target: str
    device: str
    shards: int
    shards_kept: int
    bytes_read: int
    bytes_written: int
    seconds: float
    dry_run: bool = False
    free_disk: int | None = None
    plan: list[PlanRow] = field(default_factory=list)
    report: TargetReport = field(default_factory=TargetReport)
    device_peak_bytes: int | None = None  # on CUDA: the most device memory allocated at once
    estimate: str = ""  # --dry-run: the time the conversion is estimated to take, and how that was measured
    estimate_seconds: float | None = None  # --dry-run: that time in seconds (None where not estimated)
    # SRC's files named like the tool's own (fimoe-manifest.json, ...): neither read nor copied into OUT
    skipped: list[str] = field(default_factory=list)
    # Seconds: `start` until the first shard (imports excluded), then per stage, summed over --writers lanes:
    # `read` (source into host memory), `convert` (the target's transform), `wait_for_data` (the writer idle,
    # including `wait_for_device`: its wait for device-to-host copies), `write` (copy into write buffers,
    # disk, fsync).
    timings: dict = field(default_factory=dict)
    bytes_fetched: int | None = None  # --stream: bytes received from the Hub (re-reads included)
    # --stream: source bytes held at once at most (in flight included), and the --max-memory that holds them all
    bytes_held_peak: int | None = None
    stream_max_memory: int | None = None
    upload: UploadResult | None = None  # --upload-repo: what `upload` returned
    params: dict = field(default_factory=dict)  # the target's --param values (an --engine's included)


@dataclass
class VerifyResult(Record):
    """`verify`: the files re-hashed, their bytes, every problem found, and the units re-derived (--deep)."""

    files: int
    bytes: int
    problems: list[str]
    deep_checked: int = 0
    repo_id: str | None = field(default=None, metadata=OMIT_NONE)  # a published output's (verify ORG/NAME)
    revision: str | None = field(default=None, metadata=OMIT_NONE)  # ... and the commit checked
    # verify ORG/NAME --deep: the Hub source re-derived from (repo@commit), the non-expert tensors compared with
    # its bytes, and the bytes both repos sent by range (compared, never hashed whole)
    source: str | None = field(default=None, metadata=OMIT_NONE)
    copies_checked: int | None = field(default=None, metadata=OMIT_NONE)
    range_bytes: int | None = field(default=None, metadata=OMIT_NONE)
    # verify OUT --deep with no --src: the folder of the recorded name that was re-derived from, and where it was found
    source_folder: str | None = field(default=None, metadata=OMIT_NONE)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class CheckpointInfo(Record):
    """`inspect` of a checkpoint: what it holds, and for each target "fits" or its problems."""

    source: str
    root: str
    revision: str | None
    variant: str
    model: Geometry
    shards: int
    tensors: int
    bytes: int
    routed_expert_bytes: int
    tensor_classes: dict[str, int]
    files: list[str]
    headers_from_hub: int
    targets: dict[str, str | list[str]]


@dataclass(frozen=True)
class Origin(Record):
    spec: str
    repo_id: str | None
    revision: str | None


@dataclass(frozen=True)
class OutputInfo(Record):
    """`inspect` of a fimoe-convert output, from its manifest."""

    source: str
    root: str
    complete: bool
    target: TargetRecord
    ep_size: int
    model: Geometry
    origin: Origin = field(metadata=key("from"))
    tool: Tool
    files: int
    bytes: int
    report: TargetReport
    converted: bool = True


@dataclass(frozen=True)
class TargetRow(Record):
    """`targets`: one target, what it declares, and whether this machine can run its conversion now."""

    name: str
    kernel_name: str | None
    aliases: list[str]
    vllm_moe_backend: str | None
    capabilities: list[str]
    weight_format: str
    activation_format: str
    needs_nvshmem: bool
    preprocess_needs_cuda: bool
    needs_packages: list[str]
    available_here: bool
    why: str
    engines: str
    description: str
