"""`sm107_mxfp8_mxfp4_bf16_cutedsl`: SM107 CuTe-DSL megakernel, MXFP8 activations x MXFP4 weights."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm107Mxfp8Mxfp4(MoeEpTarget):
    info = TargetInfo(
        name="sm107_mxfp8_mxfp4_bf16_cutedsl",
        description="SM107 CuTe-DSL megakernel, MXFP8 activations x MXFP4 weights",
        kernel_name="sm107_mxfp8_mxfp4_bf16_cutedsl",
        aliases=(),
        vllm_moe_backend=None,
        capabilities=('10.7',),
        weight_format="mxfp4 (FP4 checkpoint verbatim)",
        activation_format="mxfp8",
        consumes="fp4",
        needs_nvshmem=True,
        preprocess_needs_cuda=False,
        needs_packages=('flashinfer',),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm107_Mxfp8_Mxfp4_Bf16_Cutedsl_MegaMoeConfig"
    pack_format = "fp4_e8m0"
    align = (128, 128)
    param_choices = {}
