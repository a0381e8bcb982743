"""Writer lanes: each writes the shards its feeder took, one after another, through a ShardWriter (temporary
name, fsync, rename); several lanes write and hash several shards at once (how many, and the
bytes each holds: budget.MemoryBudget)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..files.atomic import WrittenFile
from ..files.source import Source
from ..files.st_header import PlannedTensor
from ..files.st_writer import ShardWriter
from ..plan import OutShard, Plan
from .channels import Stopped
from .feeder import Chunk, Feeder, ShardQueue, ShardStart, nbytes

SHARD_METADATA = {"format": "pt"}  # what transformers and safetensors' torch API write; some loaders look for it


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
