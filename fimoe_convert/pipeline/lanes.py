"""Writer lanes: each writes the shards its feeder took, one after another, through a ShardWriter (temporary
name, fsync, rename); several lanes write and hash several shards at once. Also how many lanes, and how much
memory each holds."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Callable

from ..files.safetensors import IO_BLOCK, STAGE_BLOCKS, PlannedTensor, ShardWriter, WrittenFile
from ..files.source import Source
from ..plan import OutShard, Plan
from .channels import Stopped
from .feeder import Chunk, Feeder, ShardQueue, ShardStart, nbytes

SHARD_METADATA = {"format": "pt"}  # what transformers and safetensors' torch API write; some loaders look for it
READ_AHEAD_MAX = 128 << 20  # bytes read or converted ahead of the writer, unless two units need more
MAX_LANES = 4  # one sha256 per lane; more lanes than this gained nothing on the machines measured
CORES_PER_LANE = 4  # a lane keeps a reader, a converter, a writer and a hasher busy


def lane_budget(memory_bytes: int, biggest_unit: int) -> int:
    """Bytes one lane holds between reading and writing: two units (inputs and outputs) or READ_AHEAD_MAX,
    so that reading, converting and writing overlap, within a quarter of --max-memory (the rest: write
    buffers, the unit being converted, pinned and allocator caches), or half where two units fit there (a
    whole-block unit of GBs: one unit at a time would serialize read, convert and write)."""
    two_units = 4 * biggest_unit
    cap = max(memory_bytes // 4, two_units if two_units <= memory_bytes // 2 else 0)
    return max(min(cap, max(READ_AHEAD_MAX, two_units)), IO_BLOCK)


def lane_count(writers: int | None, shards: int, memory_bytes: int, budget: int) -> int:
    """Shards written at once. Each lane hashes its own shard, and one sha256 runs at 1.2 to 1.8 GB/s on
    the machines measured, below a fast disk; auto: a lane per 4 cores, at most 4, as many as fit their
    budgets and write buffers into a quarter of --max-memory."""
    if writers is None:
        fits = memory_bytes // 4 // (budget + STAGE_BLOCKS * IO_BLOCK)
        writers = min(MAX_LANES, max(1, (os.cpu_count() or 1) // CORES_PER_LANE), max(1, fits))
    return max(1, min(writers, shards))


class Lanes:
    """`count` lanes writing `shards` of `plan` into `out_dir`. `on_bytes(n)` after every written chunk,
    `on_shard(shard, written file)` after every finished shard (both from lane threads). `timings`: seconds per
    stage, summed over lanes."""

    def __init__(self, plan: Plan, shards: list[OutShard], source: Source, target, out_dir: Path, count: int,
                 budget: int, on_bytes: Callable[[int], None], on_shard: Callable[[OutShard, WrittenFile], None]):
        self.out_dir, self.on_bytes, self.on_shard = out_dir, on_bytes, on_shard
        queue = ShardQueue(shards)
        self.feeders = [Feeder(plan, queue, source, target, budget) for _ in range(count)]
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

        def guard(feeder: Feeder) -> None:
            try:
                self._lane(feeder)
            except Stopped:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)
                self._stop()

        threads = [threading.Thread(target=guard, args=(f,), name=f"fimoe-lane{i}", daemon=True)
                   for i, f in enumerate(self.feeders)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)  # wakes for Ctrl-C
        except BaseException:
            self._stop()
            for t in threads:
                t.join()
            raise
        if errors:
            raise errors[0]

    def _lane(self, feeder: Feeder) -> None:
        """Write the shards `feeder` took, in order."""
        items = feeder.chunks()
        wait = busy = 0.0
        try:
            while True:
                t1 = time.perf_counter()
                start = next(items, None)
                wait += time.perf_counter() - t1
                if start is None:
                    return
                assert isinstance(start, ShardStart), start
                shard = start.shard
                planned = [PlannedTensor(t.name, t.dtype, t.shape) for t in shard.tensors]
                with ShardWriter(self.out_dir / shard.filename, planned, SHARD_METADATA) as writer:
                    for t in shard.tensors:
                        writer.begin_tensor(t.name)
                        last = False
                        while not last:
                            t1 = time.perf_counter()
                            chunk = next(items)
                            t2 = time.perf_counter()
                            assert isinstance(chunk, Chunk) and chunk.tensor.name == t.name, (chunk, t.name)
                            writer.write_part(chunk.data)
                            last = chunk.last
                            wait += t2 - t1
                            busy += time.perf_counter() - t2
                            self.on_bytes(nbytes(chunk.data))
                        writer.end_tensor()
                    t1 = time.perf_counter()
                    rec = writer.finish()
                    busy += time.perf_counter() - t1
                self.on_shard(shard, rec)
        finally:
            with self.lock:
                self.timings["wait_for_data"] += wait
                self.timings["write"] += busy
