"""`sm120_mxfp4_mxfp8_bf16_cake`: SM120 cake megakernel, MXFP8 activations x MXFP4 weights."""

from .base import TargetInfo
from .moe_ep_base import MoeEpTarget


class Sm120Mxfp4Mxfp8Cake(MoeEpTarget):
    info = TargetInfo(
        name="sm120_mxfp4_mxfp8_bf16_cake",
        description="SM120 cake megakernel, MXFP8 activations x MXFP4 weights",
        kernel_name="sm120_mxfp4_mxfp8_bf16_cake",
        aliases=(),
        vllm_moe_backend=None,
        capabilities=('12.0',),
        weight_format="mxfp4 (FP4 checkpoint verbatim)",
        activation_format="mxfp8",
        consumes="fp4",
        needs_nvshmem=False,
        preprocess_needs_cuda=False,
        needs_packages=('flashinfer',),
        runtime_module="flashinfer.moe_ep",
    )
    config_class = "Sm120_Mxfp4_Mxfp8_Bf16_Cake_MegaMoeConfig"
    pack_format = "fp4"
    align = (128, 128)
    param_choices = {}
