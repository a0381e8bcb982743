"""`sm100_nvfp4_nvfp4_bf16_cutedsl`: SM100 CuTe-DSL megakernel, NVFP4 weights requantized by FlashInfer (preprocessing needs CUDA)."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm100Nvfp4Nvfp4(MoeEpTarget):
    info = TargetInfo(
        name="sm100_nvfp4_nvfp4_bf16_cutedsl",
        description="SM100 CuTe-DSL megakernel, NVFP4 weights requantized by FlashInfer (preprocessing needs CUDA)",
        kernel_name="sm100_nvfp4_nvfp4_bf16_cutedsl",
        aliases=('nvfp4_cutedsl', 'flashinfer_moe_ep_mega_cutedsl'),
        vllm_moe_backend='flashinfer_moe_ep_mega_cutedsl',
        capabilities=('10.0', '10.3'),
        weight_format="nvfp4 (FlashInfer requantizes the exact BF16 dequant)",
        activation_format="nvfp4",
        consumes="any",
        needs_nvshmem=True,
        preprocess_needs_cuda=True,
        needs_packages=('flashinfer',),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm100_Nvfp4_Nvfp4_Bf16_Cutedsl_MegaMoeConfig"
    pack_format = "bf16"
    align = (64, 64)
    param_choices = {}
