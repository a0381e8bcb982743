"""The ranks of a torchrun launch (WORLD_SIZE > 1), or a single process. Ranks exchange only small objects
(shard records) through gloo; each converts its own shards on its own device."""

from __future__ import annotations

import os


class Group:
    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.dist = None
        if self.world > 1:
            import torch.distributed as dist

            self.owned = not dist.is_initialized()
            if self.owned:
                dist.init_process_group("gloo")
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
