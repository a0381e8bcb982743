"""The order of work for one output shard, as a list of typed steps (pure: testable without threads).

A shard's tensors are written in file order. A copied tensor is read in blocks. A converted tensor is
written by one or more units (a unit may write rows of several tensors); a unit runs where its first
piece in the shard is due, and serves the stretch of consecutive pieces it writes, plus its small pieces
(<= keep_max bytes) further on in the shard, which are kept until written. A larger piece further on gets
a run of its own, since holding it could starve the byte budget. A stretch that runs on into the next shard
(a whole-block unit's outputs span shards) is one run when one lane writes both shards (`linked_groups`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..plan import OutShard, OutTensor

KEEP_MAX = 1 << 20  # bytes: a unit's output written away from the rest of its outputs is kept, not recomputed

@dataclass(frozen=True)
class Copy:
    """Bytes [start, end) of a tensor copied byte for byte from SRC; `last`: its final block."""

    tensor: OutTensor
    start: int
    end: int
    last: bool


@dataclass(frozen=True)
class Run:
    """Run unit `unit`; of its outputs, `writes` are written in the stretch that follows and `keeps` (small)
    are kept until their turn further on in the shard."""

    unit: str
    writes: tuple[str, ...]
    keeps: tuple[str, ...]


@dataclass(frozen=True)
class Emit:
    """Write the piece of `tensor` that unit `unit` produced; `last`: the tensor's final piece; `kept`: it
    was kept since its unit ran (its bytes were not counted in the budget)."""

    tensor: OutTensor
    unit: str
    last: bool
    kept: bool


Step = Copy | Run | Emit


def shard_steps(shard: OutShard, piece_bytes: Callable[[str, str], int], block: int, keep_max: int) -> list[Step]:
    """The steps that write `shard`; `piece_bytes(unit, tensor)`: the bytes of the tensor that the unit writes."""
    return [s for s in group_steps([shard], piece_bytes, block, keep_max) if not isinstance(s, OutShard)]


def linked_groups(shards: list[OutShard]) -> list[list[OutShard]]:
    """`shards` in runs that one lane writes in turn: a shard joins the one before when the unit of its first
    piece also wrote the last piece there (a whole-block unit's outputs span shards: run once, not per shard)."""
    groups: list[list[OutShard]] = []
    for s in shards:
        prev = groups[-1][-1] if groups else None
        tail = prev.tensors[-1].producers[-1:] if prev and prev.tensors else ()
        if tail and s.tensors and s.tensors[0].producers[:1] == tail:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def group_steps(shards: list[OutShard], piece_bytes: Callable[[str, str], int], block: int,
                keep_max: int) -> list[Step | OutShard]:
    """The steps that write `shards` one after another, each shard's steps after the shard itself; a stretch of
    one unit's pieces that runs on into the next shard is one run."""
    pieces: list[tuple[OutTensor, str | None, bool]] = []  # (tensor, unit or None for a copy, last piece)
    starts: dict[int, list[OutShard]] = {}  # piece index -> the shards that begin there
    for shard in shards:
        starts.setdefault(len(pieces), []).append(shard)
        for t in shard.tensors:
            units = t.producers
            if not units:
                pieces.append((t, None, True))
            pieces += [(t, k, p == len(units) - 1) for p, k in enumerate(units)]

    runs: dict[int, tuple[str, list[str], list[str]]] = {}  # first piece -> (unit, writes, keeps)
    kept: set[int] = set()
    last_run: dict[str, int] = {}
    prev = None
    for i, (t, k, _) in enumerate(pieces):
        if k is not None and k == prev:
            runs[last_run[k]][1].append(t.name)
        elif k is not None and k in last_run and piece_bytes(k, t.name) <= keep_max:
            runs[last_run[k]][2].append(t.name)
            kept.add(i)
            k = None  # the next piece of this unit is not part of a stretch
        elif k is not None:
            runs[i] = (k, [t.name], [])
            last_run[k] = i
        prev = k

    steps: list[Step | OutShard] = []
    for i, (t, k, last) in enumerate(pieces):
        steps += starts.get(i, [])
        if k is None:
            n = t.nbytes
            steps += [Copy(t, s, min(n, s + block), s + block >= n) for s in range(0, max(n, 1), block)]
            continue
        if i in runs:
            unit, writes, keeps = runs[i]
            steps.append(Run(unit, tuple(writes), tuple(keeps)))
        steps.append(Emit(t, k, last, i in kept))
    steps += starts.get(len(pieces), [])
    return steps
