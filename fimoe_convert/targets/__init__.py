"""Target registry: one module per target, registered under FlashInfer's own kernel name.

Modules are imported on first use, and none imports FlashInfer at import time, so `targets`
lists everything even where FlashInfer is absent."""

from __future__ import annotations

import importlib

from ..errors import UsageError
from .base import Target, TargetInfo, TargetOptions

# name -> "module:Class"
_REGISTRY: dict[str, str] = {
    "bf16": "bf16:Bf16Target",
    "megamoe_sm90_mxfp4": "megamoe_sm90_mxfp4:MegaMoeSm90Mxfp4",
    "sm100_mxfp8_mxfp4_bf16_cutedsl": "sm100_mxfp8_mxfp4_bf16_cutedsl:Sm100Mxfp8Mxfp4",
    "sm107_mxfp8_mxfp4_bf16_cutedsl": "sm107_mxfp8_mxfp4_bf16_cutedsl:Sm107Mxfp8Mxfp4",
    "sm107_mxfp4_mxfp4_bf16_cutedsl": "sm107_mxfp4_mxfp4_bf16_cutedsl:Sm107Mxfp4Mxfp4",
    "sm120_mxfp4_mxfp8_bf16_cake": "sm120_mxfp4_mxfp8_bf16_cake:Sm120Mxfp4Mxfp8Cake",
    "sm100_bf16_bf16_bf16_cutedsl": "sm100_bf16_bf16_bf16_cutedsl:Sm100Bf16",
    "sm100_mxfp8_mxfp8_bf16_cutedsl": "sm100_mxfp8_mxfp8_bf16_cutedsl:Sm100Mxfp8Mxfp8",
    "sm90_fp8_fp8_bf16_pull_cutedsl": "sm90_fp8_fp8_bf16_pull_cutedsl:Sm90Fp8Fp8Pull",
    "sm100_nvfp4_nvfp4_bf16_cutedsl": "sm100_nvfp4_nvfp4_bf16_cutedsl:Sm100Nvfp4Nvfp4",
    "sm90_fp8_mxfp4_bf16_pull_cutedsl": "sm90_fp8_mxfp4_bf16_pull_cutedsl:Sm90Fp8Mxfp4Pull",
    "sm100_fp8_fp4_bf16_deepgemm": "sm100_fp8_fp4_bf16_deepgemm:Sm100Fp8Fp4DeepGemm",
    "fp8_block": "fp8_block:Fp8BlockTarget",
}


def target_names() -> list[str]:
    return list(_REGISTRY)


def _load(name: str) -> Target:
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


def all_targets() -> list[Target]:
    return [_load(n) for n in _REGISTRY]


def get_target(name: str) -> Target:
    """A target by its name or an alias (vLLM --moe-backend names, FlashInfer aliases)."""
    if name in _REGISTRY:
        return _load(name)
    for t in all_targets():
        if name in t.info.aliases:
            return t
    known = ", ".join(sorted(_REGISTRY))
    raise UsageError(f"--target {name}: unknown target; known: {known} (aliases: fimoe-convert targets)")


__all__ = ["Target", "TargetInfo", "TargetOptions", "all_targets", "get_target", "target_names"]
