"""The converters, one per family of the kernel table (`kernels.py`): `bf16`, `fp8_block`, `megamoe` and
`moe_ep` (every flashinfer.moe_ep megakernel, driven by its table row). A converter's module is imported
when a conversion needs it, so listing and validating targets needs neither torch nor FlashInfer."""

from __future__ import annotations

import importlib

from ..checkpoint import ModelSpec
from ..kernels import KERNELS, Kernel, get_kernel
from .families import family
from .rules import TargetOptions, availability, target_record, validate

_CONVERTERS = {"bf16": "bf16:Bf16Target", "fp8_block": "fp8_block:Fp8BlockTarget",
             "megamoe": "megamoe:MegaMoeTarget", "moe_ep": "moe_ep:MoeEpTarget"}


def make_target(kernel: Kernel, model: ModelSpec, target_options: TargetOptions):
    """The converter for `kernel` (a row of the table: `get_kernel(name)`), made for `model` and the options."""
    module, cls = _CONVERTERS[kernel.family].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(kernel, model, target_options)


__all__ = ["KERNELS", "Kernel", "TargetOptions", "availability", "family", "get_kernel", "make_target", "target_record",
           "validate"]
