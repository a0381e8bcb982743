"""`sm100_fp8_fp4_bf16_deepgemm`: SM100 DeepGEMM mega MoE, FP8 activations x FP4 weights (preprocessing needs the deep_gemm package)."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm100Fp8Fp4DeepGemm(MoeEpTarget):
    info = TargetInfo(
        name="sm100_fp8_fp4_bf16_deepgemm",
        description="SM100 DeepGEMM mega MoE, FP8 activations x FP4 weights (preprocessing needs the deep_gemm package)",
        kernel_name="sm100_fp8_fp4_bf16_deepgemm",
        aliases=('deep_gemm_mega', 'flashinfer_moe_ep_mega_deep_gemm'),
        vllm_moe_backend='flashinfer_moe_ep_mega_deep_gemm',
        capabilities=('10.0', '10.3'),
        weight_format="fp4 (checkpoint verbatim, DeepGEMM layout)",
        activation_format="fp8_e4m3",
        consumes="fp4",
        needs_nvshmem=False,
        preprocess_needs_cuda=False,
        needs_packages=('flashinfer', 'deep_gemm'),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm100_Fp8_Fp4_Bf16_Deepgemm_MegaMoeConfig"
    pack_format = "fp4"
    align = (128, 128)
    param_choices = {}
