"""Pure planning: which tensors go out, grouped into which output shards, and what memory a unit of
work needs. Nothing here reads a file; the same inputs always give the same plan."""

from __future__ import annotations

from dataclasses import dataclass

from .checkpoint import natural_key
from .dtypes import tensor_nbytes

SHARD_NAME = "model-{i:05d}-of-{n:05d}.safetensors"


@dataclass(frozen=True)
class OutTensor:
    """One output tensor. `unit` is the key of the work unit that produces it, or None for a
    byte-for-byte copy of the source tensor of the same name; `parts`, when set, are the units that
    produce consecutive row ranges (dim 0) of it, in order. `rank` is the EP rank whose shards
    hold it (None: shards shared by every rank)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    unit: str | None = None
    rank: int | None = None
    parts: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)

    @property
    def producers(self) -> tuple[str, ...]:
        """Keys of the units that write this tensor, in file order (none for a copy)."""
        return self.parts or (() if self.unit is None else (self.unit,))


@dataclass(frozen=True)
class Unit:
    """A piece of conversion work: source tensors in, output tensors out (one expert for BF16, a
    chunk of one EP rank's experts for one leg of megamoe, one MoE block and EP rank for moe_ep
    targets). An output may be a row range of a larger tensor: several units then share its name,
    and `merge_outputs` joins them in unit order."""

    key: str
    block: str
    rank: int | None
    experts: tuple[int, int]  # [first, last) global expert ids
    inputs: tuple[str, ...]
    outputs: tuple[OutTensor, ...]
    leg: str | None = None  # for targets whose units hold one leg ("l1": gate and up, "l2": down)
    dense: bool = False  # rewrites a non-expert tensor (its inputs are then not copied)

    @property
    def out_bytes(self) -> int:
        return sum(t.nbytes for t in self.outputs)


@dataclass(frozen=True)
class OutShard:
    filename: str
    tensors: tuple[OutTensor, ...]
    rank: int | None

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def merge_outputs(units: list[Unit]) -> list[OutTensor]:
    """The output tensors of `units`, in order; outputs that several units share by name become one
    tensor whose rows are the units' pieces, concatenated in unit order (its `parts`)."""
    pieces: dict[str, list[OutTensor]] = {}
    for u in units:
        for t in u.outputs:
            pieces.setdefault(t.name, []).append(t)
    out = []
    for name, ps in pieces.items():
        if len(ps) == 1:
            out.append(ps[0])
            continue
        first = ps[0]
        shape = (sum(p.shape[0] for p in ps), *first.shape[1:])
        out.append(OutTensor(name, first.dtype, shape, None, first.rank, tuple(p.unit for p in ps)))
    return out


def planned_tensors(non_expert: dict[str, tuple[str, tuple[int, ...]]], units: list[Unit]) -> list[OutTensor]:
    """Every output tensor of a conversion: a copy of each non-expert tensor (name -> (dtype, shape)) that no unit
    rewrites, then the units' outputs."""
    rewritten = {n for u in units if u.dense for n in u.inputs}
    return [OutTensor(n, dtype, shape) for n, (dtype, shape) in non_expert.items() if n not in rewritten] + \
        merge_outputs(units)


def piece_rows(units: list[Unit]) -> dict[tuple[str, str], tuple[int, int]]:
    """(unit key, tensor name) -> the rows [lo, hi) of that tensor the unit writes."""
    rows: dict[tuple[str, str], tuple[int, int]] = {}
    done: dict[str, int] = {}
    for u in units:
        for t in u.outputs:
            lo = done.get(t.name, 0)
            rows[(u.key, t.name)] = (lo, lo + t.shape[0])
            done[t.name] = lo + t.shape[0]
    return rows


def ep_ranges(n_experts: int, ep_size: int) -> list[tuple[int, int]]:
    """Rank r owns experts [r*E/N, (r+1)*E/N)."""
    per = n_experts // ep_size
    return [(r * per, (r + 1) * per) for r in range(ep_size)]


def order_tensors(tensors: list[OutTensor]) -> list[OutTensor]:
    """Shared tensors first, then rank 0, 1, ...; by natural name order within each group."""
    return sorted(tensors, key=lambda t: (-1 if t.rank is None else t.rank, natural_key(t.name)))


def plan_shards(tensors: list[OutTensor], shard_size: int) -> list[OutShard]:
    """Pack tensors in order into shards of at most `shard_size` bytes (a larger tensor gets a shard
    of its own); shards never mix EP ranks, so a rank reads only its own files."""
    groups: list[tuple[int | None, list[OutTensor]]] = []
    size = 0
    for t in order_tensors(tensors):
        if not groups or groups[-1][0] != t.rank or (groups[-1][1] and size + t.nbytes > shard_size):
            groups.append((t.rank, []))
            size = 0
        groups[-1][1].append(t)
        size += t.nbytes
    n = len(groups)
    return [OutShard(SHARD_NAME.format(i=i + 1, n=n), tuple(ts), rank) for i, (rank, ts) in enumerate(groups)]


@dataclass(frozen=True)
class Plan:
    shards: tuple[OutShard, ...]
    units: dict[str, Unit]
    read_bytes: int

    def piece_bytes(self, key: str, name: str) -> int:
        """Bytes of tensor `name` that unit `key` writes."""
        return next(t.nbytes for t in self.units[key].outputs if t.name == name)


def assign_shards(shards: list[OutShard], world: int) -> list[int]:
    """Rank of each shard: largest first to the least-loaded rank (ties: lower index, lower rank).
    Every rank computes the same answer from the same plan."""
    load = [0] * world
    owner = [0] * len(shards)
    for i in sorted(range(len(shards)), key=lambda i: (-shards[i].nbytes, i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += shards[i].nbytes
    return owner
