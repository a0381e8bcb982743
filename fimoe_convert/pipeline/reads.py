"""What the lanes will read from SRC, known before they start (pure): for a streamed source, which tensors to keep
in memory until read, for how many bytes, and in which order the source shards are first needed."""

from __future__ import annotations

import heapq

from ..budget import IO_BLOCK
from ..plan import OutShard, Plan
from .schedule import KEEP_MAX, Copy, Run, group_steps, linked_groups


def in_file_order(names, source) -> list[str]:
    """A unit's input tensors in the order they lie in SRC (shard, offset): a streamed source's bytes arrive in
    that order, and a piece read is a piece it can let go."""
    return sorted(names, key=lambda n: (source.weight_map[n], source.info(n).start))


def source_reads(plan: Plan, shards: list[OutShard], source, lanes: int = 1) -> list[tuple[str, int]]:
    """(source tensor, bytes) of every read the feeders make to write `shards`, in the order `lanes` lanes make
    them: each lane takes the next group of linked shards (ShardQueue) and reads its steps in turn (the same steps
    `Feeder._reads` takes; a unit whose outputs span two shards runs, and reads its inputs, once); reads of lanes
    running together interleave, each at the bytes read before it in its group (a lane's time goes with its bytes).
    `source`: SRC's tensors (weight_map, info)."""
    free = [(0, lane) for lane in range(max(1, lanes))]  # (bytes read when the lane is free, lane)
    timed: list[tuple[int, int, tuple[str, int]]] = []  # (bytes read before it, order, read)
    for group in linked_groups(list(shards)):
        at, lane = heapq.heappop(free)
        for step in group_steps(group, plan.piece_bytes, IO_BLOCK, KEEP_MAX):
            if isinstance(step, Copy):
                got = [(step.tensor.name, step.end - step.start)]
            elif isinstance(step, Run):
                got = [(n, source.info(n).nbytes) for n in in_file_order(plan.units[step.unit].inputs, source)]
            else:
                continue
            for read in got:
                timed.append((at, len(timed), read))
                at += read[1]
        heapq.heappush(free, (at, lane))
    return [read for *_, read in sorted(timed)]


def shard_inputs(plan: Plan, shard: OutShard) -> set[str]:
    """The source tensors that `shard`'s bytes come from."""
    names: set[str] = set()
    for t in shard.tensors:
        if t.producers:
            for k in t.producers:
                names.update(plan.units[k].inputs)
        else:
            names.add(t.name)
    return names
