"""What a target asks of the model and the options, read from the kernel table (pure: no torch, no FlashInfer,
so `inspect` and `targets` can judge every target quickly). Each problem names its flag."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass, field

from .. import versions
from ..checkpoint import ModelSpec
from ..kernels import INSTALL, Kernel
from ..records import TargetRecord
from .families import family


@dataclass(frozen=True)
class TargetOptions:
    ep_size: int = 1
    arch: tuple[int, int] | None = None  # compute capability checked against the kernel's capabilities
    device: str | None = "cpu"  # None: not judged (inspect, which knows no conversion device)
    allow_lossy: bool = False
    params: dict = field(default_factory=dict)
    # Output bytes per unit that a target able to split its work aims for (from --max-memory); any value
    # gives the same output, so it is not recorded.
    unit_bytes: int | None = None
    # A CUDA conversion's outputs stay on the device until written (budget.MemoryBudget.fits_device); not recorded
    device_outputs: bool = False

    @property
    def arch_name(self) -> str | None:
        """--arch as the manifest records it ("9.0"), or None."""
        return None if self.arch is None else f"{self.arch[0]}.{self.arch[1]}"


def target_record(kernel: Kernel, opts: TargetOptions) -> TargetRecord:
    """The manifest's `target`: the kernel's facts the runtime and the model card need, and the --param values."""
    return TargetRecord(name=kernel.name, kernel_name=kernel.kernel_name, vllm_moe_backend=kernel.vllm_moe_backend,
                        capabilities=tuple(kernel.capabilities), weight_format=kernel.weight_format,
                        activation_format=kernel.activation_format, needs_nvshmem=kernel.needs_nvshmem,
                        runtime_module=kernel.runtime_module, parameters=dict(sorted(opts.params.items())))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate(kernel: Kernel, model: ModelSpec, opts: TargetOptions) -> list[str]:
    """Every problem with converting `model` for `kernel` with `opts`."""
    problems = []
    e = model.n_routed_experts
    if opts.ep_size < 1 or e % opts.ep_size:
        problems.append(f"--ep-size {opts.ep_size}: must divide the {e} routed experts "
                        f"(n_routed_experts in config.json); try one of {divisors(e)[:8]}")
    if kernel.consumes == "fp4" and model.expert_dtype != "fp4":
        problems.append(f"--target {kernel.name}: consumes FP4 experts, but this checkpoint's experts are "
                        f"{model.expert_dtype.upper()} (expert_dtype {model.expert_dtype!r}); use --target bf16")
    problems += check_arch(kernel, opts.arch)
    if kernel.preprocess_needs_cuda and opts.device not in ("cuda", None):
        problems.append(f"--device {opts.device}: --target {kernel.name} preprocesses on a CUDA device only "
                        "(FlashInfer's function needs CUDA tensors); run on a GPU machine with --device cuda")
    if kernel.preprocess_capabilities and opts.device == "cuda":
        cap = device_capability()
        if cap not in kernel.preprocess_capabilities:
            problems.append(f"--target {kernel.name}: its preprocessing runs only on a GPU of compute capability "
                            f"{' or '.join(kernel.preprocess_capabilities)}, this one is {cap}; convert on such a GPU")
    missing = [m for m in kernel.needs_packages if not present(m)]
    fi_install = f"pip install 'flashinfer-python>={versions.show(versions.MIN_FLASHINFER)}'"
    for mod in missing:  # an environment problem (exit 1), not a usage one: the line does not start with the flag
        problems.append(f"Python package {mod!r} (needed by --target {kernel.name}): not installed here; "
                        f"{fi_install if mod == 'flashinfer' else INSTALL.get(mod, f'pip install {mod}')}")
    if kernel.runtime_module and "flashinfer" not in missing:
        v = versions.flashinfer()
        if v is None or v < versions.MIN_FLASHINFER:
            need = versions.show(versions.MIN_FLASHINFER)
            problems.append(f"Python package flashinfer-python (for --target {kernel.name}): needs >= {need}, found "
                            f"{'none' if v is None else versions.show(v)}; pip install 'flashinfer-python>={need}'")
    for key, mult in zip(("hidden_size", "moe_intermediate_size"), kernel.align):
        val = getattr(model, key)
        if val % mult:
            problems.append(f"--target {kernel.name}: {key} {val} must be a multiple of {mult} for this kernel; "
                            "use --target bf16 or another kernel (fimoe-convert targets)")
    n = opts.ep_size
    if kernel.max_ep_size and (n > kernel.max_ep_size or n & (n - 1)):
        problems.append(f"--ep-size {n}: {kernel.name} runs on a power-of-two number of ranks up to "
                        f"{kernel.max_ep_size}")
    return problems + family(kernel).validate(kernel, model) + check_params(kernel, opts.params)


def check_arch(kernel: Kernel, arch: tuple[int, int] | None) -> list[str]:
    """--arch against the compute capabilities the kernel runs on."""
    if arch is None or not kernel.capabilities:
        return []
    name = f"{arch[0]}.{arch[1]}"
    if name in kernel.capabilities:
        return []
    return [f"--arch {name}: --target {kernel.name} runs on compute capability {' or '.join(kernel.capabilities)}; "
            f"pick a target for {name} (fimoe-convert targets)"]


def check_params(kernel: Kernel, params: dict) -> list[str]:
    """Unknown --param keys and values outside the allowed ones, naming what the target takes."""
    problems = []
    takes = ", ".join(f"{k} ({'|'.join(v)})" for k, v in kernel.params.items()) or "no parameters"
    for key, value in params.items():
        if key not in kernel.params:
            problems.append(f"--param {key}={value}: {kernel.name} takes {takes}")
        elif value not in kernel.params[key]:
            problems.append(f"--param {key}={value}: expected one of {', '.join(kernel.params[key])}")
    return problems


def availability(kernel: Kernel) -> tuple[bool, str]:
    """Can this machine run the conversion now, and if not, why."""
    for mod in kernel.needs_packages:
        if not present(mod):
            return False, f"needs the {mod!r} package (not installed)"
    if kernel.preprocess_needs_cuda and not cuda_visible():
        return False, "preprocessing needs a CUDA device (none here)"
    if kernel.preprocess_capabilities and cuda_visible():
        cap = device_capability()
        if cap not in kernel.preprocess_capabilities:
            return False, (f"preprocessing needs compute capability {' or '.join(kernel.preprocess_capabilities)} "
                           f"(this GPU is {cap})")
    return True, "yes"


@functools.cache
def present(module: str) -> bool:
    """Whether `module` can be imported (not imported; one look-up per process)."""
    return importlib.util.find_spec(module) is not None


def device_capability() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def cuda_device_node() -> bool:
    """Whether a GPU device node exists (NVIDIA's, or WSL's); without one torch sees no CUDA device."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/dxg"))


def cuda_visible() -> bool:
    """Whether torch sees a CUDA device; without importing torch (seconds) where no GPU device node exists."""
    if "torch" not in sys.modules and not cuda_device_node():
        return False
    import torch

    return torch.cuda.is_available()
