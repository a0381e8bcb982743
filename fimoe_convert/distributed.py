"""The ranks of a torchrun launch (WORLD_SIZE > 1), or a single process. Ranks exchange only small objects
(shard records) through gloo; each converts its own shards on its own device."""

from __future__ import annotations

import os
import threading
import time

from .errors import InputError

LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT")  # what init_process_group's env:// rendezvous needs besides the ranks
RENDEZVOUS_TIMEOUT_S = 600.0  # seconds a rank waits for the others to join (torchrun starts them together)
POLL_S = 0.1  # seconds between the main thread's looks at the rendezvous (how soon a signal is taken)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{name}={value!r}: expected an integer (torchrun sets it); launch with torchrun or unset "
                         f"{name}") from None


def _rendezvous(dist, rank: int, world: int) -> None:
    """`init_process_group` in a daemon thread: its C++ wait would hold the main thread, which then takes no
    signal (SIGTERM, Ctrl-C) until the peers come. The collectives keep torch's own timeout."""
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    done: list[BaseException | None] = []

    def join() -> None:
        try:
            dist.init_process_group("gloo")
            done.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which names it
            done.append(e)

    waiter = threading.Thread(target=join, name="fimoe-rendezvous", daemon=True)
    waiter.start()
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while waiter.is_alive() and time.monotonic() < deadline:
        waiter.join(POLL_S)
    if not done:
        raise InputError(f"torchrun rendezvous: rank {rank} of WORLD_SIZE={world} waited {RENDEZVOUS_TIMEOUT_S:g} s "
                         f"at {where} for the other {world - 1} rank(s), and not all came; start every rank (one "
                         "torchrun per node, the same --nnodes, --master-addr and --master-port), or unset WORLD_SIZE "
                         "for one process")
    e = done[0]
    if isinstance(e, (RuntimeError, ValueError)):  # DistNetworkError, a bad MASTER_PORT, torch's own timeout
        raise InputError(f"torchrun rendezvous at {where} failed ({e.__class__.__name__}: "
                         f"{' '.join(str(e).split())[:200]}); check that every rank was launched by the same "
                         "torchrun") from None
    if e is not None:
        raise e


def world_size() -> int:
    """The processes a torchrun launch starts (WORLD_SIZE), 1 without one."""
    return _env_int("WORLD_SIZE", 1)


class Group:
    def __init__(self):
        self.world = world_size()
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
                _rendezvous(dist, self.rank, self.world)
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
