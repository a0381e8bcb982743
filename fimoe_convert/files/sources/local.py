"""The input checkpoint: a local folder or a Hub snapshot (found or fetched by hub_source.py); config, index,
every shard header validated before any tensor data is read; tensors read by name from whichever shard holds
them."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ...checkpoint import (
    EXPERT_LEGS,
    ModelSpec,
    check_counts,
    expected_expert_tensors,
    model_spec_from_config,
    natural_key,
    parse_expert_name,
)
from ...errors import CONTROL, InputError, ValidationError
from ...records import FileRecord, SourceConfig, SourceIndex, read_record
from ..hashing import sha256_file
from ..jsonfile import read_json
from ..names import INDEX_NAME, SINGLE_NAME, TMP_SUFFIX, is_tool_name
from ..paths import NAME_MAX, name_problem
from ..safetensors.header import Header, TensorInfo, as_typed, read_header
from ..safetensors.reader import read_bytes
from .hub import SHA256_RE, local_dir_sha256, remote_headers, resolve_source_root

MAX_EXAMPLES = 3  # missing tensors named per block in an error
# Equal in two identity records: the same file, unchanged, not read again. ctime: every write sets it and nothing
# sets it back (`cp -p` or `touch -r` restore size and mtime only).
SAME_FILE = ("size", "mtime_ns", "ctime_ns", "inode")


@dataclass
class Source:
    """A validated checkpoint. `spec` is SRC as the user gave it (recorded, never resolved); `allowed` is where
    its files may resolve to (a Hub snapshot's blobs lie beside it); `skipped`: files of SRC named like the
    tool's own (`fimoe-manifest.json`, ...), never read nor copied; `identities`: each input file's identity
    (IDENTITY) when it was opened."""

    spec: str
    root: Path
    repo_id: str | None
    revision: str | None
    config: dict
    model: ModelSpec
    weight_map: dict[str, str]
    headers: dict[str, Header]
    extra_files: list[str]
    allowed: Path | None = None
    skipped: list[str] = field(default_factory=list)
    identities: dict[str, FileRecord] = field(default_factory=dict)
    remote: frozenset[str] = frozenset()  # shards described from their headers on the Hub, not downloaded
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

    def interrupt(self) -> None:
        """The conversion stops: a read waiting for bytes that are not here yet ends at once (a streamed source)."""

    def explain(self, error: BaseException) -> BaseException:
        """What to report for `error`, raised while converting this source's bytes (a streamed source may find
        that the bytes were not the Hub's): `error` itself here."""
        return error

    def is_local(self, name: str) -> bool:
        return self.weight_map[name] not in self.remote

    def zeros(self, name: str):
        """Zeros with tensor `name`'s dtype and shape: a stand-in for timing a unit whose shard is not downloaded."""
        import torch

        info = self.info(name)
        return as_typed(torch.zeros(info.nbytes, dtype=torch.uint8), info.dtype, info.shape)

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

    def known_sha256(self, rel: str) -> str | None:
        """The sha256 of an input file where it is known without reading the file: hashed earlier in this run,
        a Hub cache blob (named by its sha256), or a file `hf download --local-dir` recorded and that has not
        changed since; else None."""
        sha = self._known_sha.get(rel)
        path = self.root / rel
        if sha is None and path.is_symlink():
            target = Path(os.readlink(path)).name
            if SHA256_RE.match(target):
                sha = target
        return sha or local_dir_sha256(self.root, rel)

    def file_record(self, rel: str, compute_hash: bool = True) -> FileRecord:
        """Size and sha256 of an input file (hashed only when not known without reading it)."""
        path = self.root / rel
        size = path.stat().st_size
        sha = self.known_sha256(rel)
        if sha is None and compute_hash:
            sha = sha256_file(path)
            self._known_sha[rel] = sha
        return FileRecord(size, sha)

    def non_expert_tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (safetensors dtype, shape) of every tensor but the routed experts, in the index's order."""
        return {n: (self.info(n).dtype, self.info(n).shape) for n in self.weight_map if parse_expert_name(n) is None}

    def identity(self, rel: str) -> FileRecord:
        """The size, mtime_ns, ctime_ns, inode and dev of an input file now (links followed: a Hub blob's own)."""
        st = (self.root / rel).stat()
        return FileRecord(st.st_size, None, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, inode=st.st_ino,
                          dev=st.st_dev)

    def hash_input(self, rel: str) -> str:
        """The sha256 of an input file, refused (InputError naming the file) when the file is not the one opened:
        its identity is compared before and after the hash."""
        where = self.root / rel
        try:
            before = self.identity(rel)
            sha = self.file_record(rel).sha256
            after = self.identity(rel)
        except OSError as e:
            raise InputError(f"{where}: cannot read it to record its sha256 ({e.strerror}); the source changed "
                             "during the conversion: restore it and convert again with --overwrite") from None
        first = self.identities.get(rel, before)
        if before != first or after != first:
            raise InputError(f"{where}: changed while the conversion ran ({identity_change(first, after)}); the "
                             "shards written so far may hold its old bytes: convert again with --overwrite once "
                             "the source stays unchanged")
        return sha

    def check_unchanged(self) -> None:
        """Refuse (InputError naming the first) an input that is no longer the file opened: the output may hold a
        mix of its old and new bytes."""
        for rel, first in sorted(self.identities.items()):
            try:
                now = self.identity(rel)
            except OSError as e:
                now = e.strerror or e.__class__.__name__
            if now != first:
                change = identity_change(first, now) if isinstance(now, FileRecord) else f"cannot read it: {now}"
                raise InputError(f"{self.root / rel}: changed while the conversion ran ({change}); the output may "
                                 "hold its old bytes: convert again with --overwrite once the source stays unchanged")

    def file_size(self, rel: str) -> int:
        """Bytes of an input file, 0 if it cannot be read (the error comes when it is read)."""
        try:
            return (self.root / rel).stat().st_size
        except OSError:
            return 0

    @property
    def total_bytes(self) -> int:
        return sum(h.file_size for h in self.headers.values())


def identity_change(old: FileRecord, new: FileRecord) -> str:
    """What differs between two identity records, in words ('size 10 -> 11 bytes, modified ...')."""
    def when(ns) -> str:
        if type(ns) is not int:
            return "unknown"
        try:
            return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        except (OverflowError, OSError, ValueError):
            return str(ns)

    parts = []
    if old.size != new.size:
        parts.append(f"size {old.size} -> {new.size} bytes")
    if old.mtime_ns != new.mtime_ns:
        parts.append(f"modified {when(new.mtime_ns)}, recorded {when(old.mtime_ns)}")
    elif old.ctime_ns is None and new.ctime_ns is not None:
        parts.append("its change time (ctime) was not recorded, so an in-place write cannot be ruled out")
    elif old.ctime_ns != new.ctime_ns:
        parts.append(f"written or its attributes changed {when(new.ctime_ns)} (its modification time was "
                     f"set back), recorded {when(old.ctime_ns)}")
    if old.inode != new.inode or old.dev != new.dev:
        parts.append(f"replaced by another file (inode {old.inode} -> {new.inode})")
    return ", ".join(parts) or "no identity recorded"


def recorded_folder_problem(folder: Path, files: dict[str, FileRecord]) -> str | None:
    """Why `folder` is not the source whose input files `files` (a manifest's record: untrusted) describes, told by
    names and sizes alone (a stat each, nothing opened), or None: its files' sha256 are then worth computing. The
    reason is one clause with no semicolon (verify lists one per folder tried)."""
    if not folder.is_dir():
        return "no such folder"
    if not files:
        return "the manifest records none of the source's files to compare"
    for rel, want in sorted(files.items()):
        if name_problem(rel, folder, "manifest"):  # also a link out of the folder
            return f"the manifest names a source file {str(rel)[:80]!r}, not a plain name inside the folder"
        if want.sha256 is None:
            return f"{rel}: the manifest records no sha256 to compare it with"
        try:
            st = (folder / rel).stat()
        except OSError as e:
            return f"{rel}: {e.strerror or 'cannot be read'}"
        if not stat.S_ISREG(st.st_mode):
            return f"{rel}: not a file"
        if st.st_size != want.size:
            return f"{rel}: {st.st_size} bytes, the output was converted from {want.size}"
    return None


def open_source(spec: str, revision: str | None = None, offline: bool = False, weights: bool = True) -> Source:
    """Resolve SRC and validate everything that can be checked without reading tensor data. `weights=False`
    (inspect, --dry-run): a Hub repo's shards that are not in the local cache are described from their headers
    on the Hub, not downloaded (Source.remote); their tensors cannot be read."""
    root, allowed, repo_id, commit = resolve_source_root(spec, revision, offline, weights)
    fetch = repo_id is not None and not weights and not offline
    fix = "the checkpoint is damaged or not a DeepSeek V4 checkpoint: fetch or copy it again"
    config = check_config(read_json(root / "config.json", "config", fix=fix,
                                    missing="expected a DeepSeek V4 checkpoint folder"), str(root / "config.json"), fix)
    model = model_spec_from_config(config, where=str(root / "config.json"))
    problems: list[str] = []
    index_path = root / INDEX_NAME
    remote: dict[str, Header] = {}
    if index_path.exists():
        weight_map = index_weight_map(read_json(index_path, "index", fix=fix), str(index_path), fix)
    elif (root / SINGLE_NAME).exists():
        weight_map = {n: SINGLE_NAME for n in read_header(root / SINGLE_NAME).tensors}
    elif fetch:
        remote, problems = remote_headers(repo_id, commit, [SINGLE_NAME])
        raise_if(problems)
        weight_map = {n: SINGLE_NAME for n in remote[SINGLE_NAME].tensors}
    else:
        raise InputError(f"{root}: neither {INDEX_NAME} nor {SINGLE_NAME} found; expected a safetensors checkpoint")
    where = str(index_path)
    # Counts in config.json against the names present, before anything loops over what it declares.
    raise_if(check_counts(model, weight_map, str(root / "config.json")))

    headers: dict[str, Header] = {}
    bad: list[str] = []
    missing: list[str] = []
    for rel in sorted(set(weight_map.values())):
        problem = name_problem(rel, root, where, "shard", "the checkpoint", allowed)
        try:
            present = problem is None and (root / rel).exists()
        except OSError as e:  # the rule keeps names the system refuses out; this is the last guard
            problem = f"{where}: shard {rel!r} cannot be looked up ({e.strerror})"
        if problem:
            bad.append(problem)
        elif not present:
            missing.append(rel)
        else:
            try:
                headers[rel] = read_header(root / rel, where=str(root / rel))
            except InputError as e:
                problems.append(str(e))
    problems[:0] = summarized(bad, "shard names of the index are refused")
    if fetch and missing:
        fetched, failed = remote_headers(repo_id, commit, [m for m in missing if m not in remote])
        remote.update(fetched)
        headers.update(remote)
        problems += summarized(failed, "shard headers could not be read from the Hub")
        missing = []
    if missing:
        hint = ("the Hub snapshot is incomplete: run again without --offline to finish the download"
                if repo_id else "copy the missing file into the folder")
        names = ", ".join(repr(m) for m in missing[:MAX_EXAMPLES])
        problems.append(f"{where}: names shard {names}, which does not exist; {hint}" if len(missing) == 1 else
                        f"{where}: names {len(missing)} shards that do not exist, e.g. {names}; {hint}")
    raise_if(problems)

    raise_if(summarized(_disagreements(root, where, weight_map, headers),
                        "disagreements between the index and the shard headers"))
    raise_if(check_experts(model, {name: headers[rel].tensors[name] for name, rel in weight_map.items()}))
    extra, skipped = _small_files(root, allowed)
    raise_if(summarized([f"{root}: file {n!r}: {why}" for n in extra if (why := copy_name_problem(n))], "file names"))
    source = Source(spec=spec, root=root, repo_id=repo_id, revision=commit, config=config, model=model,
                    weight_map=dict(weight_map), headers=headers, extra_files=extra, allowed=allowed, skipped=skipped,
                    remote=frozenset(remote))
    try:
        source.identities = {rel: source.identity(rel) for rel in source.input_files() if rel not in source.remote}
    except OSError as e:
        raise InputError(f"{e.filename}: cannot read it ({e.strerror}); the source changed while it was opened, "
                         "run again once it stays unchanged") from None
    return source


def _disagreements(root: Path, where: str, weight_map: dict[str, str], headers: dict[str, Header]) -> list[str]:
    """Where the index and the shard headers disagree: a tensor in two shards, named where it is not, or unnamed."""
    problems: list[str] = []
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
    return problems


def copy_name_problem(name: str) -> str | None:
    """Why SRC's file `name` cannot be copied into OUT (where it is written as NAME.fimoe-tmp, then renamed, and
    listed in a UTF-8 manifest), or None: said when SRC is opened, not after every shard is written."""
    try:
        size = len((name + TMP_SUFFIX).encode())
    except UnicodeEncodeError:
        return ("its name is not valid UTF-8, which the manifest cannot record; rename it or move it out of the "
                "checkpoint")
    if size > NAME_MAX or CONTROL.search(name):
        return (f"its name ({len(name.encode())} bytes{', with a control character' if CONTROL.search(name) else ''}) "
                f"cannot be copied into OUT, where it is written as NAME{TMP_SUFFIX} (at most {NAME_MAX} bytes, no "
                "control character); rename it or move it out of the checkpoint")
    return None


def _small_files(root: Path, allowed: Path) -> tuple[list[str], list[str]]:
    """(SRC's other files, copied into OUT; those named like the tool's own, never read nor copied)."""
    extra, skipped = [], []
    for p in sorted(root.iterdir()):
        if (p.is_file() and not p.name.startswith(".") and p.name not in ("config.json", INDEX_NAME)
                and not p.name.endswith(".safetensors") and p.resolve().is_relative_to(allowed)):
            (skipped if is_tool_name(p.name) else extra).append(p.name)  # never copy a name OUT's files have
    return extra, skipped


def summarized(problems: list[str], what: str, most: int = 20) -> list[str]:
    """`problems` as they are, or, when there are more than `most` (a hostile index can name a million
    shards), the first few and one line counting the rest."""
    if len(problems) <= most:
        return problems
    return problems[:MAX_EXAMPLES] + [f"and {len(problems) - MAX_EXAMPLES} more {what}"]


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
                        f"{model.n_routed_experts} experts that config.json declares, e.g. "
                        f"{', '.join(sorted(stray)[:MAX_EXAMPLES])}; "
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


def check_config(config, where: str, fix: str | None = None):
    """`config` (config.json's value) when the fields whose type the code relies on before the model spec checks
    the rest fit: an object, `quantization_config` and `text_config` objects or null, `architectures` a list of
    strings or null."""
    read_record(SourceConfig, config, where, fix)
    return config


def index_weight_map(index, where: str, fix: str | None = None) -> dict[str, str]:
    """The index's weight_map (tensor name -> shard file name), typed; `metadata` an object or null."""
    return read_record(SourceIndex, index, where, fix).weight_map
