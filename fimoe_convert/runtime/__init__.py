"""The runtime shim: load a fimoe-convert output into FlashInfer with no load-time transform.

Imports `manifest`, `numerics` and flashinfer only (lazily); never click or huggingface_hub."""

from .loader import (
    Manifest,
    load_manifest,
    load_megamoe_weights,
    load_transformed_weights,
)
from .shim import (
    FI_MOE_EP_BACKENDS,
    EplbNotSupportedError,
    FiMoeEpBackendSpec,
    IncompatibleTargetError,
    backend_spec,
    check_compatible,
    ensure_runtime,
    finalize_runtime,
    kernel_config,
    mega_config,
    runtime_requirements,
    validate_fi_moe_ep_config,
)

__all__ = [
    "EplbNotSupportedError",
    "FI_MOE_EP_BACKENDS",
    "FiMoeEpBackendSpec",
    "IncompatibleTargetError",
    "Manifest",
    "backend_spec",
    "check_compatible",
    "ensure_runtime",
    "finalize_runtime",
    "kernel_config",
    "load_manifest",
    "load_megamoe_weights",
    "load_transformed_weights",
    "mega_config",
    "runtime_requirements",
    "validate_fi_moe_ep_config",
]
