"""Writer lanes: each writes the shards its feeder took, in order, through ShardWriters (temporary name, fsync,
rename), up to SHARDS_PER_LANE at once; several lanes write and hash several shards at once (how many, and the
bytes each holds: budget.MemoryBudget)."""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..budget import SHARDS_PER_LANE
from ..files.output.manifest import LiveManifest, write_rank_status
from ..files.safetensors.header import PlannedTensor
from ..files.safetensors.writer import ShardWriter
from ..files.sources.local import Source
from ..files.sources.stream import StreamedSource
from ..plan import OutShard, Plan, Unit
from ..records import FileRecord, Manifest, Status
from .channels import Stopped
from .feeder import Chunk, Feeder, ShardQueue, ShardStart, nbytes
from .reads import shard_inputs

log = logging.getLogger("fimoe_convert")
SHARD_METADATA = {"format": "pt"}  # what transformers and safetensors' torch API write; some loaders look for it


class Lanes:
    """`count` lanes writing `shards` of `plan` into `out_dir`. `on_bytes(n, copied)` after every written chunk
    (`copied`: of a tensor copied as it is, not a unit's output), `on_converted(unit, seconds)` after every unit
    run (before its outputs are written), `on_shard(shard, written file)` after every finished shard (all from
    lane threads). `timings`: seconds per stage, summed over lanes."""

    def __init__(self, plan: Plan, shards: list[OutShard], source: Source, target, out_dir: Path, count: int,
                 budget: int, on_bytes: Callable[[int, bool], None], on_shard: Callable[[OutShard, FileRecord], None],
                 on_converted: Callable[[Unit, float], None] | None = None):
        self.out_dir, self.on_bytes, self.on_shard = out_dir, on_bytes, on_shard
        queue = ShardQueue(shards)
        self.feeders = [Feeder(plan, queue, source, target, budget, on_converted) for _ in range(count)]
        self.timings = {"wait_for_data": 0.0, "write": 0.0}
        self.lock = threading.Lock()

    def run(self) -> dict[str, float]:
        """Write every shard. The first failure, or Ctrl-C, stops all lanes: their feeders stop, each lane's
        ShardWriter deletes its temporary file, and the failure is raised here."""
        with contextlib.ExitStack() as stack:
            for f in self.feeders:
                stack.enter_context(f)
            if len(self.feeders) == 1:
                self._lane(self.feeders[0])
            else:
                self._threads()
        for f in self.feeders:
            for k, v in f.seconds.items():
                self.timings[k] = self.timings.get(k, 0.0) + v
        return self.timings

    def _stop(self) -> None:
        for f in self.feeders:
            f.stop()

    def _threads(self) -> None:
        errors: list[BaseException] = []

        ended = [threading.Event() for _ in self.feeders]

        def guard(feeder: Feeder, done: threading.Event) -> None:
            try:
                self._lane(feeder)
            except Stopped:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)
                self._stop()
            finally:
                done.set()

        threads = [threading.Thread(target=guard, args=(f, done), name=f"fimoe-lane{i}", daemon=True)
                   for i, (f, done) in enumerate(zip(self.feeders, ended, strict=True))]
        try:
            for t in threads:
                t.start()
            for done in ended:
                wait_for(done)
        except BaseException:
            self._stop()
            for t, done in zip(threads, ended, strict=True):
                if t.ident is not None:  # started (a Ctrl-C may have cut start() short)
                    wait_for(done)
            raise
        if errors:
            raise errors[0]

    def _lane(self, feeder: Feeder) -> None:
        """Write the shards `feeder` took, in order, up to SHARDS_PER_LANE at once: each shard has a writer thread
        and a sha256 of its own, so that the shards a whole-block unit spans are hashed side by side (one sha256
        stream is slower than the disk)."""
        items = feeder.chunks()
        jobs: collections.deque[_ShardJob] = collections.deque()
        wait = 0.0
        try:
            while True:
                t1 = time.perf_counter()
                item = next(items, None)
                wait += time.perf_counter() - t1
                if item is None:
                    break
                if isinstance(item, ShardStart):
                    for done in [j for j in jobs if j.done.is_set()]:  # a small shard is done at once
                        done.join()
                        jobs.remove(done)
                    while len(jobs) >= SHARDS_PER_LANE:
                        jobs[0].join()  # left in `jobs` until written: a Ctrl-C during the wait aborts it too
                        jobs.popleft()
                    jobs.append(job := _ShardJob(self, feeder, item.shard))
                    job.start()  # in `jobs` before its thread runs: a Ctrl-C from here on aborts it
                else:
                    jobs[-1].put(item)
            while jobs:
                jobs[0].join()
                jobs.popleft()
        except BaseException as e:
            failed = next((j.error for j in jobs if j.error is not None), None)
            for j in jobs:
                j.abort()
            if isinstance(e, Stopped) and failed is not None:
                raise failed from None  # a shard's writer failed and stopped the feeder: its error is the cause
            raise
        finally:
            with self.lock:
                self.timings["wait_for_data"] += wait


_ABORT = object()  # put into a shard job's queue: stop, deleting the temporary file


def wait_for(done: threading.Event) -> None:
    """Until a thread sets `done`, waking for Ctrl-C. Not Thread.join(timeout): a Ctrl-C raised inside it marks a
    thread that still runs as ended (CPython 3.11, threading._wait_for_tstate_lock), and later joins return at once."""
    while not done.wait(0.5):
        pass


class _ShardJob:
    """One shard written on a thread of its own from the chunks the lane puts in order; a failure stops the
    lane's feeder and is kept for the lane to raise."""

    def __init__(self, lanes: Lanes, feeder: Feeder, shard: OutShard):
        self.lanes, self.feeder, self.shard = lanes, feeder, shard
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.stopping = False  # set by abort: the chunks still queued are not written
        self.done = threading.Event()  # set as the thread ends
        self.thread = threading.Thread(target=self._run, name="fimoe-shard", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, chunk: Chunk) -> None:
        self.queue.put(chunk)

    def join(self) -> None:
        """Wait for the shard to be written; its failure is raised here."""
        wait_for(self.done)
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        self.stopping = True
        self.queue.put(_ABORT)  # wakes a job waiting for its next chunk
        if self.thread.ident is not None:  # its thread runs (a Ctrl-C may have cut start() short)
            wait_for(self.done)

    def _next(self) -> Chunk:
        chunk = self.queue.get()
        if chunk is _ABORT or self.stopping:
            raise Stopped
        return chunk

    def _run(self) -> None:
        shard, lanes = self.shard, self.lanes
        busy = 0.0
        try:
            if self.stopping:  # aborted before it ran
                return
            log.debug("timeline %.3f open %s", time.perf_counter(), shard.filename)
            planned = [PlannedTensor(t.name, t.dtype, t.shape) for t in shard.tensors]
            with ShardWriter(lanes.out_dir / shard.filename, planned, SHARD_METADATA,
                             pinned=self.feeder.target.opts.device_outputs) as writer:
                for t in shard.tensors:
                    writer.begin_tensor(t.name)
                    last = False
                    while not last:
                        chunk = self._next()
                        t1 = time.perf_counter()
                        assert isinstance(chunk, Chunk) and chunk.tensor.name == t.name, (chunk, t.name)
                        writer.write_part(chunk.data)
                        last = chunk.last
                        self.feeder.written(chunk)
                        busy += time.perf_counter() - t1
                        lanes.on_bytes(nbytes(chunk.data), not t.producers)
                    writer.end_tensor()
                t1 = time.perf_counter()
                rec = writer.finish()
                busy += time.perf_counter() - t1
            log.debug("timeline %.3f written %s", time.perf_counter(), shard.filename)
            lanes.on_shard(shard, rec)
        except Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 - raised by the lane thread
            self.error = e
            self.feeder.stop()
        finally:
            with lanes.lock:
                lanes.timings["write"] += busy
            self.done.set()


def write_shards(plan: Plan, todo: list[OutShard], source: Source, converter, out_dir: Path, lanes: tuple[int, int],
                 manifest: LiveManifest, rank: int, world: int, on_bytes: Callable[[int, bool], None],
                 on_converted: Callable[[Unit, float], None] | None = None
                 ) -> tuple[dict[str, FileRecord], dict[str, float]]:
    """Write this rank's shards on `lanes` (count, bytes of each one's budget): ({shard file: record} of those
    written, the lanes' timings); `on_bytes` and `on_converted` as Lanes calls them. Each finished shard is
    recorded at once (the manifest, or under torchrun a status file per rank), with the report of the units whose
    first output it holds, so that an interrupted run resumes with every finished shard and reports every unit
    once."""
    first_units: dict[str, list[str]] = {}
    seen: set[str] = set()
    for shard in plan.shards:
        for t in shard.tensors:
            for k in t.producers:
                if k not in seen:
                    seen.add(k)
                    first_units.setdefault(shard.filename, []).append(k)
    lock = threading.Lock()
    mine: dict[str, FileRecord] = {}

    def on_shard(shard: OutShard, rec: FileRecord) -> None:
        part = converter.report(first_units.get(shard.filename, []))

        def written(m: Manifest) -> None:
            m.files[shard.filename] = mine[shard.filename]
            m.status[shard.filename] = Status.WRITTEN

        with lock:
            mine[shard.filename] = FileRecord(rec.size, rec.sha256, part)
            if world == 1 and isinstance(source, StreamedSource):  # finished once its inputs are verified
                source.after_verified(shard_inputs(plan, shard), out_dir / shard.filename,
                                      lambda: manifest.update(written))
            elif world == 1:
                manifest.update(written)
            else:  # one status file per rank: ranks never rewrite the same file
                write_rank_status(out_dir, rank, mine)

    count, budget = lanes
    timings = Lanes(plan, todo, source, converter, out_dir, count, budget, on_bytes, on_shard, on_converted).run()
    return mine, timings
