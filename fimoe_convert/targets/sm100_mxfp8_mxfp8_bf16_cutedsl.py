"""`sm100_mxfp8_mxfp8_bf16_cutedsl`: SM100 CuTe-DSL megakernel, MXFP8 weights requantized by FlashInfer from the exact BF16 dequant."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm100Mxfp8Mxfp8(MoeEpTarget):
    info = TargetInfo(
        name="sm100_mxfp8_mxfp8_bf16_cutedsl",
        description="SM100 CuTe-DSL megakernel, MXFP8 weights requantized by FlashInfer from the exact BF16 dequant",
        kernel_name="sm100_mxfp8_mxfp8_bf16_cutedsl",
        aliases=('mxfp8_cutedsl',),
        vllm_moe_backend=None,
        capabilities=('10.0', '10.3'),
        weight_format="mxfp8 (FlashInfer requantizes the exact BF16 dequant)",
        activation_format="mxfp8",
        consumes="any",
        needs_nvshmem=True,
        preprocess_needs_cuda=False,
        needs_packages=('flashinfer',),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm100_Mxfp8_Mxfp8_Bf16_Cutedsl_MegaMoeConfig"
    pack_format = "bf16"
    align = (64, 64)
    param_choices = {}
