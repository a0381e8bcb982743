"""The serving-side API over a fimoe-convert output, shaped like the helpers vLLM keeps for its
FlashInfer megakernel backends: a backend spec (megakernel name, NVSHMEM need), compatibility and
config-time checks whose errors say what was found, what is needed and which option fits, one
process-wide FlashInfer moe_ep runtime handle, and a ready `flashinfer.moe_ep.MegaConfig` whose
transformed weights come straight from the output (no load-time preprocessing).

The facts about kernels (capabilities, vLLM backend names, NVSHMEM) come from the kernel table
(`fimoe_convert.kernels`); FlashInfer is imported lazily; never click or huggingface_hub."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import versions
from ..errors import InputError, format_problems
from ..kernels import BY_NAME, suggested, vllm_backends
from ..records import Manifest, TargetRecord
from ..targets.families import Family, config_class, family, kernel_config as build_kernel_config
from .loader import as_manifest, load_transformed_weights

EPLB_FALLBACK = "flashinfer_cutlass"  # a vLLM MoE backend that supports EPLB


@dataclass(frozen=True)
class FiMoeEpBackendSpec:
    megakernel: str  # FlashInfer's kernel_name (registry key)
    needs_nvshmem: bool


FI_MOE_EP_BACKENDS: dict[str, FiMoeEpBackendSpec] = {
    name: FiMoeEpBackendSpec(k.kernel_name, k.needs_nvshmem) for name, k in vllm_backends().items()}


def _vllm_capabilities() -> list[tuple[int, int]]:
    """Compute capabilities vLLM allows its FlashInfer megakernel backends on: those of the kernels they run."""
    return sorted({_parse_cap(c) for k in vllm_backends().values() for c in k.capabilities})


class IncompatibleTargetError(InputError, ValueError):
    """The output (or a serving option) does not fit this device, EP group or FlashInfer; every
    problem is in `problems`, and the message lists them all."""

    def __init__(self, problems: list[str]):
        super().__init__(format_problems(problems), problems)


class EplbNotSupportedError(IncompatibleTargetError, NotImplementedError):
    """EPLB asked of a FlashInfer megakernel backend: a NotImplementedError, as vLLM's own helper raises, so code
    written against vLLM catches it; also an IncompatibleTargetError (a ValueError)."""


# Helpers --------------------------------------------------------------------------------------------

def _cap_str(cap: tuple[int, int]) -> str:
    return f"{cap[0]}.{cap[1]}"


def _parse_cap(s: str) -> tuple[int, int]:
    major, minor = s.split(".")
    return int(major), int(minor)


def installed_flashinfer_version() -> str | None:
    """The installed flashinfer-python version (without importing flashinfer), or None."""
    return versions.installed("flashinfer-python")


def _target_desc(target: TargetRecord) -> str:
    return f"--target {target.name}"


def _family(target: TargetRecord) -> Family:
    try:
        return family(target)
    except KeyError:
        raise IncompatibleTargetError([f"{_target_desc(target)}: not a target this fimoe-convert knows ("
                                       f"{', '.join(BY_NAME)}); load it with the fimoe-convert version that wrote "
                                       "it (fimoe-manifest.json, tool.version)"]) from None


def _suggestion(cap: tuple[int, int]) -> str:
    names = [k.name for k in suggested(_cap_str(cap))]
    if not names:
        return (f"no FlashInfer megakernel target runs on {_cap_str(cap)}; convert with --target bf16 "
                "for the engine's own MoE kernels")
    alt = "".join(f" (or --target {n})" for n in names[1:2])
    return f"for {_cap_str(cap)} convert with --target {names[0]}{alt}; `fimoe-convert targets` lists all"


# Public API -----------------------------------------------------------------------------------------

def backend_spec(manifest: Manifest | dict | str | Path) -> FiMoeEpBackendSpec:
    """The FlashInfer kernel a converted output is for, and whether its runtime needs NVSHMEM."""
    m = as_manifest(manifest)
    t = m.target
    problem = _family(t).megakernel_problem(t)
    if problem:
        raise IncompatibleTargetError([problem])
    return FiMoeEpBackendSpec(megakernel=t.kernel_name, needs_nvshmem=t.needs_nvshmem)


def check_compatible(manifest: Manifest | dict | str | Path, *, capability: tuple[int, int] | None = None,
                     ep_world_size: int | None = None) -> None:
    """Raise IncompatibleTargetError listing every reason the output cannot run here: the compute
    capability (given, else the current CUDA device's, else not checked) is not one the target runs
    on; the EP world size is not the one the output was sharded for; the installed FlashInfer is
    older than the output needs (kernel targets only)."""
    m = as_manifest(manifest)
    t = m.target
    kernel = bool(t.kernel_name)
    problems: list[str] = []

    if capability is None and torch.cuda.is_available():
        capability = tuple(torch.cuda.get_device_capability())
    caps = [_parse_cap(c) for c in t.capabilities]
    if capability is not None and caps and tuple(capability) not in caps:
        cap = (int(capability[0]), int(capability[1]))
        problems.append(f"compute capability {_cap_str(cap)}: this output was converted with {_target_desc(t)}, "
                        f"which runs on {' or '.join(map(_cap_str, caps))}; {_suggestion(cap)}")

    if kernel and ep_world_size is not None and ep_world_size != m.ep_size:
        problems.append(f"EP world size {ep_world_size}: this output was sharded for --ep-size {m.ep_size} "
                        f"(ranks 0..{m.ep_size - 1}); re-convert with --ep-size {ep_world_size}")

    if kernel:
        need = versions.MIN_FLASHINFER
        recorded = m.tool.flashinfer
        if recorded:
            rec = versions.parse(recorded)[:2]
            if len(rec) == 2:
                need = max(need, (*rec, 0))
        have_s = installed_flashinfer_version()
        have = None if have_s is None else versions.parse(have_s)
        if have is None or have < need:
            written = f" (written with flashinfer-python {recorded})" if recorded else ""
            found = "not installed" if have_s is None else f"{have_s} is installed"
            problems.append(f"flashinfer-python {found}: this output{written} needs flashinfer-python >= "
                            f"{versions.show(need)} to load {_target_desc(t)}; "
                            f"pip install 'flashinfer-python>={versions.show(need)}', "
                            "or convert with --target bf16 to serve without FlashInfer")
    if problems:
        raise IncompatibleTargetError(problems)


def validate_fi_moe_ep_config(moe_backend: str, *, capability: tuple[int, int], enable_eplb: bool) -> None:
    """vLLM's config-time checks for its FlashInfer megakernel MoE backends: known backend name,
    compute capability 10.0 or 10.3, no EPLB. Errors name `--moe-backend` as given."""
    if moe_backend not in FI_MOE_EP_BACKENDS:
        raise ValueError(f"--moe-backend {moe_backend}: not a FlashInfer moe_ep megakernel backend; "
                         f"known: {', '.join(sorted(FI_MOE_EP_BACKENDS))}")
    problems: list[str] = []
    cap = (int(capability[0]), int(capability[1]))
    if cap not in _vllm_capabilities():
        allowed = " or ".join(map(_cap_str, _vllm_capabilities()))
        hint = ("; on 9.0, fimoe-convert --target megamoe_sm90_mxfp4 serves through flashinfer.megamoe"
                if cap == (9, 0) else "")
        problems.append(f"--moe-backend {moe_backend}: runs on compute capability {allowed} (B200/GB200, "
                        f"B300/GB300), this device is {_cap_str(cap)}; use a non-megakernel MoE backend, "
                        f"e.g. --moe-backend {EPLB_FALLBACK}{hint}")
    if enable_eplb:
        problems.append(f"--moe-backend {moe_backend}: does not support EPLB (--enable-eplb), because the "
                        "FlashInfer megakernel does not apply the logical-to-physical expert map; turn EPLB off, "
                        f"or use a non-megakernel MoE backend, e.g. --moe-backend {EPLB_FALLBACK}")
    if problems:
        raise (EplbNotSupportedError if enable_eplb else IncompatibleTargetError)(problems)


# The process-wide FlashInfer moe_ep runtime ----------------------------------------------------------

@dataclass
class _RuntimeState:
    handle: object
    requirements: frozenset[str]
    target: str
    world_size: int
    rank: int


_LOCK = threading.Lock()
_STATE: _RuntimeState | None = None


def runtime_requirements(manifest: Manifest | dict | str | Path) -> frozenset[str]:
    """`{"torch_dist"}` or `{"torch_dist", "nvshmem"}` (FlashInfer's own names) for the output's kernel."""
    from flashinfer.moe_ep.core import runtime as rt

    spec = backend_spec(manifest)
    return frozenset({rt.TORCH_DIST, rt.NVSHMEM} if spec.needs_nvshmem else {rt.TORCH_DIST})


def ensure_runtime(bootstrap, manifest: Manifest | dict | str | Path):
    """Bootstrap FlashInfer's moe_ep runtime (torch.distributed, plus NVSHMEM when the kernel needs it)
    once per process with `bootstrap` (a flashinfer.moe_ep.BootstrapConfig) and return its handle;
    later calls with the same requirements and EP group return the same handle. Layers built after
    this can take `BootstrapConfig(..., auto_bootstrap=False)`."""
    global _STATE
    m = as_manifest(manifest)
    check_compatible(m, ep_world_size=bootstrap.world_size)
    reqs = runtime_requirements(m)
    with _LOCK:
        if _STATE is not None:
            if _STATE.requirements != reqs:
                raise RuntimeError(
                    f"ensure_runtime: this process's FlashInfer moe_ep runtime was bootstrapped with "
                    f"{sorted(_STATE.requirements)} for --target {_STATE.target}; --target {m.target.name} "
                    f"needs {sorted(reqs)}; call finalize_runtime() first, or serve one target per process")
            if (_STATE.world_size, _STATE.rank) != (bootstrap.world_size, bootstrap.rank):
                raise RuntimeError(
                    f"ensure_runtime: the runtime was bootstrapped for EP rank {_STATE.rank} of {_STATE.world_size}, "
                    f"not rank {bootstrap.rank} of {bootstrap.world_size}; call finalize_runtime() first")
            return _STATE.handle
        from flashinfer.moe_ep.core import runtime as rt

        handle = rt.bootstrap_moe_ep_runtime(bootstrap, reqs)
        _STATE = _RuntimeState(handle, reqs, m.target.name, bootstrap.world_size, bootstrap.rank)
        return handle


def finalize_runtime() -> None:
    """Release what `ensure_runtime` acquired; a no-op when nothing is held."""
    global _STATE
    with _LOCK:
        state, _STATE = _STATE, None
        if state is None:
            return
        from flashinfer.moe_ep.core import runtime as rt

        rt.finalize_moe_ep_runtime(state.handle)


def runtime_handle():
    """The handle `ensure_runtime` holds, or None."""
    return None if _STATE is None else _STATE.handle


# MegaConfig -----------------------------------------------------------------------------------------

def kernel_config(manifest: Manifest | dict | str | Path, **kernel_options):
    """The kernel's FlashInfer config, built from the manifest: intermediate_size and top_k from the
    model, the target's conversion parameters, then `kernel_options` (other fields of the config)."""
    m = as_manifest(manifest)
    t = m.target
    problem = _family(t).mega_config_problem(t)
    if problem:
        raise IncompatibleTargetError([problem])
    cls = config_class(BY_NAME[t.name])
    if cls is None:
        raise IncompatibleTargetError([
            f"kernel {t.kernel_name!r}: the installed flashinfer.moe_ep ({installed_flashinfer_version()}) has no "
            f"config class {BY_NAME[t.name].config_class}; install the flashinfer-python version the output was "
            "converted with (fimoe-manifest.json, tool.flashinfer)"])
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    sizes = m.model.moe_intermediate_size, m.model.num_experts_per_tok
    geometry = {"intermediate_size": sizes[0], "top_k": sizes[1]}
    problems = []
    for key, value in kernel_options.items():
        if key in geometry and value != geometry[key]:
            problems.append(f"{key}={value!r}: this output was converted for {key} {geometry[key]} (from the "
                            "checkpoint's config.json); leave it out")
        elif key not in fields or key == "kernel_name":
            problems.append(f"{key}={value!r}: not a field of {cls.__name__}; fields: "
                            + ", ".join(sorted(fields - set(geometry) - {"kernel_name"})))
        elif key in t.parameters and value != t.parameters[key]:
            problems.append(f"{key}={value!r}: the weights were converted with --param {key}={t.parameters[key]}; "
                            f"re-convert with --param {key}={value} to change it")
    if problems:
        raise IncompatibleTargetError(problems)
    return build_kernel_config(cls, sizes, t.parameters, kernel_options)


def mega_config(out_dir: str | Path | Manifest, layer: str, rank: int = 0, device: str = "cuda", **kernel_options):
    """`flashinfer.moe_ep.MegaConfig(megakernel=<kernel config>, preprocess_weights=False,
    transformed_weights=<block `layer`, EP rank `rank`, read onto `device`>)`."""
    import flashinfer.moe_ep as me

    m = as_manifest(out_dir)
    cfg = kernel_config(m, **kernel_options)
    weights = load_transformed_weights(m, layer, rank, device)
    return me.MegaConfig(megakernel=cfg, preprocess_weights=False, transformed_weights=weights)
