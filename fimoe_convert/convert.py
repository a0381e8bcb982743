"""`convert(src, out, target, ...)`: the library entry point, and `verify(out, deep=...)`.

Order of work: resolve SRC and validate config, index, every shard header, the experts, the target
against the model and the options, and OUT, all before any tensor data is read and all problems at
once; plan; then stream each output shard (temp name, fsync, rename, manifest status), one or more
shards at a time (`--writers` lanes), each lane fed by a reader and a converter thread within a byte
budget drawn from --max-memory; finally index, config, card and the manifest with `complete: true`."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import math
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from . import __version__
from .checkpoint import parse_expert_name
from .errors import InputError, UsageError, ValidationError
from .hub import model_card
from .manifest import (
    INDEX_NAME,
    MANIFEST_NAME,
    SCHEMA,
    copy_file,
    file_record,
    read_manifest,
    read_output_tensors,
    read_rank_status,
    remove_rank_status,
    remove_temporaries,
    verify_files,
    write_json,
    write_manifest,
    write_rank_status,
    write_text,
)
from .plan import OutShard, OutTensor, Plan, assign_shards, ep_ranges, merge_outputs, piece_rows, plan_shards
from .safetensors_io import IO_BLOCK, STAGE_BLOCKS, PlannedTensor, ShardWriter, sha256_file
from .source import Source, open_source
from .targets import Target, TargetOptions, get_target
from .units import parse_size

DEFAULT_SHARD_SIZE = "5GB"
DEFAULT_MAX_MEMORY = "8GiB"
READ_AHEAD_MAX = 128 << 20  # bytes read or converted ahead of the writer, unless two units need more
UNIT_BYTES_MAX = 64 << 20  # output bytes per unit, for targets that split their work (fewer with --max-memory/32)
KEEP_MAX = 1 << 20  # bytes: a unit's output written away from the rest of its outputs is kept, not recomputed
DISK_HEADROOM = 1.02  # free-disk check keeps 2% spare for headers and the file system


@dataclass
class ConvertResult:
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
    plan: list[dict] = field(default_factory=list)
    report: dict = field(default_factory=dict)
    # Seconds: `start` until the first shard (imports excluded), then per stage, summed over --writers lanes:
    # `read` (source into host memory), `convert` (the target's transform), `wait_for_data` (the writer idle,
    # including `wait_for_device`: its wait for device-to-host copies), `write` (copy into write buffers,
    # disk, fsync).
    timings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def tool_versions() -> dict:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"name": "fimoe-convert", "version": __version__, "torch": torch.__version__.split("+")[0],
            "safetensors": version("safetensors"), "flashinfer": version("flashinfer-python")}


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device {device}: expected auto, cpu or cuda")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible to torch here; use --device cpu or auto")
    return device


def parse_arch(arch: str | None) -> tuple[int, int] | None:
    if arch is None:
        return None
    try:
        major, minor = (int(p) for p in arch.split("."))
    except ValueError:
        raise UsageError(f"--arch {arch}: expected a compute capability like 9.0 or 10.0") from None
    return major, minor


def _check_out(src: Path, out: Path, resume: bool, overwrite: bool) -> list[str]:
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


def build_plan(source: Source, target: Target, opts: TargetOptions, shard_size: int) -> Plan:
    """Copies of every non-expert tensor, plus the target's units; packed into shards."""
    units = target.units(source.model, opts)
    tensors = [OutTensor(n, i.dtype, i.shape) for n, i in
               ((n, source.info(n)) for n in source.weight_map) if parse_expert_name(n) is None]
    tensors += merge_outputs(units)
    read = sum(source.info(n).nbytes for n in source.weight_map)
    return Plan(tuple(plan_shards(tensors, shard_size)), {u.key: u for u in units}, read)


def _options_record(target: Target, opts: TargetOptions, shard_size: int) -> dict:
    return {"target": target.info.name, "shard_size": shard_size, **opts.to_json()}


def _source_record(source: Source, hashes: dict[str, str | None]) -> dict:
    files = {}
    for rel in source.input_files():
        rec = source.file_record(rel, compute_hash=False)
        files[rel] = {"size": rec.size, "sha256": hashes.get(rel) or rec.sha256}
    return {"spec": source.spec, "repo_id": source.repo_id, "revision": source.revision, "files": files}


class _Budget:
    """Bytes of host memory held by work in flight (read, converted or waiting to be written), kept under
    `cap`; work that needs more than `cap` alone still proceeds when nothing else is in flight."""

    def __init__(self, cap: int):
        self.cap = cap
        self.used = 0
        self.cv = threading.Condition()
        self.closed = False

    def acquire(self, n: int) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.closed or self.used <= 0 or self.used + n <= self.cap)
            if self.closed:
                raise _Stopped
            self.used += n

    def release(self, n: int) -> None:
        with self.cv:
            self.used -= n
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()


class _Queue:
    """A FIFO between two stages (its items' memory is accounted in `_Budget`); `close` wakes a blocked put."""

    def __init__(self):
        self.items: list = []
        self.cv = threading.Condition()
        self.closed = False

    def put(self, item) -> None:
        with self.cv:
            if self.closed:
                raise _Stopped
            self.items.append(item)
            self.cv.notify_all()

    def get(self):
        with self.cv:
            self.cv.wait_for(lambda: self.items or self.closed)
            if not self.items:
                raise _Stopped
            return self.items.pop(0)

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.items.clear()
            self.cv.notify_all()


class _Stopped(Exception):
    pass


_END = object()


class _ShardQueue:
    """The shards still to write, handed to whichever lane's reader asks first, so that lanes end together
    however the shards' sizes fall (a fixed split left some lanes with twice the bytes of others)."""

    def __init__(self, shards: list[OutShard]):
        self.shards = list(shards)
        self.lock = threading.Lock()

    def take(self) -> OutShard | None:
        with self.lock:
            return self.shards.pop(0) if self.shards else None


class _Producer:
    """Two background threads feeding the writer, in the writer's order: a reader (source bytes into host
    memory, pinned for a GPU) and a converter (the target's transform). One byte budget covers everything
    between reading and writing, so reading, host-to-device copies, compute, device-to-host copies and
    writing overlap within it. On CUDA the converter does not wait for its device-to-host copies: each
    unit's results carry an event that the writer waits on. The reader takes its lane's next shard from the
    queue shared by all lanes when it starts reading for it."""

    def __init__(self, plan: Plan, shards: _ShardQueue, source: Source, target: Target, device: str,
                 budget: int):
        self.plan, self.shards, self.source, self.target, self.device = plan, shards, source, target, device
        self.budget = _Budget(budget)
        self.inq = _Queue()  # reader -> converter
        self.q = _Queue()  # converter -> writer
        self.seconds = {"read": 0.0, "convert": 0.0, "wait_for_device": 0.0}
        self.threads = [threading.Thread(target=self._pump, args=(self._reads, self.inq), name="fimoe-read", daemon=True),
                        threading.Thread(target=self._pump, args=(self._converted, self.q), name="fimoe-convert",
                                         daemon=True)]

    def __enter__(self) -> "_Producer":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        """Wake and end both threads; the writer's next `items()` step raises _Stopped."""
        self.budget.close()
        self.inq.close()
        self.q.close()

    def __exit__(self, *exc) -> None:
        self.stop()
        for t in self.threads:
            t.join(timeout=60)

    @staticmethod
    def _pump(items: Callable[[], Iterator[tuple]], q: _Queue) -> None:
        try:
            for item in items():
                q.put(item)
            q.put(_END)
        except _Stopped:
            return
        except BaseException as e:  # handed on to the writer thread, which raises it
            try:
                q.put(e)
            except _Stopped:
                pass

    @staticmethod
    def _pieces(shard: OutShard) -> list[tuple[str, OutTensor, str | None, bool]]:
        """The shard's write order: (shard file, tensor, unit writing this piece of it or None for a copy,
        last piece of the tensor)."""
        seq = []
        for t in shard.tensors:
            units = t.producers
            if not units:
                seq.append((shard.filename, t, None, True))
            seq += [(shard.filename, t, k, p == len(units) - 1) for p, k in enumerate(units)]
        return seq

    def _schedule(self, seq: list[tuple]) -> tuple[dict[int, list[tuple[str, bool]]], set[int]]:
        """Where each unit runs: a run serves a stretch of consecutive pieces of its unit, plus that unit's
        small pieces (<= KEEP_MAX bytes) further on in the shard, which it keeps until they are written. A
        larger piece further on gets a run of its own, since holding it could starve the budget.
        Returns {index of a run's first piece: [(tensor name, kept)]} and the indices of kept pieces."""
        runs: dict[int, list[tuple[str, bool]]] = {}
        kept: set[int] = set()
        last_run: dict[str, int] = {}
        prev = None
        for i, (_, t, k, _) in enumerate(seq):
            if k is not None and k == prev:
                runs[last_run[k]].append((t.name, False))
            elif k is not None and k in last_run and self.plan.piece_bytes(k, t.name) <= KEEP_MAX:
                runs[last_run[k]].append((t.name, True))
                kept.add(i)
                k = None  # the next piece of this unit is not part of a stretch
            elif k is not None:
                runs[i] = [(t.name, False)]
                last_run[k] = i
            prev = k
        return runs, kept

    def _reads(self) -> Iterator[tuple]:
        """Per shard taken from the queue: ("shard", shard), then ("copy", shard file, tensor, bytes, last)
        blocks of copied tensors, ("run", unit, inputs, wanted, bytes held) where a unit runs (`_schedule`),
        and ("out", shard file, tensor, unit, last, kept) per piece."""
        for shard in iter(self.shards.take, None):
            yield ("shard", shard)
            yield from self._shard_reads(shard)

    def _shard_reads(self, shard: OutShard) -> Iterator[tuple]:
        pin = self.device == "cuda"
        seq = self._pieces(shard)
        runs, kept = self._schedule(seq)
        for i, (fname, t, k, last) in enumerate(seq):
            if k is None:  # byte-for-byte copy, streamed in blocks
                n = self.source.info(t.name).nbytes
                for start in range(0, max(n, 1), IO_BLOCK):
                    end = min(n, start + IO_BLOCK)
                    self.budget.acquire(end - start)
                    t0 = time.perf_counter()
                    data = self.source.read_range(t.name, start, end)
                    self.seconds["read"] += time.perf_counter() - t0
                    yield ("copy", fname, t, data, end == n)
                continue
            if i in runs:  # hold budget for its inputs and its outputs written here (kept ones are tiny)
                unit = self.plan.units[k]
                wanted = runs[i]
                held = (sum(self.source.info(n).nbytes for n in unit.inputs)
                        + sum(self.plan.piece_bytes(k, n) for n, keep in wanted if not keep))
                self.budget.acquire(held)
                t0 = time.perf_counter()
                inputs = {n: self.source.read(n, pin=pin) for n in unit.inputs}
                self.seconds["read"] += time.perf_counter() - t0
                yield ("run", unit, inputs, wanted, held)
            yield ("out", fname, t, k, last, i in kept)

    def _converted(self) -> Iterator:
        """Each shard (an OutShard), then its (shard file, tensor, data, last, event or None, budgeted), in the
        writer's order."""
        results: dict[tuple[str, str], torch.Tensor] = {}
        event = None
        for item in _drain(self.inq):
            if item[0] == "shard":
                yield item[1]
            elif item[0] == "copy":
                yield (*item[1:], None, True)
            elif item[0] == "run":
                _, unit, inputs, wanted, held = item
                t0 = time.perf_counter()
                got = self.target.run(unit, inputs, self.device)
                del inputs
                for name, _ in wanted:
                    results[(unit.key, name)] = got[name]
                if self.device == "cuda":
                    event = torch.cuda.Event()
                    event.record()
                self.seconds["convert"] += time.perf_counter() - t0
                # the inputs are done with; the writer releases each output's bytes as it writes them
                self.budget.release(held - sum(_nbytes(got[n]) for n, keep in wanted if not keep))
                del got
            else:  # a kept piece waits on a later event of the same stream, which is later work
                _, fname, t, k, last, keep = item
                yield (fname, t, results.pop((k, t.name)), last, event, not keep)

    def items(self) -> Iterator:
        """For the writer: each shard (an OutShard), then its (shard file, tensor, CPU data, last), once the data
        is on the host; the data's bytes leave the budget when the writer asks for the next item, before waiting
        for it (holding them while waiting could starve the reader of budget)."""
        for item in _drain(self.q):
            if isinstance(item, OutShard):
                yield item
                continue
            fname, t, data, last, event, budgeted = item
            if event is not None:
                t0 = time.perf_counter()
                event.synchronize()
                self.seconds["wait_for_device"] += time.perf_counter() - t0
            yield fname, t, data, last
            if budgeted:
                self.budget.release(_nbytes(data))
            self.target.recycle(data)  # written: the target may reuse its memory


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _drain(q: _Queue) -> Iterator:
    while True:
        item = q.get()
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class _InputHasher:
    """sha256 of input files for the manifest, on `threads` daemon threads beside the conversion: one sha256
    runs at 1.2 GB/s on the H200 host, so a single thread finished long after a conversion that writes as many
    bytes as it reads. (A Hub snapshot's blobs are named by their sha256: nothing is read.)"""

    def __init__(self, source: Source, files: list[str], threads: int):
        self.hashes: dict[str, str | None] = {}
        self.errors: list[BaseException] = []
        todo = sorted(files, key=lambda rel: -_size_or_zero(source.root / rel))  # largest first: the threads end together
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    if not todo or self.errors:
                        return
                    rel = todo.pop(0)
                try:
                    sha = source.file_record(rel).sha256
                except OSError as e:
                    self.errors.append(InputError(f"{source.root / rel}: cannot read it to record its sha256 "
                                                  f"({e.strerror}); the source changed during the conversion, "
                                                  "restore it and run again with --resume"))
                    return
                except BaseException as e:  # noqa: BLE001 - raised by result()
                    self.errors.append(e)
                    return
                with lock:
                    self.hashes[rel] = sha

        n = min(len(todo), max(1, threads))
        self.threads = [threading.Thread(target=work, name=f"fimoe-hash{i}", daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def result(self) -> dict[str, str | None]:
        for t in self.threads:
            t.join()
        if self.errors:
            raise self.errors[0]
        return self.hashes


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _lane_budget(memory_bytes: int, biggest_unit: int) -> int:
    """Bytes one lane holds between reading and writing: two units (inputs and outputs) or READ_AHEAD_MAX,
    so that reading, converting and writing overlap, within a quarter of --max-memory (the rest: write
    buffers, the unit being converted, pinned and allocator caches)."""
    return max(min(memory_bytes // 4, max(READ_AHEAD_MAX, 4 * biggest_unit)), IO_BLOCK)


def _lane_count(writers: int | None, shards: int, memory_bytes: int, lane_budget: int) -> int:
    """Shards written at once. Each lane hashes its own shard, and one sha256 runs at 1.2 to 1.8 GB/s on
    the machines measured, below a fast disk; auto: a lane per 4 cores, at most 4, as many as fit their
    budgets and write buffers into a quarter of --max-memory."""
    if writers is None:
        fits = memory_bytes // 4 // (lane_budget + STAGE_BLOCKS * IO_BLOCK)
        writers = min(4, max(1, (os.cpu_count() or 1) // 4), max(1, fits))
    return max(1, min(writers, shards))


def _write_lane(producer: "_Producer", out_dir: Path, timings: dict, lock: threading.Lock,
                wrote: Callable[[int], None], written: Callable) -> None:
    """Write the shards `producer` took, in order, each through a ShardWriter (temp name, fsync, rename)."""
    items = producer.items()
    wait = busy = 0.0
    try:
        while True:
            t1 = time.perf_counter()
            shard = next(items, None)
            wait += time.perf_counter() - t1
            if shard is None:
                return
            assert isinstance(shard, OutShard), shard
            planned = [PlannedTensor(t.name, t.dtype, t.shape) for t in shard.tensors]
            with ShardWriter(out_dir / shard.filename, planned) as writer:
                for t in shard.tensors:
                    writer.begin_tensor(t.name)
                    last = False
                    while not last:
                        t1 = time.perf_counter()
                        fname, got, data, last = next(items)
                        t2 = time.perf_counter()
                        assert fname == shard.filename and got.name == t.name, (fname, got.name, t.name)
                        writer.write_part(data)
                        wait += t2 - t1
                        busy += time.perf_counter() - t2
                        wrote(_nbytes(data))
                    writer.end_tensor()
                t1 = time.perf_counter()
                rec = writer.finish()
                busy += time.perf_counter() - t1
            written(shard, rec)
    finally:
        with lock:
            timings["wait_for_data"] += wait
            timings["write"] += busy


def _run_lanes(jobs: list[Callable[[], None]], producers: list["_Producer"]) -> None:
    """Run the lanes (one inline, several in threads). The first failure, or Ctrl-C, stops all of them: their
    producers close, each lane's ShardWriter deletes its temporary file, and the failure is raised here."""
    if len(jobs) == 1:
        jobs[0]()
        return
    errors: list[BaseException] = []

    def guard(job):
        try:
            job()
        except _Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)
            for p in producers:
                p.stop()

    threads = [threading.Thread(target=guard, args=(j,), name=f"fimoe-lane{i}", daemon=True) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)  # wakes for Ctrl-C
    except BaseException:
        for p in producers:
            p.stop()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]


def convert(
    src: str,
    out: str,
    target: str = "bf16",
    *,
    revision: str | None = None,
    ep_size: int = 1,
    device: str = "auto",
    arch: str | None = None,
    max_memory: str | int = DEFAULT_MAX_MEMORY,
    shard_size: str | int = DEFAULT_SHARD_SIZE,
    allow_lossy: bool = False,
    params: dict | None = None,
    resume: bool = False,
    overwrite: bool = False,
    dry_run: bool = False,
    offline: bool = False,
    writers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    command: str | None = None,
) -> ConvertResult:
    """Convert the DeepSeek V4 checkpoint SRC (folder or Hub repo id) into OUT for `target`.

    `writers`: output shards written at once (default: from the cores and --max-memory); the output is the
    same for any value. `progress(done_bytes, total_bytes)` is called after every written tensor part."""
    t0 = time.perf_counter()
    if resume and overwrite:
        raise UsageError("--resume and --overwrite: pass one of them, not both")
    if writers is not None and writers < 1:
        raise UsageError(f"--writers {writers}: expected 1 or more shards written at once (or leave it out: auto)")
    shard_bytes = parse_size(shard_size, "--shard-size")
    memory_bytes = parse_size(max_memory, "--max-memory")
    tgt = get_target(target)
    dev = resolve_device(device)
    cap = parse_arch(arch)
    if cap is None and dev == "cuda":
        cap = torch.cuda.get_device_capability()
    opts = TargetOptions(ep_size=ep_size, arch=cap, device=dev, allow_lossy=allow_lossy, params=dict(params or {}),
                         unit_bytes=min(UNIT_BYTES_MAX, memory_bytes // 32))
    out_dir = Path(out).expanduser()

    problems: list[str] = []
    source = None
    group = _Group()
    # Under torchrun, one process per node resolves SRC first (a Hub download happens once per node);
    # the others then find it in the shared cache.
    local_first = group.world > 1 and int(os.environ.get("LOCAL_RANK", group.rank)) == 0
    for turn in ((True, False) if group.world > 1 else (None,)):
        if turn is None or turn == local_first:
            try:
                source = open_source(src, revision=revision, offline=offline)
            except ValidationError as e:
                problems += e.problems
        if turn is True:
            group.barrier()
    if source is not None:
        problems += _check_out(source.root, out_dir, resume, overwrite)
        problems += tgt.validate(source.model, opts)
    if problems:
        raise ValidationError(problems)
    assert source is not None
    group.barrier()  # every rank has checked OUT before rank 0 creates it

    plan = build_plan(source, tgt, opts, shard_bytes)
    biggest_unit = max((u.out_bytes for u in plan.units.values()), default=0)
    if biggest_unit * 2 > memory_bytes:
        raise ValidationError([f"--max-memory {max_memory}: one unit of work ({max(plan.units.values(), key=lambda u: u.out_bytes).key}) "
                               f"needs about {2 * biggest_unit} bytes (its output and its inputs); raise --max-memory"
                               + (" or use a larger --ep-size" if tgt.info.kernel_name else "")])
    options = _options_record(tgt, opts, shard_bytes)

    owner = assign_shards(list(plan.shards), group.world)
    kept: dict[str, dict] = {}
    old: dict | None = None
    if resume and (out_dir / MANIFEST_NAME).exists():
        old = read_manifest(out_dir)
        if old.get("options") != options:
            changed = sorted(k for k in set(options) | set(old.get("options", {}))
                             if options.get(k) != old.get("options", {}).get(k))
            raise UsageError(f"--resume: {out_dir} was converted with other options ({', '.join(changed)} differ: "
                             f"{[old.get('options', {}).get(k) for k in changed]} there, "
                             f"{[options.get(k) for k in changed]} now); use the same options or --overwrite")
        old_sizes = {k: v["size"] for k, v in old.get("source", {}).get("files", {}).items()}
        new_sizes = {rel: source.file_record(rel, compute_hash=False).size for rel in source.input_files()}
        if old_sizes != new_sizes:
            raise UsageError(f"--resume: the source files differ from those {out_dir} was converted from; "
                             "use --overwrite to start again")
        written = {f: old.get("files", {}).get(f) for f, st in old.get("status", {}).items() if st == "written"}
        written.update(read_rank_status(out_dir))
        mine = {}
        for i, shard in enumerate(plan.shards):  # each rank re-hashes the finished shards it owns
            rec = written.get(shard.filename)
            path = out_dir / shard.filename
            if (owner[i] == group.rank and rec and path.is_file() and path.stat().st_size == rec["size"]
                    and sha256_file(path) == rec["sha256"]):
                mine[shard.filename] = rec
        for part in group.gather(mine):
            kept.update(part)

    todo = [s for s in plan.shards if s.filename not in kept]
    write_total = sum(s.nbytes for s in todo)
    plan_rows = [{"file": s.filename, "rank": s.rank, "tensors": len(s.tensors), "bytes": s.nbytes,
                  "kept": s.filename in kept} for s in plan.shards]
    disk_root = out_dir.resolve()
    while not disk_root.exists():
        disk_root = disk_root.parent
    free = shutil.disk_usage(disk_root).free
    result = ConvertResult(out=str(out_dir), target=tgt.info.name, device=dev, shards=len(plan.shards),
                           shards_kept=len(kept), bytes_read=plan.read_bytes, bytes_written=write_total,
                           seconds=0.0, dry_run=dry_run, free_disk=free, plan=plan_rows)
    if dry_run:
        result.seconds = time.perf_counter() - t0
        return result
    if write_total * DISK_HEADROOM > free:
        raise InputError(f"OUT {out_dir}: needs {write_total} bytes, {free} free on {disk_root}; free space "
                         "or choose another disk")

    if group.rank == 0:
        if overwrite and out_dir.exists():
            _clear_output(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        remove_temporaries(out_dir)

    manifest = {
        "schema": SCHEMA,
        "complete": False,
        "tool": tool_versions(),
        "options": options,
        "source": _source_record(source, {}),
        "model": source.model.to_json(),
        "target": _target_record(tgt, opts),
        "ep": {"world_size": opts.ep_size,
               "expert_ranges": [list(r) for r in ep_ranges(source.model.n_routed_experts, opts.ep_size)]},
        "layers": tgt.layers_record(source.model, opts, list(plan.units.values())),
        "files": dict(kept),
        "status": {s.filename: ("written" if s.filename in kept else "pending") for s in plan.shards},
    }
    if group.rank == 0:
        write_manifest(out_dir, manifest)
    group.barrier()

    todo = [s for s in todo if owner[plan.shards.index(s)] == group.rank]
    write_total = sum(s.nbytes for s in todo)
    result.bytes_written = write_total
    mine: dict[str, dict] = {}

    budget = _lane_budget(memory_bytes, biggest_unit)
    lanes = _lane_count(writers, len(todo), memory_bytes, budget)
    # Input hashing keeps pace with the lanes' output hashing: as many threads as the input's share of the bytes.
    hash_threads = min(max(1, (os.cpu_count() or 1) // 4), math.ceil(lanes * plan.read_bytes / max(write_total, 1)))
    hasher = _InputHasher(source, source.input_files() if group.rank == 0 else [], hash_threads)
    timings = {"start": time.perf_counter() - t0, "wait_for_data": 0.0, "write": 0.0}
    lock = threading.Lock()
    done = 0

    # Each unit's report goes with the shard that holds its first output: kept with the shard's record, it
    # survives an interruption, and a resumed run reports the units of the shards it kept.
    first_units: dict[str, list[str]] = {}
    seen: set[str] = set()
    for planned in plan.shards:
        for t in planned.tensors:
            for k in t.producers:
                if k not in seen:
                    seen.add(k)
                    first_units.setdefault(planned.filename, []).append(k)

    def written(shard: OutShard, rec) -> None:
        part = tgt.report(first_units.get(shard.filename, []))
        with lock:
            mine[shard.filename] = {"size": rec.size, "sha256": rec.sha256, **({"report": part} if part else {})}
            if group.world == 1:
                manifest["files"][shard.filename] = mine[shard.filename]
                manifest["status"][shard.filename] = "written"
                write_manifest(out_dir, manifest)
            else:  # one status file per rank: ranks never rewrite the same file
                write_rank_status(out_dir, group.rank, mine)

    def wrote(nbytes: int) -> None:
        nonlocal done
        with lock:
            done += nbytes
            if progress:
                progress(done, write_total)

    queue = _ShardQueue(todo)
    producers = [_Producer(plan, queue, source, tgt, dev, budget) for _ in range(lanes)]
    with contextlib.ExitStack() as stack:
        for p in producers:
            stack.enter_context(p)
        jobs = [functools.partial(_write_lane, p, out_dir, timings, lock, wrote, written) for p in producers]
        _run_lanes(jobs, producers)
    for p in producers:
        for k, v in p.seconds.items():
            timings[k] = timings.get(k, 0.0) + v
    result.timings = {k: round(v, 3) for k, v in timings.items()}
    for part in group.gather(mine):
        manifest["files"].update(part)
        manifest["status"].update({f: "written" for f in part})
    if group.rank != 0:
        group.barrier()  # rank 0 writes the metadata and the complete manifest
        group.close()
        result.seconds = time.perf_counter() - t0
        return result

    # Metadata files last: a folder without them never looks complete.
    weight_map = {t.name: s.filename for s in plan.shards for t in s.tensors}
    index = {"metadata": {"total_size": sum(s.nbytes for s in plan.shards)},
             "weight_map": dict(sorted(weight_map.items()))}
    write_json(out_dir / INDEX_NAME, index)
    write_json(out_dir / "config.json", tgt.update_config(source.config, source.model, opts))
    for rel in source.extra_files:
        if rel != "README.md":
            copy_file(source.root / rel, out_dir / rel)
    manifest["source"] = _source_record(source, hasher.result())
    old_files = (old or {}).get("source", {}).get("files", {})
    changed = [rel for rel, rec in manifest["source"]["files"].items()
               if old_files.get(rel, {}).get("sha256") not in (None, rec["sha256"])]
    if changed:
        raise InputError(f"--resume: the sha256 of {', '.join(changed)} differs from when {out_dir} was started; "
                         "run again with --overwrite")
    # the per-shard parts stay in the shard records: a --resume of this folder, complete or not, reuses them
    manifest["report"] = tgt.merge_reports([manifest["files"][s.filename].get("report", {}) for s in plan.shards])
    write_text(out_dir / "README.md", model_card(manifest, command=command))
    for rel in [INDEX_NAME, "config.json", "README.md", *[r for r in source.extra_files if r != "README.md"]]:
        manifest["files"][rel] = file_record(out_dir / rel)
    manifest["complete"] = True
    write_manifest(out_dir, manifest)
    remove_rank_status(out_dir)
    group.barrier()
    group.close()
    result.report = manifest["report"]
    result.seconds = time.perf_counter() - t0
    return result


class _Group:
    """The ranks of a torchrun launch (WORLD_SIZE > 1), or a single process. Ranks exchange only small
    objects (shard records) through gloo; each converts its own shards on its own device."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.dist = None
        if self.world > 1:
            import torch.distributed as dist

            self.owned = not dist.is_initialized()
            if self.owned:
                dist.init_process_group("gloo")
            self.dist = dist
            self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def barrier(self) -> None:
        if self.dist:
            self.dist.barrier()

    def close(self) -> None:
        """Tear down a process group this run created (leaving one alive aborts at interpreter exit)."""
        if self.dist and self.owned:
            self.dist.destroy_process_group()
            self.dist = None

    def gather(self, obj) -> list:
        if not self.dist:
            return [obj]
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out


def _target_record(tgt: Target, opts: TargetOptions) -> dict:
    info = tgt.info
    return {"name": info.name, "kernel_name": info.kernel_name, "vllm_moe_backend": info.vllm_moe_backend,
            "capabilities": list(info.capabilities), "weight_format": info.weight_format,
            "activation_format": info.activation_format, "needs_nvshmem": info.needs_nvshmem,
            "runtime_module": info.runtime_module, "parameters": dict(sorted(opts.params.items()))}


def _clear_output(out_dir: Path) -> None:
    """Remove what an earlier conversion wrote (the manifest's files, shards, temporaries)."""
    old = read_manifest(out_dir)
    for rel in list(old.get("files", {})) + list(old.get("status", {})):
        (out_dir / rel).unlink(missing_ok=True)
    for p in out_dir.glob("model-*-of-*.safetensors"):
        p.unlink()
    remove_temporaries(out_dir)
    remove_rank_status(out_dir)
    (out_dir / MANIFEST_NAME).unlink()


def verify(out: str, deep: bool = False, samples: int = 8, src: str | None = None) -> dict:
    """Re-hash every output file against the manifest and check index, manifest and headers agree.
    With `deep`, re-derive `samples` converted units from the source and compare them bit for bit."""
    out_dir = Path(out)
    manifest = read_manifest(out_dir)
    res = verify_files(out_dir, manifest)
    report = {"files": res.files, "bytes": res.bytes, "problems": res.problems, "deep_checked": 0}
    if res.problems or not deep:
        return report
    source = open_source(src or manifest["source"]["spec"], revision=manifest["source"]["revision"], offline=True)
    tgt = get_target(manifest["target"]["name"])
    o = manifest["options"]
    arch = parse_arch(o["arch"])
    opts = TargetOptions(ep_size=o["ep_size"], arch=arch, device="cpu", allow_lossy=o["allow_lossy"], params=o["params"])
    units = tgt.units(source.model, opts)
    rows = piece_rows(units)  # a unit may write only some rows of a tensor
    step = max(1, len(units) // samples)
    for unit in units[::step][:samples]:
        want = tgt.run(unit, {n: source.read(n) for n in unit.inputs}, "cpu")
        got = read_output_tensors(out_dir, list(want))
        for name, w in want.items():
            lo, hi = rows[(unit.key, name)]
            g = got[name] if (lo, hi) == (0, got[name].shape[0]) else got[name][lo:hi]
            if g.shape != w.shape or not torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)):
                report["problems"].append(f"{out_dir}: tensor {name!r} differs from a fresh conversion of the source; "
                                          "the output is damaged, convert again with --overwrite")
        report["deep_checked"] += 1
        if report["problems"]:
            break
    return report


def inspect(src: str, *, revision: str | None = None, offline: bool = False, ep_size: int = 1,
            arch: str | None = None) -> dict:
    """What the checkpoint holds (geometry, tensor classes, bytes) and which targets fit it."""
    from .targets import all_targets

    source = open_source(src, revision=revision, offline=offline)
    model = source.model
    expert_bytes = sum(source.info(n).nbytes for n in source.weight_map if parse_expert_name(n))
    classes: dict[str, int] = {}
    for n in source.weight_map:
        dtype = source.info(n).dtype
        kind = "routed expert" if parse_expert_name(n) else "other"
        classes[f"{kind} {dtype}"] = classes.get(f"{kind} {dtype}", 0) + 1
    fits = {}
    for t in all_targets():
        opts = TargetOptions(ep_size=ep_size, arch=parse_arch(arch), device="cuda")
        problems = [p for p in t.validate(model, opts) if not p.startswith("--device")]
        fits[t.info.name] = problems or "fits"
    from .checkpoint.spec import variant_name

    return {"source": source.spec, "root": str(source.root), "revision": source.revision,
            "variant": variant_name(model, source.config), "model": model.to_json(), "shards": len(source.headers), "tensors": len(source.weight_map),
            "bytes": source.total_bytes, "routed_expert_bytes": expert_bytes, "tensor_classes": dict(sorted(classes.items())),
            "files": source.input_files(), "targets": fits}


def list_targets() -> list[dict]:
    """Every target, what it declares, and whether this machine can run its conversion now."""
    from .targets import all_targets

    rows = []
    for t in all_targets():
        ok, why = t.availability()
        info = t.info
        rows.append({"name": info.name, "kernel_name": info.kernel_name, "aliases": list(info.aliases),
                     "vllm_moe_backend": info.vllm_moe_backend, "capabilities": list(info.capabilities),
                     "weight_format": info.weight_format, "activation_format": info.activation_format,
                     "needs_nvshmem": info.needs_nvshmem, "preprocess_needs_cuda": info.preprocess_needs_cuda,
                     "needs_packages": list(info.needs_packages), "available_here": ok, "why": why,
                     "description": info.description})
    return rows
