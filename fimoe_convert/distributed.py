"""The ranks of a torchrun launch (WORLD_SIZE > 1), or a single process. Ranks exchange only small objects
(shard records) through gloo; each converts its own shards on its own device."""

from __future__ import annotations

import os

from .errors import InputError

LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT")  # what init_process_group's env:// rendezvous needs besides the ranks


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{name}={value!r}: expected an integer (torchrun sets it); launch with torchrun or unset "
                         f"{name}") from None


class Group:
    def __init__(self):
        self.world = _env_int("WORLD_SIZE", 1)
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", self.rank)
        self.dist = None
        if self.world > 1:
            import torch.distributed as dist

            self.owned = not dist.is_initialized()
            if self.owned:
                missing = [v for v in LAUNCH_VARS if not os.environ.get(v)]
                if missing or not 0 <= self.rank < self.world:
                    why = (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set" if missing else
                           f"RANK {self.rank} is not in 0..{self.world - 1}")
                    raise InputError(f"WORLD_SIZE={self.world} asks for a distributed run, but {why}; launch with "
                                     "torchrun (it sets them), or unset WORLD_SIZE for one process")
                try:
                    dist.init_process_group("gloo")
                except (RuntimeError, ValueError) as e:  # DistNetworkError, a bad MASTER_PORT, a timeout
                    raise InputError(f"torchrun rendezvous at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                                     f"failed ({e.__class__.__name__}: {' '.join(str(e).split())[:200]}); check that "
                                     "every rank was launched by the same torchrun") from None
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

    def per_node(self, fn):
        """`fn()` on one process per node first (a Hub download happens once per node), then on the others,
        which find it in the shared cache. Returns (result, None) or (None, the ValidationError raised)."""
        from .errors import ValidationError

        result, error = None, None
        turns = (True, False) if self.world > 1 else (None,)
        for turn in turns:
            if turn is None or turn == (self.local_rank == 0):
                try:
                    result = fn()
                except ValidationError as e:
                    error = e
            if turn is True:
                self.barrier()
        return result, error
