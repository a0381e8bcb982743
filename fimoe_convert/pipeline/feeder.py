"""The two threads that feed one writer lane: a reader (source bytes into host memory, pinned for a GPU) and a
converter (the target's transform), in the writer's order, all within one byte budget, so that reading,
host-to-device copies, compute, device-to-host copies and writing overlap. On CUDA the converter does not
wait for its device-to-host copies: each unit's results carry an event that the writer waits on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..budget import IO_BLOCK
from ..files.sources.local import Source
from ..plan import OutShard, OutTensor, Plan, Unit
from .channels import END, Budget, Channel, Stopped
from .reads import in_file_order
from .schedule import KEEP_MAX, Copy, Emit, Run, group_steps, linked_groups

log = logging.getLogger("fimoe_convert")


@dataclass(frozen=True)
class ShardStart:
    shard: OutShard


@dataclass(frozen=True)
class Chunk:
    """Bytes for the writer: the next part of `tensor` (`last`: its final part). `held`: budget bytes to release
    once written; `event`: a CUDA event to wait on before reading `data`."""

    tensor: OutTensor
    data: torch.Tensor
    last: bool
    held: int
    event: object = None


@dataclass(frozen=True)
class _Inputs:
    """A unit's source tensors, read; `held`: the budget bytes taken for them and for its outputs written here."""

    run: Run
    unit: Unit
    tensors: dict
    held: int


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class ShardQueue:
    """The shards still to write, handed to whichever lane's reader asks first, so that lanes end together
    however the shards' sizes fall (a fixed split left some lanes with twice the bytes of others). Shards that
    share a unit go together (`linked_groups`), so that the unit is read and converted once."""

    def __init__(self, shards: list[OutShard]):
        self.shards = linked_groups(list(shards))
        self.lock = threading.Lock()

    def take(self) -> list[OutShard] | None:
        with self.lock:
            return self.shards.pop(0) if self.shards else None


class Feeder:
    """Reader and converter threads for one lane; the writer iterates `chunks()`. `stop()` wakes and ends both
    threads, and the writer's next step raises Stopped."""

    def __init__(self, plan: Plan, shards: ShardQueue, source: Source, target, budget: int,
                 on_converted: Callable[[Unit, float], None] | None = None):
        self.plan, self.shards, self.source, self.target = plan, shards, source, target
        self.on_converted = on_converted  # (unit, seconds its run took) as each unit is converted, before it is written
        self.cuda = target.opts.device == "cuda"
        self.budget = Budget(budget)
        self.read_q = Channel()  # reader -> converter
        self.out_q = Channel()  # converter -> writer
        self.seconds = {"read": 0.0, "convert": 0.0, "wait_for_device": 0.0}
        self.threads = [threading.Thread(target=self._pump, args=(self._reads, self.read_q), name="fimoe-read",
                                         daemon=True),
                        threading.Thread(target=self._pump, args=(self._converted, self.out_q), name="fimoe-convert",
                                         daemon=True)]

    def __enter__(self) -> "Feeder":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        """A failure or a stop: both threads wake, the reader too where it waits on the source for bytes."""
        self._close()
        self.source.interrupt()

    def _close(self) -> None:
        self.budget.close()
        self.read_q.close()
        self.out_q.close()

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self._close()
        else:
            self.stop()
        for t in self.threads:
            t.join(timeout=60)

    def _pump(self, items, channel: Channel) -> None:
        try:
            for item in items():
                channel.put(item)
            channel.put(END)
        except Stopped:
            return
        except BaseException as e:  # handed on to the writer thread, which raises it
            try:
                channel.put(self.source.explain(e))
            except Stopped:
                pass

    def _timed(self, stage: str, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds[stage] += time.perf_counter() - t0

    def _reads(self) -> Iterator:
        """Per group of shards taken from the queue: each shard's start, then its steps with the source bytes they
        need."""
        for group in iter(self.shards.take, None):
            for step in group_steps(group, self.plan.piece_bytes, IO_BLOCK, KEEP_MAX):
                if isinstance(step, OutShard):
                    yield ShardStart(step)
                elif isinstance(step, Copy):
                    self.budget.acquire(step.end - step.start)
                    data = self._timed("read", self.source.read_range, step.tensor.name, step.start, step.end)
                    yield Chunk(step.tensor, data, step.last, step.end - step.start)
                elif isinstance(step, Run):  # budget for its inputs and for its outputs written here
                    unit = self.plan.units[step.unit]
                    held = (sum(self.source.info(n).nbytes for n in unit.inputs)
                            + sum(self.plan.piece_bytes(unit.key, n) for n in step.writes))
                    self.budget.acquire(held)
                    log.debug("timeline %.3f read %s", time.perf_counter(), unit.key)
                    tensors = self._timed("read", self._read_all, in_file_order(unit.inputs, self.source))
                    log.debug("timeline %.3f read-done %s", time.perf_counter(), unit.key)
                    yield _Inputs(step, unit, tensors, held)
                else:
                    yield step

    def _read_all(self, names: list[str]) -> dict:
        return {n: self.source.read(n, pin=self.cuda) for n in names}

    def _converted(self) -> Iterator:
        """The reader's items with units run: ShardStart and Chunk, in the writer's order."""
        results: dict[tuple[str, str], torch.Tensor] = {}
        event = None
        for item in self.read_q.drain():
            if isinstance(item, _Inputs):
                t0 = time.perf_counter()
                log.debug("timeline %.3f convert %s", t0, item.unit.key)
                got = self.target.run(item.unit, item.tensors)
                for name in (*item.run.writes, *item.run.keeps):
                    results[(item.unit.key, name)] = got[name]
                if self.cuda:
                    event = torch.cuda.Event()
                    event.record()
                took = time.perf_counter() - t0
                self.seconds["convert"] += took
                log.debug("timeline %.3f convert-done %s", time.perf_counter(), item.unit.key)
                if self.on_converted is not None:
                    self.on_converted(item.unit, took)
                # the inputs are done with; the writer releases each written output's bytes as it writes it
                self.budget.release(item.held - sum(nbytes(got[n]) for n in item.run.writes))
                del got, item
            elif isinstance(item, Emit):  # a kept piece waits on a later event of the same stream: later work
                data = results.pop((item.unit, item.tensor.name))
                yield Chunk(item.tensor, data, item.last, 0 if item.kept else nbytes(data), event)
            else:
                yield item

    def chunks(self) -> Iterator:
        """For the writer: ShardStart, then that shard's Chunks once their data is on the host. The writer hands
        each chunk back through `written` once its bytes are written."""
        for item in self.out_q.drain():
            if isinstance(item, Chunk) and item.event is not None:
                self._timed("wait_for_device", item.event.synchronize)
            yield item

    def written(self, chunk: Chunk) -> None:
        """`chunk` is written: its bytes leave the budget and the target may reuse its memory."""
        self.budget.release(chunk.held)
        self.target.recycle(chunk.data)
