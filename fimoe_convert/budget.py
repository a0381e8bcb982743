"""The one memory budget of a conversion, from --max-memory: how big a unit of work is, whether the largest unit
fits, and how many writer lanes run with how many bytes each. Every byte constant of that budget is here."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ValidationError
from .sizes import human

UNIT_BYTES_MAX = 64 << 20  # output bytes per unit, for targets that split their work (fewer with a small budget)
UNIT_SHARE = 32  # a unit's output takes at most 1/32 of --max-memory
UNIT_FACTOR = 2  # a unit holds its output and its inputs: about twice its output bytes
LANES_SHARE = 4  # the lanes' read-ahead and their write buffers each take at most a quarter of --max-memory
STREAM_SHARE = 4  # --stream holds at least a quarter of --max-memory of source bytes that arrived early
PROCESS_BYTES = 1 << 30  # the conversion's own beside its lanes: Python, torch, the plan, allocator caches
IO_BLOCK = 16 << 20  # bytes per read/write call when streaming large tensors, and per staging block
STAGE_BLOCKS = 3  # staging blocks of IO_BLOCK bytes per shard writer: one filling, two writing/hashing
SHARDS_PER_LANE = 2  # shards a lane writes at once, a sha256 each: a whole-block unit's outputs span two shards
READ_AHEAD_MAX = 128 << 20  # bytes a lane reads or converts ahead of its writer, unless two units need more
MAX_LANES = 4  # one sha256 per lane; more lanes than this gained nothing on the machines measured
CORES_PER_LANE = 4  # a lane keeps a reader, a converter, a writer and a hasher busy
DEVICE_SHARE = 2  # a CUDA conversion's outputs wait on the device when the budget is at most 1/2 of its memory


@dataclass(frozen=True)
class MemoryBudget:
    """`total` bytes of host memory a conversion may hold; `flag`: --max-memory as given, for messages."""

    total: int
    flag: str = ""

    @property
    def unit_bytes(self) -> int:
        """Output bytes per unit for targets that split their work (any value gives the same output)."""
        return min(UNIT_BYTES_MAX, self.total // UNIT_SHARE)

    def stream_bytes(self, lanes: int = 0, lane_bytes: int = 0, biggest_unit: int = 0) -> int:
        """Bytes --stream may hold of source bytes that arrive before the lanes read them: what the budget leaves
        beside `lanes` lanes of `lane_bytes` (their write buffers, and the unit each converts, `biggest_unit` output
        bytes at most) and the process's own (PROCESS_BYTES); at least a quarter of it (before the plan: that)."""
        own = lanes * (lane_bytes + SHARDS_PER_LANE * STAGE_BLOCKS * IO_BLOCK + UNIT_FACTOR * biggest_unit)
        return max(self.total // STREAM_SHARE, self.total - own - PROCESS_BYTES if lanes else 0)

    def stream_need(self, hold: int, lanes: int, lane_bytes: int, biggest_unit: int) -> int:
        """The --max-memory whose stream_bytes(lanes, lane_bytes, biggest_unit) is at least `hold`."""
        own = lanes * (lane_bytes + SHARDS_PER_LANE * STAGE_BLOCKS * IO_BLOCK + UNIT_FACTOR * biggest_unit)
        return min(hold + own + PROCESS_BYTES, hold * STREAM_SHARE)

    def fits_device(self, device_bytes: int) -> bool:
        """Whether the outputs in flight (at most the budget) may wait on a device of `device_bytes` to be written,
        leaving the rest to the unit being converted: no pinned host copy of them, and a copy fewer."""
        return self.total * DEVICE_SHARE <= device_bytes

    def check_unit(self, key: str, out_bytes: int, ep_size: int, experts: int, by_rank: bool) -> None:
        """Refuse (naming the memory and, for a target whose units shrink with --ep-size (`by_rank`), the --ep-size
        that would fit) a largest unit `key` of `out_bytes` output bytes that does not fit."""
        need = UNIT_FACTOR * out_bytes
        if need <= self.total:
            return
        fits = next((d for d in range(ep_size + 1, experts + 1)
                     if experts % d == 0 and need * ep_size / d <= self.total), None)
        hint = f", or use --ep-size {fits} (about {human(need * ep_size / fits)} a unit)" if fits and by_rank else ""
        raise ValidationError([f"--max-memory {self.flag}: one unit of work ({key}) needs about {human(need)} "
                               f"(its output and its inputs); raise --max-memory to at least {human(need)}{hint}"])

    def lane_bytes(self, biggest_unit: int) -> int:
        """Bytes one lane holds between reading and writing: two units (inputs and outputs) or READ_AHEAD_MAX,
        so that reading, converting and writing overlap, within a quarter of the budget (the rest: write buffers,
        the unit being converted, pinned and allocator caches), or half where two units fit there (a whole-block
        unit of GBs: one unit at a time would serialize read, convert and write)."""
        two_units = 2 * UNIT_FACTOR * biggest_unit
        cap = max(self.total // LANES_SHARE, two_units if two_units <= self.total // 2 else 0)
        return max(min(cap, max(READ_AHEAD_MAX, two_units)), IO_BLOCK)

    def lane_count(self, writers: int | None, shards: int, lane_bytes: int) -> int:
        """Shards written at once. Each lane hashes its own shard, and one sha256 runs at 1.2 to 1.8 GB/s on the
        machines measured, below a fast disk; auto: a lane per CORES_PER_LANE cores, at most MAX_LANES, as many as
        fit their bytes and write buffers into a quarter of the budget."""
        if writers is None:
            fits = self.total // LANES_SHARE // (lane_bytes + SHARDS_PER_LANE * STAGE_BLOCKS * IO_BLOCK)
            writers = min(MAX_LANES, max(1, (os.cpu_count() or 1) // CORES_PER_LANE), max(1, fits))
        return max(1, min(writers, shards))
