"""What every target does. A target is made for one model and one set of options; it plans units from the
model spec and turns a unit's source tensors into output tensors. Targets are pure: the converter does all
reading and writing."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch

from ..checkpoint import ModelSpec
from ..errors import CorruptTensorError
from ..kernels import Kernel
from ..numerics import find_nan_scales
from ..plan import Unit, ep_ranges
from ..records import Block, EpRecord, TargetRecord, TargetReport
from .rules import TargetOptions, target_record, validate


class Target(ABC):
    """Made before the options are validated: nothing may depend on them until `validate()` found no problem."""

    def __init__(self, kernel: Kernel, model: ModelSpec, opts: TargetOptions):
        self.kernel, self.model, self.opts = kernel, model, opts

    def validate(self) -> list[str]:
        """Every problem with this model and these options, each naming its flag."""
        return validate(self.kernel, self.model, self.opts)

    def param(self, key: str) -> str:
        """The value of --param `key`: as given, else the kernel table's default (its first allowed value)."""
        return self.opts.params.get(key, self.kernel.params[key][0])

    def ranks(self) -> list[tuple[int, int]]:
        """Each EP rank's experts [first, last)."""
        return ep_ranges(self.model.n_routed_experts, self.opts.ep_size)

    @abstractmethod
    def units(self) -> list[Unit]:
        """The work units of the routed experts and their output tensors, in order (pure)."""

    def dense_units(self, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> list[Unit]:
        """Units that rewrite non-expert tensors (`tensors`: name -> (safetensors dtype, shape) of every non-expert
        tensor of the source). A source tensor that is an input of one of them is not copied: the unit's outputs
        replace it (or drop it, when no output has its name). Default: none, all are copied byte for byte."""
        return []

    def all_units(self, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> list[Unit]:
        return self.units() + self.dense_units(tensors)

    @abstractmethod
    def run(self, unit: Unit, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Turn one unit's source tensors (typed CPU tensors, by name) into its outputs (by name, through
        `output`), on the options' device."""

    def output(self, t: torch.Tensor) -> torch.Tensor:
        """An output of `run`: a CUDA result stays on the device where the options allow it (the writer copies it
        straight into its pinned write buffers), else goes to pinned host memory (`to_host`)."""
        return t if self.opts.device_outputs and t.device.type == "cuda" else to_host(t)

    def recycle(self, tensor: torch.Tensor) -> None:  # noqa: B027 - a hook most targets leave as it is
        """The converter is done with `tensor`, an output of `run`: a target may reuse its memory."""

    def report(self, units: Iterable[str] | None = None) -> TargetReport:
        """What converting `units` (keys; None: every unit run so far) found worth reporting ({}: nothing).
        The converter stores it per shard, so that a resumed conversion reports what an uninterrupted one does."""
        return TargetReport()

    def merge_reports(self, parts: list[TargetReport]) -> TargetReport:
        """One report from `report`s of disjoint sets of units, given in output order."""
        return TargetReport()

    def layers_record(self, units: list[Unit]) -> dict[str, Block]:
        """The manifest's `layers`: what the runtime needs to rebuild each block's objects."""
        return {}

    def update_config(self, config: dict) -> dict:
        """config.json for the output."""
        return config

    def record(self) -> TargetRecord:
        """The manifest's `target`."""
        return target_record(self.kernel, self.opts)

    def ep_record(self) -> EpRecord:
        """The manifest's `ep`: the EP size and each rank's experts."""
        return EpRecord(world_size=self.opts.ep_size, expert_ranges=tuple(tuple(r) for r in self.ranks()))


def prefix(block: str, rank: int) -> str:
    """Where a kernel target's tensors of one MoE block and EP rank live: `layers.3.ffn.experts.ep1`."""
    return f"{block}.ffn.experts.ep{rank}"


def kernel_target_config(target: Target, config: dict) -> dict:
    """config.json of a kernel-layout output: the source's, plus where the runtime shim finds the manifest."""
    return {**config, "fimoe_convert": {"target": target.kernel.name, "ep_size": target.opts.ep_size,
                                        "manifest": "fimoe-manifest.json"}}


def check_scales(inputs: dict[str, torch.Tensor]) -> None:
    """Refuse E8M0 scale byte 255 (NaN) in any `.scale` input, naming the tensor; F32 scales pass."""
    for name, t in inputs.items():
        if name.endswith(".scale") and t.dtype != torch.float32:
            nan = find_nan_scales(t)
            if nan:
                raise CorruptTensorError(f"tensor {name!r}: {nan} scale bytes are 255 (NaN in E8M0), expected "
                                         "1..254; the checkpoint is corrupt, download this shard again")


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A CUDA result copied into pinned host memory without waiting (the converter records a CUDA event after
    each unit, and the writer waits on it before using the data); a CPU tensor is returned as it is."""
    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class OutputPool:
    """CPU output tensors handed back by the converter (`Target.recycle`) and reused: filling fresh memory
    costs a page fault per 4 KiB, which made CPU decode into fresh outputs 3x slower than into reused ones
    (scripts/bench/bench_decode.py). Keeps at most `keep` idle tensors of each shape."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._idle: dict[tuple, list[torch.Tensor]] = {}
        self._ours: set[int] = set()  # data pointers of tensors this pool handed out
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        with self._lock:
            idle = self._idle.get((tuple(shape), dtype))
            if idle:
                return idle.pop()
        t = torch.empty(shape, dtype=dtype)
        with self._lock:
            self._ours.add(t.data_ptr())
        return t

    def give(self, t: torch.Tensor) -> None:
        with self._lock:
            if t.data_ptr() not in self._ours:
                return
            idle = self._idle.setdefault((tuple(t.shape), t.dtype), [])
            if len(idle) < self.keep:
                idle.append(t)
            else:
                self._ours.discard(t.data_ptr())
