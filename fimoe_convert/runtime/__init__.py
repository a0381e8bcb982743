"""The runtime shim: load a fimoe-convert output into FlashInfer with no load-time transform.

Imports `manifest`, `numerics` and flashinfer only (lazily); never click or huggingface_hub."""

from .loader import (
    Manifest,
    load_manifest,
    load_megamoe_weights,
    load_transformed_weights,
)

__all__ = ["Manifest", "load_manifest", "load_megamoe_weights", "load_transformed_weights"]
