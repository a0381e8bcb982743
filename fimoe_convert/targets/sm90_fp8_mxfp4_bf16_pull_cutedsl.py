"""`sm90_fp8_mxfp4_bf16_pull_cutedsl`: SM90 pull-style CuTe-DSL megakernel, FP8 activations x MXFP4 weights (preprocessing needs CUDA)."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm90Fp8Mxfp4Pull(MoeEpTarget):
    info = TargetInfo(
        name="sm90_fp8_mxfp4_bf16_pull_cutedsl",
        description="SM90 pull-style CuTe-DSL megakernel, FP8 activations x MXFP4 weights (preprocessing needs CUDA)",
        kernel_name="sm90_fp8_mxfp4_bf16_pull_cutedsl",
        aliases=(),
        vllm_moe_backend=None,
        capabilities=('9.0',),
        weight_format="mxfp4 (FP4 checkpoint, FlashInfer's Humming scale fold)",
        activation_format="fp8_e4m3",
        consumes="fp4",
        needs_nvshmem=True,
        preprocess_needs_cuda=True,
        needs_packages=('flashinfer',),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm90_Fp8_Mxfp4_Bf16_PullCutedsl_MegaMoeConfig"
    pack_format = "fp4"
    align = (128, 128)
    param_choices = {}
