"""What a DeepSeek V4 checkpoint is (pure): config dialects, tensor names, expected expert shapes, variants."""

from .spec import (
    EXPERT_LEGS,
    ExpertKey,
    ModelSpec,
    check_counts,
    expected_expert_tensors,
    expert_name,
    fp8_linears,
    leg_shape,
    model_spec_from_config,
    natural_key,
    parse_expert_name,
)
from .variants import VARIANTS, Variant, check_preset_model, variant_name

__all__ = [
    "EXPERT_LEGS",
    "ExpertKey",
    "expert_name",
    "ModelSpec",
    "VARIANTS",
    "check_counts",
    "Variant",
    "expected_expert_tensors",
    "fp8_linears",
    "leg_shape",
    "model_spec_from_config",
    "natural_key",
    "parse_expert_name",
    "check_preset_model",
    "variant_name",
]
