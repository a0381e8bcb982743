"""What every target declares and does. Targets are pure: they plan units from the model spec and
turn a unit's source tensors into output tensors; the converter does all reading and writing."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Iterable

import torch

from ..checkpoint import ModelSpec
from ..errors import CorruptTensorError
from ..numerics import find_nan_scales
from ..plan import Unit, ep_ranges


@dataclass(frozen=True)
class TargetInfo:
    name: str  # FlashInfer's kernel_name where one exists
    description: str
    kernel_name: str | None = None
    aliases: tuple[str, ...] = ()
    vllm_moe_backend: str | None = None
    capabilities: tuple[str, ...] = ()  # compute capabilities the kernel runs on ("9.0"); () = any
    weight_format: str = ""  # what goes into the kernel's weights
    activation_format: str = ""
    consumes: str = "fp4"  # source expert format the conversion needs: "fp4" | "any"
    needs_nvshmem: bool = False
    preprocess_needs_cuda: bool = False
    needs_packages: tuple[str, ...] = ()  # importable modules the conversion needs
    runtime_module: str | None = None  # flashinfer module that runs the output


@dataclass(frozen=True)
class TargetOptions:
    ep_size: int = 1
    arch: tuple[int, int] | None = None  # compute capability checked against `capabilities`
    device: str = "cpu"
    allow_lossy: bool = False
    params: dict = field(default_factory=dict)
    # Output bytes per unit that a target able to split its work aims for (from --max-memory); any value
    # gives the same output, so it is not recorded.
    unit_bytes: int | None = None

    def to_json(self) -> dict:
        return {"ep_size": self.ep_size, "arch": None if self.arch is None else f"{self.arch[0]}.{self.arch[1]}",
                "allow_lossy": self.allow_lossy, "params": dict(sorted(self.params.items()))}


class Target(ABC):
    info: TargetInfo

    def validate(self, model: ModelSpec, opts: TargetOptions) -> list[str]:
        """Every problem with this model and these options, each naming its flag."""
        problems = []
        e = model.n_routed_experts
        if opts.ep_size < 1 or e % opts.ep_size:
            problems.append(f"--ep-size {opts.ep_size}: must divide the {e} routed experts "
                            f"(n_routed_experts in config.json); try one of {divisors(e)[:8]}")
        if self.info.consumes == "fp4" and model.expert_dtype != "fp4":
            problems.append(f"--target {self.info.name}: consumes FP4 experts, but this checkpoint's experts are "
                            f"{model.expert_dtype.upper()} (expert_dtype {model.expert_dtype!r}); use --target bf16")
        if opts.arch is not None and self.info.capabilities:
            arch = f"{opts.arch[0]}.{opts.arch[1]}"
            if arch not in self.info.capabilities:
                problems.append(f"--arch {arch}: --target {self.info.name} runs on compute capability "
                                f"{' or '.join(self.info.capabilities)}; pick a target for {arch} (fimoe-convert targets)")
        if self.info.preprocess_needs_cuda and opts.device != "cuda":
            problems.append(f"--device {opts.device}: --target {self.info.name} preprocesses on a CUDA device only "
                            "(FlashInfer's function needs CUDA tensors); run on a GPU machine with --device cuda")
        return problems + self.check(model, opts)

    def check(self, model: ModelSpec, opts: TargetOptions) -> list[str]:
        """Target-specific checks (geometry multiples, EP limits, ...)."""
        return []

    @abstractmethod
    def units(self, model: ModelSpec, opts: TargetOptions) -> list[Unit]:
        """The work units and their output tensors, in order (pure)."""

    @abstractmethod
    def run(self, unit: Unit, inputs: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
        """Turn one unit's source tensors (typed CPU tensors, by name) into its outputs (CPU, by name)."""

    def recycle(self, tensor: torch.Tensor) -> None:
        """The converter is done with `tensor`, an output of `run`: a target may reuse its memory."""

    def report(self, units: Iterable[str] | None = None) -> dict:
        """What converting `units` (keys; None: every unit run so far) found worth reporting ({}: nothing).
        The converter stores it per shard, so that a resumed conversion reports what an uninterrupted one does."""
        return {}

    def merge_reports(self, parts: list[dict]) -> dict:
        """One report from `report`s of disjoint sets of units, given in output order."""
        return {}

    def layers_record(self, model: ModelSpec, opts: TargetOptions, units: list[Unit]) -> dict:
        """The manifest's `layers`: what the runtime needs to rebuild each block's objects."""
        return {}

    def update_config(self, config: dict, model: ModelSpec, opts: TargetOptions) -> dict:
        """config.json for the output."""
        return config

    def availability(self) -> tuple[bool, str]:
        """Can this machine run the conversion now, and if not, why."""
        import importlib.util

        for mod in self.info.needs_packages:
            if importlib.util.find_spec(mod) is None:
                return False, f"needs the {mod!r} package (not installed)"
        if self.info.preprocess_needs_cuda and not torch.cuda.is_available():
            return False, "preprocessing needs a CUDA device (none here)"
        return True, "yes"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def rank_ranges(model: ModelSpec, opts: TargetOptions) -> list[tuple[int, int]]:
    return ep_ranges(model.n_routed_experts, opts.ep_size)


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
    (scripts/bench_decode.py). Keeps at most `keep` idle tensors of each shape."""

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
