"""The DeepSeek V4 model spec: config dialects, tensor classes and expected expert shapes."""

from .spec import (
    FP4_GROUP,
    EXPERT_LEGS,
    ExpertKey,
    ModelSpec,
    block_sort_key,
    expected_expert_tensors,
    leg_shape,
    model_spec_from_config,
    parse_expert_name,
    natural_key,
)

__all__ = [
    "FP4_GROUP",
    "EXPERT_LEGS",
    "ExpertKey",
    "ModelSpec",
    "block_sort_key",
    "expected_expert_tensors",
    "leg_shape",
    "model_spec_from_config",
    "parse_expert_name",
    "natural_key",
]
