"""`sm90_fp8_fp8_bf16_pull_cutedsl`: SM90 pull-style CuTe-DSL megakernel, FP8 weights; --param fp8_scale_mode=per_tensor|blockwise."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm90Fp8Fp8Pull(MoeEpTarget):
    info = TargetInfo(
        name="sm90_fp8_fp8_bf16_pull_cutedsl",
        description="SM90 pull-style CuTe-DSL megakernel, FP8 weights; --param fp8_scale_mode=per_tensor|blockwise",
        kernel_name="sm90_fp8_fp8_bf16_pull_cutedsl",
        aliases=('sm90_pull_fp8',),
        vllm_moe_backend=None,
        capabilities=('9.0',),
        weight_format="fp8_e4m3 (FlashInfer requantizes the exact BF16 dequant; ~2% rel. L2)",
        activation_format="fp8_e4m3",
        consumes="any",
        needs_nvshmem=True,
        preprocess_needs_cuda=False,
        needs_packages=('flashinfer',),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig"
    pack_format = "bf16"
    align = (128, 128)
    param_choices = {'fp8_scale_mode': ('per_tensor', 'blockwise')}
