"""`convert(src, out, target, ...)`: the library entry point, as the list of steps it takes.

Everything that can be checked is checked before any tensor data is read (the flags, SRC's config, index and
every shard header, the target against the model, OUT), and all problems are reported at once; the flags and SRC's
name before torch is even imported (seconds), which this module's own import does not do. Then the plan,
what an earlier run left (--resume), the first manifest, the shards (written by the pipeline's lanes), and
finally the index, config, model card and the manifest with `complete: true`."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import eta, resume as resuming
from .checkpoint import check_preset_model
from .console import COPIES, UNITS, signals_deferred
from .distributed import Group
from .errors import InputError, ValidationError
from .files.hashing import CORES_PER_INPUT_HASH, hash_threads
from .files.names import INDEX_NAME
from .files.output.atomic import remove_own_temporaries
from .files.output.folder import (
    check_out,
    copy_file,
    file_record,
    free_disk,
    path_kind,
    prepare_out,
    write_json,
    write_text,
)
from .files.output.lock import OutLock
from .files.output.manifest import LiveManifest, remove_rank_status, write_manifest
from .files.output.space import reclaimable_bytes
from .files.sources.card import source_license
from .files.sources.hub import check_source
from .files.sources.local import Source, open_source
from .files.sources.stream import StreamedSource, end_early, open_streamed, stream_early
from .hub import model_card
from .options import DEFAULT_MAX_MEMORY, DEFAULT_SHARD_SIZE, ConvertOptions, Request, check_flags
from .pipeline.reads import source_reads
from .plan import OutShard, Plan, Unit, assign_shards, plan_shards, planned_tensors
from .records import ConvertResult, IndexMetadata, Manifest, OutIndex, PlanRow, Status
from .sizes import human
from .targets import make_target

DISK_HEADROOM = 1.02  # free-disk check keeps 2% spare for headers and the file system
log = logging.getLogger("fimoe_convert")


def convert(src: str, out: str, target: str | None = None, *, revision: str | None = None, ep_size: int = 1,
            device: str = "auto", arch: str | None = None, max_memory: str | int = DEFAULT_MAX_MEMORY,
            shard_size: str | int = DEFAULT_SHARD_SIZE, allow_lossy: bool = False, params: dict | None = None,
            resume: bool = False, overwrite: bool = False, dry_run: bool = False, offline: bool = False,
            writers: int | None = None, progress: Callable[[int, int], None] | None = None,
            check_progress: Callable[[int, int], None] | None = None, command: str | None = None,
            stream: bool = False, upload_repo: str | None = None, model: str | None = None,
            config: str | None = None, notice: Callable[[str], None] | None = None,
            connections: int | None = None, engine: str | None = None) -> ConvertResult:
    """Convert the DeepSeek V4 checkpoint SRC (folder or Hub repo id) into OUT for `target`.

    `writers`: output shards written at once (default: from the cores and --max-memory); the output is the
    same for any value. `progress(done_bytes, total_bytes)` is called after every written tensor part (with
    `parts={COPIES: (done, total), UNITS: (done, total)}`, `runs_left` (the seconds the units not yet run
    take, eta.UnitRuns) and `runs_warm` (that rests on a second run of a kind) when it has `takes_parts`, and then
    after every unit run too: their bytes cost differently),
    `check_progress` while --resume re-hashes the shards it keeps; `command` is the command line shown in the
    model card. `stream`: read a Hub SRC's shards over HTTP straight into the conversion, none to disk
    (files/sources/stream.py), `connections` ranged GETs at once (default stream.CONNECTIONS); `upload_repo`:
    publish the finished, verified OUT there at the end (`upload`); `model`: the DeepSeek V4 variant a preset
    (`config`) is made for, checked against SRC; `notice(line)` is told of a wait before it starts (the --dry-run's
    sample timing). `engine` (vllm, sglang, transformers, flashinfer): the output must load there; without
    `target` it picks that engine's conversion (serving.engine_option); `target` None otherwise means bf16."""
    # 1. What needs neither torch nor SRC's files, in a fraction of a second: the flags, OUT, and SRC's name (a
    # folder, or a repo the Hub has).
    flags = check_flags(target, ep_size=ep_size, arch=arch, max_memory=max_memory, shard_size=shard_size,
                        params=params, resume=resume, overwrite=overwrite, writers=writers, device=device,
                        engine=engine)
    req = Request(src, Path(out).expanduser(), flags, device=device, allow_lossy=allow_lossy, revision=revision,
                  resume=resume, overwrite=overwrite, dry_run=dry_run, offline=offline, stream=stream,
                  upload_repo=upload_repo, model=model, config=config, command=command, progress=progress,
                  check_progress=check_progress, notice=notice, connections=connections)
    local = Path(src).expanduser()
    if problems := check_out([local] if path_kind(local) == "folder" else [], req.out, resume, overwrite):
        raise ValidationError(problems)  # checked again once SRC is open (a Hub snapshot's cache folder too)
    check_source(src, revision, offline)
    early = stream and not (dry_run or resume)
    if early:  # the shards flow while torch is imported (seconds); the conversion takes the streams over
        stream_early(src, revision, flags.memory.stream_bytes(), req.connections)
    try:
        with signals_deferred():  # a stop inside torch's C++ initialization would abort the process: held to its end
            import torch  # noqa: F401
        t0 = time.perf_counter()  # the result's seconds and `start` leave the imports out
        opts = ConvertOptions.parse(flags, device=device, allow_lossy=allow_lossy)
        _mark("options")
        return _convert(req, opts, t0)
    finally:
        if early:
            end_early()


def _convert(req: Request, opts: ConvertOptions, t0: float) -> ConvertResult:
    """convert() once the flags are checked and torch is imported."""
    # 2. SRC (one process per node first under torchrun), the target against the model, OUT: all problems at once.
    group, out_dir = Group(), req.out
    # A dry run needs no weights: a Hub repo's are not downloaded for it (--resume compares the inputs: it does).
    source, converter = _checked(group, lambda: _open(req), opts, req)
    check_preset_model(req.model, req.config, source.model, source.config, source.root)
    _mark("opened")
    # 3. The plan, and the memory its largest unit needs.
    plan = build_plan(source, converter, opts.shard_bytes)
    biggest = _check_memory(plan, opts, source.model.n_routed_experts)
    _mark("planned")
    log.info("plan: %d shard(s), %d unit(s) of work, read %d bytes", len(plan.shards), len(plan.units), plan.read_bytes)
    with _holding(out_dir, group, active=not req.dry_run) as on_exit:  # rank 0 locks OUT until the end
        # 4. What an earlier run into OUT left, if it read the same source files.
        owner = assign_shards(list(plan.shards), group.world)
        old, carried = resuming.previous_run(out_dir, opts.record(), source, group) if req.resume else (None, {})
        kept = resuming.kept_shards(out_dir, old, plan, owner, group, req.check_progress)
        if old is not None:
            log.info("--resume: %d of %d shards kept", len(kept), len(plan.shards))
        # 5. The plan and the free disk; a dry run ends here, with its estimate.
        todo = [s for s in plan.shards if s.filename not in kept]
        result = _result(out_dir, source, converter, plan, kept, todo, req)
        if req.dry_run:
            # What this run took so far (SRC opened, the plan made, FlashInfer imported), a conversion takes too.
            result.estimate, result.estimate_seconds = eta.estimate(source, converter, plan, req.notice,
                                                                    out_dir=out_dir, setup_s=time.perf_counter() - t0)
            result.seconds = time.perf_counter() - t0
            return result
        # 6. OUT, and the first manifest (complete: false, every input's identity), before any shard.
        first = resuming.first_manifest(source, converter, opts.record(), plan, kept, carried)
        manifest = _first_write(out_dir, first, group, req.overwrite)
        on_exit.callback(manifest.close)  # a failed run's input hashers may still finish: they write no more
        _mark("manifest")
        # 7. This rank's shards, written by the lanes; rank 0 hashes the inputs beside them.
        todo = [s for s in todo if owner[plan.shards.index(s)] == group.rank]
        result.bytes_written = sum(s.nbytes for s in todo)
        lanes, budget, threads = _sizing(opts, biggest, len(todo), plan.read_bytes, result.bytes_written)
        hashes = resuming.hash_inputs(source, resuming.local_inputs(source) if group.rank == 0 else [], threads,
                                      manifest)
        on_exit.callback(hashes.cancel)  # a failed run hashes no more inputs (those being hashed end)
        cap = opts.memory.stream_bytes(lanes, budget, biggest)
        _start_stream(source, plan, todo, carried, cap, manifest, on_exit, req.connections, lanes)
        mine = _write_shards(plan, todo, source, converter, (lanes, budget), manifest, group, req, result, t0)
        # 8. Every rank's records together; rank 0 writes the metadata files and the complete manifest.
        need = functools.partial(opts.memory.stream_need, lanes=lanes, lane_bytes=budget, biggest_unit=biggest)
        digests = {**hashes.result(), **_streamed_hashes(source, result, need)}
        manifest.flush()
        manifest.close()
        for part in group.gather(mine):
            manifest.manifest.files.update(part)
            manifest.manifest.status.update({f: Status.WRITTEN for f in part})
        if group.rank == 0:
            _finish(out_dir, source, converter, plan, manifest.manifest, old, digests, req.command, req.flags.engine)
            result.report = manifest.manifest.report
        group.barrier()
        if req.upload_repo and group.rank == 0:  # one upload per launch, under the lock this run holds
            from .publish import upload

            result.upload = upload(str(out_dir), req.upload_repo, lock=False)
    group.close()
    return _done(result, opts, t0)


def _mark(step: str) -> None:
    """A `-vv` timeline line: where convert()'s start goes."""
    log.debug("timeline %.3f %s", time.perf_counter(), step)


def _first_write(out_dir: Path, first: Manifest, group: Group, overwrite: bool) -> LiveManifest:
    """OUT made ready (an earlier conversion cleared with --overwrite) and the first manifest written by rank 0,
    before any shard; every rank waits for it."""
    manifest = LiveManifest(out_dir, first, group.rank == 0)
    if group.rank == 0:
        prepare_out(out_dir, overwrite)
        write_manifest(out_dir, manifest.manifest)
    group.barrier()
    return manifest


def _done(result: ConvertResult, opts: ConvertOptions, t0: float) -> ConvertResult:
    """The result with the run's seconds and, on CUDA, the device memory peak."""
    if opts.target.device == "cuda":
        import torch

        result.device_peak_bytes = torch.cuda.max_memory_allocated()
    result.seconds = time.perf_counter() - t0
    log.info("done in %.1f s; seconds per stage (summed over lanes): %s", result.seconds, result.timings)
    return result


def _start_stream(source: Source, plan: Plan, todo: list[OutShard], carried: dict, cap: int,
                  manifest: LiveManifest, on_exit: contextlib.ExitStack, connections: int | None,
                  lanes: int) -> None:
    """--stream: start reading the source shards, each hashed as it streams and recorded once verified; `cap`
    bytes (MemoryBudget.stream_bytes) hold source bytes that arrive before the lanes read them. No-op for another
    source."""
    if isinstance(source, StreamedSource):
        log.info("--stream: holding up to %d bytes of source shards that arrive ahead of the conversion", cap)
        source.start(source_reads(plan, todo, source, lanes), carried, cap,
                     lambda rel, sha: resuming.record_sha(source, manifest, rel, sha), connections)
        on_exit.push(lambda failed, *_: source.close(failed is not None))


def _open(req: Request) -> Source:
    """SRC: streamed over HTTP for --stream (a real run), otherwise a folder or the Hub cache; a dry run needs no
    weights: a Hub repo's are not downloaded for it (--resume compares the inputs: it does)."""
    if req.stream and not req.dry_run:
        return open_streamed(req.src, req.revision)
    return open_source(req.src, revision=req.revision, offline=req.offline, weights=not req.dry_run or req.resume)


def _streamed_hashes(source: Source, result: ConvertResult, need: Callable[[int], int]) -> dict[str, str]:
    """--stream: {shard: sha256} once every stream is verified (raises a mismatch, naming the shard); a warning
    where bytes were fetched twice, naming the --max-memory (`need(hold)`) that holds what arrived ahead."""
    if not isinstance(source, StreamedSource):
        return {}
    hashes = source.verified()
    result.bytes_fetched, result.bytes_held_peak = source.fetched, source.peak_held
    result.stream_max_memory = need(source.peak_need)
    shards = sum(source.file_size(r) for r in hashes)
    if source.fetched > shards:
        log.warning("--stream fetched %s for %s of shards (%.2fx): the conversion reads the shards' tensors out of "
                    "file order and --max-memory held too little of what arrived ahead of it; --max-memory %s "
                    "would fetch each byte once", human(source.fetched), human(shards), source.fetched / shards,
                    human(result.stream_max_memory))
    return hashes


def _checked(group: Group, opening: Callable[[], Source], opts: ConvertOptions, req: Request) -> tuple[Source, object]:
    """(SRC, its converter) once SRC opens, the target fits the model and the options, and OUT may be written; every
    problem of the three at once (ValidationError). Ends when every rank has checked OUT."""
    source, error = group.per_node(opening)
    problems = list(error.problems) if error else []
    converter = None
    if source is not None:
        converter = make_target(opts.kernel, source.model, opts.target)
        problems += check_out([source.root, source.allowed], req.out, req.resume, req.overwrite) + converter.validate()
    if problems:
        raise ValidationError(problems)
    group.barrier()  # every rank has checked OUT before rank 0 creates it
    return source, converter


def _result(out_dir: Path, source: Source, converter, plan: Plan, kept: dict, todo: list[OutShard],
            req: Request) -> ConvertResult:
    """The run's result before any shard is written; for a real run, refused (InputError) when OUT's disk has not
    the room for the shards and copied files, with headroom."""
    disk, free = free_disk(out_dir)
    if req.overwrite:  # the earlier conversion is removed first: its bytes are free for this one
        free += reclaimable_bytes(out_dir)
    result = ConvertResult(out=str(out_dir), target=converter.kernel.name, device=converter.opts.device,
                           shards=len(plan.shards),
                           shards_kept=len(kept), bytes_read=plan.read_bytes, bytes_written=sum(s.nbytes for s in todo),
                           seconds=0.0, dry_run=req.dry_run, free_disk=free, skipped=list(source.skipped),
                           params=dict(sorted(converter.opts.params.items())),
                           plan=[PlanRow(s.filename, s.rank, len(s.tensors), s.nbytes, s.filename in kept)
                                 for s in plan.shards])
    needed = result.bytes_written + sum(source.file_size(r) for r in copied_files(source))
    if not req.dry_run and needed * DISK_HEADROOM > free:
        raise InputError(f"OUT {out_dir}: needs {needed} bytes (shards and copied files), {free} free on {disk}; "
                         "free space or choose another disk")
    return result


def _sizing(opts: ConvertOptions, biggest: int, shards: int, read_bytes: int,
            write_bytes: int) -> tuple[int, int, int]:
    """(lanes, bytes of each lane's budget, input hash threads) for writing `shards` shards."""
    budget = opts.memory.lane_bytes(biggest)
    lanes = opts.memory.lane_count(opts.writers, shards, budget)
    # Input hashing keeps pace with the lanes' output hashing: as many threads as the input's share of the bytes.
    threads = min(hash_threads(CORES_PER_INPUT_HASH), math.ceil(lanes * read_bytes / max(write_bytes, 1)))
    log.info("writing %d shard(s) on %d lane(s) of %d bytes each; %d input hash thread(s)", shards, lanes, budget,
             threads)
    return lanes, budget, threads


@contextlib.contextmanager
def _holding(out_dir: Path, group: Group, active: bool):
    """OUT locked by rank 0 from here to the end of the run (`active`; a dry run writes nothing and takes no
    lock); on any failure, Ctrl-C included, every temporary file this process created in OUT is removed. Yields
    an ExitStack for more clean-up (run first)."""
    lock = OutLock(out_dir)
    if active:
        problem = None
        if group.rank == 0:
            try:
                lock.acquire()
            except InputError as e:
                problem = str(e)
        problems = [p for p in group.gather(problem) if p]
        if problems:
            raise InputError(problems[0])
    with contextlib.ExitStack() as stack:
        stack.callback(lock.release)
        stack.push(lambda failed, *_: remove_own_temporaries(out_dir) if failed else None)
        yield stack


def copied_files(source: Source) -> list[str]:
    """SRC's small files copied into OUT as they are (its README.md is replaced by the model card)."""
    return [r for r in source.extra_files if r != "README.md"]


def build_plan(source: Source, target, shard_size: int) -> Plan:
    """Copies of every non-expert tensor that no unit rewrites, plus the target's units; packed into shards."""
    units = target.all_units(source.non_expert_tensors())
    tensors = planned_tensors(source.non_expert_tensors(), units)
    read = sum(source.info(n).nbytes for n in source.weight_map)
    return Plan(tuple(plan_shards(tensors, shard_size)), {u.key: u for u in units}, read)


def _check_memory(plan: Plan, opts: ConvertOptions, experts: int) -> int:
    """The largest unit's output bytes, refused (MemoryBudget.check_unit) when that unit does not fit."""
    biggest = max(plan.units.values(), key=lambda u: u.out_bytes, default=None)
    if biggest is None:
        return 0
    opts.memory.check_unit(biggest.key, biggest.out_bytes, opts.target.ep_size, experts,
                           by_rank=bool(opts.kernel.kernel_name))
    return biggest.out_bytes


def _write_shards(plan: Plan, todo: list[OutShard], source: Source, converter, lanes: tuple[int, int],
                  manifest: LiveManifest, group: Group, req: Request, result: ConvertResult, t0: float) -> dict:
    """Write this rank's shards (pipeline.lanes.write_shards); {shard file: record} of those written."""
    from .pipeline.lanes import write_shards  # torch's tensors: kept out of this module's import (flags first)

    lock = threading.Lock()
    copies = sum(t.nbytes for s in todo for t in s.tensors if not t.producers)
    total = {COPIES: copies, UNITS: result.bytes_written - copies}
    done = dict.fromkeys(total, 0)
    runs = eta.UnitRuns({plan.units[k] for s in todo for t in s.tensors for k in t.producers})
    parts = getattr(req.progress, "takes_parts", False)

    def tell() -> None:
        if parts:
            req.progress(sum(done.values()), result.bytes_written, parts={k: (done[k], total[k]) for k in total},
                         runs_left=runs.seconds_left, runs_warm=runs.warm)
        elif req.progress:
            req.progress(sum(done.values()), result.bytes_written)

    def on_bytes(n: int, copied: bool) -> None:
        with lock:
            done[COPIES if copied else UNITS] += n
            tell()

    def on_converted(unit: Unit, seconds: float) -> None:
        # the units' cost is known from the first unit run, before its outputs are written (a whole-block unit's
        # come after many seconds of copies and runs)
        with lock:
            runs.ran(unit, seconds / lanes[0])  # the lanes run units side by side
            if parts:
                tell()

    start = time.perf_counter() - t0
    mine, timings = write_shards(plan, todo, source, converter, req.out, lanes, manifest, group.rank, group.world,
                                 on_bytes, on_converted)
    result.timings = {k: round(v, 3) for k, v in {"start": start, **timings}.items()}
    return mine


def _finish(out_dir: Path, source: Source, converter, plan: Plan, manifest: Manifest, old: Manifest | None,
            hashes: dict[str, str], command: str | None, engine: str | None = None) -> None:
    """Metadata files last, so that a folder without them never looks complete: the index, the config, copies
    of SRC's small files, the model card, and the manifest with `complete: true`."""
    weight_map = {t.name: s.filename for s in plan.shards for t in s.tensors}
    index = OutIndex(weight_map=dict(sorted(weight_map.items())),
                     metadata=IndexMetadata(sum(s.nbytes for s in plan.shards)))
    write_json(out_dir / INDEX_NAME, index.to_json())
    write_json(out_dir / "config.json", converter.update_config(source.config))
    copied = copied_files(source)
    for rel in copied:
        copy_file(source.root / rel, out_dir / rel)
    source.check_unchanged()  # every input is still the file the shards were read from
    manifest.source = resuming.source_record(source, hashes)
    resuming.check_source_hashes(out_dir, old, manifest.source)
    # the per-shard parts stay in the shard records: a --resume of this folder, complete or not, reuses them
    manifest.report = converter.merge_reports([manifest.files[s.filename].report for s in plan.shards])
    write_text(out_dir / "README.md", model_card(manifest, command, source_license(source.root, source.extra_files),
                                                    engine))
    for rel in [INDEX_NAME, "config.json", "README.md", *copied]:
        manifest.files[rel] = file_record(out_dir / rel)
    manifest.complete = True
    write_manifest(out_dir, manifest)
    remove_rank_status(out_dir)
