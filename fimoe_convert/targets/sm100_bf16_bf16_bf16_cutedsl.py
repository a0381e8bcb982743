"""`sm100_bf16_bf16_bf16_cutedsl`: SM100 CuTe-DSL megakernel on BF16 weights (exact dequant of the FP4 experts)."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm100Bf16(MoeEpTarget):
    info = TargetInfo(
        name="sm100_bf16_bf16_bf16_cutedsl",
        description="SM100 CuTe-DSL megakernel on BF16 weights (exact dequant of the FP4 experts)",
        kernel_name="sm100_bf16_bf16_bf16_cutedsl",
        aliases=('bf16_cutedsl',),
        vllm_moe_backend=None,
        capabilities=('10.0', '10.3'),
        weight_format="bf16 (exact dequant)",
        activation_format="bf16",
        consumes="any",
        needs_nvshmem=True,
        preprocess_needs_cuda=False,
        needs_packages=('flashinfer',),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm100_Bf16_Bf16_Bf16_Cutedsl_MegaMoeConfig"
    pack_format = "bf16"
    align = (32, 64)
    param_choices = {}
