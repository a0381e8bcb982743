"""The converters, one per family of the kernel table (`kernels.py`): `bf16`, `fp8_block`, `megamoe` and
`moe_ep` (every flashinfer.moe_ep megakernel, driven by its table row). A converter's module is imported
when a conversion needs it, so listing and validating targets needs neither torch nor FlashInfer."""

from __future__ import annotations

import importlib

from ..checkpoint import ModelSpec
from ..kernels import KERNELS, Kernel, get_kernel
from .rules import TargetOptions, availability, target_record, validate

_FAMILIES = {"bf16": "bf16:Bf16Target", "fp8_block": "fp8_block:Fp8BlockTarget",
             "megamoe": "megamoe:MegaMoeTarget", "moe_ep": "moe_ep:MoeEpTarget"}


def make_target(kernel: Kernel | str, model: ModelSpec, opts: TargetOptions):
    """The converter for `kernel` (a row of the table, or a name or alias), made for `model` and `opts`."""
    if isinstance(kernel, str):
        kernel = get_kernel(kernel)
    module, cls = _FAMILIES[kernel.family].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(kernel, model, opts)


__all__ = ["KERNELS", "Kernel", "TargetOptions", "availability", "get_kernel", "make_target", "target_record", "validate"]
