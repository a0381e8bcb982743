"""Pure tensor functions: FP4 (E2M1) + E8M0 decode, scale checks, nibble reorders. No file I/O."""

from .fp4 import (
    E2M1_VALUES,
    FP4_GROUP,
    SCALE_NAN_BYTE,
    dequant_fp4_to_bf16,
    dequant_fp8_block_to_bf16,
    find_nan_scales,
    scale_bytes,
)

__all__ = ["E2M1_VALUES", "FP4_GROUP", "SCALE_NAN_BYTE", "dequant_fp4_to_bf16", "dequant_fp8_block_to_bf16",
           "find_nan_scales", "scale_bytes"]

from .fp8 import EXACT_SPAN, Fp8BlockResult, e8m0_to_f32, fp4_to_fp8_block  # noqa: E402

__all__ += ["EXACT_SPAN", "Fp8BlockResult", "e8m0_to_f32", "fp4_to_fp8_block"]
