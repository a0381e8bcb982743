"""What the lanes will read from SRC, known before they start (pure): for a streamed source, which tensors to keep
in memory until read, for how many bytes, and in which order the source shards are first needed."""

from __future__ import annotations

from ..budget import IO_BLOCK
from ..plan import OutShard, Plan
from .schedule import KEEP_MAX, Copy, Run, group_steps, linked_groups


def source_reads(plan: Plan, shards: list[OutShard], nbytes) -> list[tuple[str, int]]:
    """(source tensor, bytes) of every read the feeders make to write `shards`, in shard order: the same steps
    `Feeder._reads` takes, per group of linked shards (a unit whose outputs span two shards runs, and reads its
    inputs, once). `nbytes(name)`: a source tensor's size."""
    reads: list[tuple[str, int]] = []
    for group in linked_groups(list(shards)):
        for step in group_steps(group, plan.piece_bytes, IO_BLOCK, KEEP_MAX):
            if isinstance(step, Copy):
                reads.append((step.tensor.name, step.end - step.start))
            elif isinstance(step, Run):
                reads += [(n, nbytes(n)) for n in plan.units[step.unit].inputs]
    return reads


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
