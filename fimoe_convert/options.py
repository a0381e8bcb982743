"""A conversion's flags, parsed and checked before SRC is opened (each error names its flag), and convert()'s
keywords as the one record it hands down (`Request`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .budget import MemoryBudget
from .distributed import world_size
from .errors import UsageError, ValidationError
from .kernels import Kernel, get_kernel
from .records import Options
from .sizes import parse_size
from .targets import TargetOptions
from .targets.rules import check_arch, check_params, cuda_device_node

DEFAULT_SHARD_SIZE = "5GB"
DEFAULT_MAX_MEMORY = "8GiB"
# --param keys and values: what the kernel table uses; anything else (a newline, a quote) would reach the
# manifest, the model card and messages
PARAM_TEXT = re.compile(r"[A-Za-z0-9_.-]+")


NO_CUDA = "--device cuda: no CUDA device is visible to torch here; use --device cpu or auto"


def check_device(device: str) -> None:
    """--device without torch: its name, and for cuda a GPU device node (no node: torch sees no GPU either)."""
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device {device}: expected auto, cpu or cuda")
    if device == "cuda" and not cuda_device_node():
        raise UsageError(NO_CUDA)


def resolve_device(device: str) -> str:
    check_device(device)
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise UsageError(NO_CUDA)
    return device


def parse_arch(arch: str | None) -> tuple[int, int] | None:
    if arch is None:
        return None
    if not re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", arch):  # int() would take "-1", " 9", "1_0"
        raise UsageError(f"--arch {arch}: expected a compute capability like 9.0 or 10.0") from None
    major, minor = (int(p) for p in arch.split("."))
    return major, minor


@dataclass(frozen=True)
class Flags:
    """The flags that need neither torch nor SRC, parsed and checked."""
    kernel: Kernel
    shard_bytes: int
    memory: MemoryBudget
    arch: tuple[int, int] | None  # the compute capability --arch names, or None
    ep_size: int
    params: dict
    writers: int | None
    engine: str | None = None  # --engine: the engine the output must load in (serving.ENGINES key)


def check_flags(target: str | None, *, ep_size: int, arch: str | None, max_memory: str | int, shard_size: str | int,
                params: dict | None, resume: bool, overwrite: bool, writers: int | None, device: str = "auto",
                engine: str | None = None) -> Flags:
    """The flags that need neither torch nor SRC: checked before either is touched, so that a mistyped flag is
    reported in a fraction of a second. `target` None: --engine's default conversion, else bf16."""
    if resume and overwrite:
        raise UsageError("--resume and --overwrite: pass one of them, not both")
    if writers is not None and writers < 1:
        raise UsageError(f"--writers {writers}: expected 1 or more shards written at once (or leave it out: auto)")
    if type(ep_size) is not int or ep_size < 1:
        raise UsageError(f"--ep-size {ep_size}: must be 1 or more (the number of expert-parallel ranks)")
    for key, value in (params or {}).items():
        if not all(isinstance(t, str) and PARAM_TEXT.fullmatch(t) for t in (key, value)):
            raise UsageError(f"--param {key!r}={value!r}: keys and values are letters, digits, '_', '.' and '-'; "
                             "fimoe-convert targets lists each target's parameters")
    shard_bytes = parse_size(shard_size, "--shard-size")
    memory = MemoryBudget(parse_size(max_memory, "--max-memory"), str(max_memory))
    cap = parse_arch(arch)
    if engine is not None:
        from .serving import parse_engine

        engine = parse_engine(engine)
    kernel, params = _engine_target(target, engine, arch, dict(params or {}))
    problems = check_params(kernel, params) + check_arch(kernel, cap)
    if problems:
        raise ValidationError(problems)
    check_device(device)
    return Flags(kernel, shard_bytes, memory, cap, ep_size, params, writers, engine)


def _engine_target(target: str | None, engine: str | None, arch: str | None, params: dict) -> tuple[Kernel, dict]:
    """(the target, its --param values): --target's, or without it --engine's default conversion (serving.py);
    with --engine, one that engine loads (else a UsageError naming the flags and the fix)."""
    if engine is None:
        return get_kernel(target or "bf16"), params
    from .serving import check_engine, engine_option

    if target is None:
        option = engine_option(engine, arch)
        target, params = option.target, {**option.params, **params}
    kernel = get_kernel(target)
    if not check_params(kernel, params):  # a bad --param value: that error (check_flags), not the engine's
        check_engine(engine, kernel, params)
    return kernel, params


@dataclass(frozen=True)
class Request:
    """What convert() was asked to do: its keywords, the flags among them parsed and checked (`flags`)."""

    src: str
    out: Path
    flags: Flags
    device: str = "auto"
    allow_lossy: bool = False
    revision: str | None = None
    resume: bool = False
    overwrite: bool = False
    dry_run: bool = False
    offline: bool = False
    stream: bool = False
    upload_repo: str | None = None
    model: str | None = None  # the DeepSeek V4 variant the preset `config` is made for
    config: str | None = None
    command: str | None = None  # the command line the model card shows
    progress: Callable[[int, int], None] | None = None
    check_progress: Callable[[int, int], None] | None = None
    notice: Callable[[str], None] | None = None
    connections: int | None = None  # --stream's ranged GETs at once (None: stream.CONNECTIONS)

    def __post_init__(self):
        """--stream, --connections and --upload-repo, before SRC is opened: usage errors naming the flag."""
        if self.connections is not None and not self.stream:
            raise UsageError(f"--connections {self.connections}: it sets --stream's ranged GETs at once; add --stream "
                             "or drop --connections")
        if self.stream:
            from .files.sources.stream import CONNECTIONS, check_stream_flags  # the Hub's modules: only for --stream

            if self.connections is None:
                object.__setattr__(self, "connections", CONNECTIONS)
            elif self.connections < 1:
                raise UsageError(f"--connections {self.connections}: expected at least 1 (default {CONNECTIONS})")
            check_stream_flags(self.src, self.offline, self.revision)
            if (world := world_size()) > 1:
                raise UsageError(f"--stream: WORLD_SIZE={world}; a streamed conversion runs in one process: "
                                 "drop --stream, or run without torchrun")
        if self.upload_repo:
            from .publish import check_access, check_repo_id

            check_repo_id(self.upload_repo, "--upload-repo")
            check_access(self.upload_repo, flag="--upload-repo")  # token, rights, network: before any tensor


@dataclass(frozen=True)
class ConvertOptions:
    kernel: Kernel
    target: TargetOptions
    shard_bytes: int
    memory: MemoryBudget
    writers: int | None

    @classmethod
    def parse(cls, flags: Flags, *, device: str, allow_lossy: bool) -> "ConvertOptions":
        """`flags` with the device (torch's view of the GPU) and what the target is given."""
        cap, memory = flags.arch, flags.memory
        dev = resolve_device(device)
        on_device = False
        if dev == "cuda":
            import torch

            cap = cap or torch.cuda.get_device_capability()
            on_device = memory.fits_device(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        opts = TargetOptions(ep_size=flags.ep_size, arch=cap, device=dev, allow_lossy=allow_lossy, params=flags.params,
                             unit_bytes=memory.unit_bytes, device_outputs=on_device)
        return cls(flags.kernel, opts, flags.shard_bytes, memory, flags.writers)

    def record(self) -> Options:
        """The manifest's `options`: what must match for --resume (any unit size gives the same output)."""
        t = self.target
        return Options(target=self.kernel.name, shard_size=self.shard_bytes, ep_size=t.ep_size, arch=t.arch_name,
                       allow_lossy=t.allow_lossy, params=dict(sorted(t.params.items())))
