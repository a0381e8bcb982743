"""The published DeepSeek V4 variants as data: their geometry (from each repo's config.json), and which one a
checkpoint is. Used by `inspect`, the conversion presets in configs/ and the fixtures of `testing`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .spec import ModelSpec


@dataclass(frozen=True)
class Variant:
    name: str
    repo_id: str
    hidden_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_hidden_layers: int
    num_nextn_predict_layers: int
    num_experts_per_tok: int | None  # None: not stated in the sources read
    source_bytes: int | None  # the release's safetensors bytes, as published (None: not read)


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("V4-Flash", "deepseek-ai/DeepSeek-V4-Flash", 4096, 2048, 256, 43, 1, 6, 159_600_000_000),
    Variant("V4-Pro", "deepseek-ai/DeepSeek-V4-Pro", 7168, 3072, 384, 61, 1, None, 865_000_000_000),
    Variant("V4.1-Flash", "deepseek-ai/DeepSeek-V4.1-Flash", 5120, 2304, 384, 40, 0, None, None),
)}


def variant_name(spec: ModelSpec, config: dict | None = None) -> str:
    """Which DeepSeek V4 checkpoint this is, for `inspect`: "V4.1", "V4 Base (FP8 experts)",
    "V4 0731/DSpark (3 MTP blocks)", "V4-Pro" or "V4-Flash" (first match; any other FP4 V4 geometry
    is called V4-Flash, the reference layout)."""
    config = config or {}
    pro = VARIANTS["V4-Pro"]
    is_pro = (spec.hidden_size, spec.moe_intermediate_size) == (pro.hidden_size, pro.moe_intermediate_size)
    if spec.dialect == "v4.1":
        return "V4.1"
    if spec.expert_dtype == "fp8":
        return "V4 Base (FP8 experts)" + (" (V4-Pro geometry)" if is_pro else "")
    n_mtp = spec.num_nextn_predict_layers
    if n_mtp > 1 or "dspark_target_layer_ids" in config:
        return f"V4 0731/DSpark ({n_mtp} MTP block{'s' if n_mtp != 1 else ''})"
    return "V4-Pro" if is_pro else "V4-Flash"


def check_preset_model(model: str | None, preset: str | None, spec: ModelSpec, config: dict, where) -> None:
    """A preset (`preset`, made for the variant `model`) for another DeepSeek V4 variant than the checkpoint at
    `where` is refused: its flags (EP size, target) fit that one."""
    found = variant_name(spec, config)
    if model is not None and model != found:
        raise InputError(f"--config {preset}: made for model {model}, but SRC {where} is a {found} checkpoint "
                         f"(hidden {spec.hidden_size}, {spec.n_routed_experts} experts); pick a preset "
                         f"for {found} (fimoe-convert targets lists them) or give the flags without --config")
