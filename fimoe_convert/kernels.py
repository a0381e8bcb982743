"""The kernel table: every conversion target and the facts about the kernel that runs its output, as data.

One row per target, keyed by FlashInfer's own kernel name where one exists. `targets/` builds the
converters from it and `runtime/` its load-time checks; nothing else keeps a copy of these facts.
Pure data: no torch, no FlashInfer (so `fimoe-convert targets` starts fast)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from .errors import UsageError


@dataclass(frozen=True)
class Kernel:
    name: str  # the --target name: FlashInfer's kernel_name where one exists
    family: str  # the converter in targets/: "bf16" | "fp8_block" | "megamoe" | "moe_ep"
    description: str
    kernel_name: str | None = None  # FlashInfer's registry key; None for outputs dense engines load
    aliases: tuple[str, ...] = ()  # FlashInfer's short names and vLLM's --moe-backend names
    vllm_moe_backend: str | None = None
    capabilities: tuple[str, ...] = ()  # compute capabilities the kernel runs on ("9.0"); () = any
    weight_format: str = ""
    activation_format: str = ""
    consumes: str = "fp4"  # source experts the conversion needs: "fp4" | "any" (FP8 Base experts too)
    needs_nvshmem: bool = False
    preprocess_needs_cuda: bool = False  # FlashInfer's preprocess takes CUDA tensors only
    preprocess_capabilities: tuple[str, ...] = ()  # set: the preprocessing GPU must be one of these
    needs_packages: tuple[str, ...] = ()  # importable modules the conversion needs
    runtime_module: str | None = None  # the flashinfer module that runs the output
    recommended: bool = False  # suggested for its compute capabilities (in table order)
    engines: str = ("FlashInfer flashinfer.moe_ep, through fimoe_convert.runtime (vLLM and SGLang preprocess the "
                    "source at load instead; no engine reads this layout)")  # who loads the output (docs/ENGINES.md)
    # --param KEY=VALUE the target takes: key -> allowed values, the default first.
    params: dict[str, tuple[str, ...]] = field(default_factory=dict)
    align: tuple[int, int] = (1, 1)  # hidden_size, moe_intermediate_size must be multiples of these
    max_ep_size: int | None = None  # set: --ep-size must be a power of two up to this
    # flashinfer.moe_ep kernels: the config dataclass and what its MoEWeightPack holds ("fp4" checkpoint bytes
    # with uint8 scales, "fp4_e8m0" the same with float8_e8m0fnu scales, "bf16" the exact dequant)
    config_class: str | None = None
    pack_format: str | None = None
    # The layout of N experts is the layouts of chunks of them, concatenated, but for leaves that do not grow with
    # the experts, which every chunk gives alike (checked against the whole-block call by
    # tests/targets/test_targets_moe_ep.py): units are then chunks of a rank's experts, so memory does not grow.
    expert_chunks: bool = False
    # The only dataclasses a stored structure of this target may name ("module:qualname" -> {field: "tensor" or a
    # plain type}): the runtime imports these exact names, never one read from a manifest.
    structure_classes: dict[str, dict[str, str]] = field(default_factory=dict)


def _moe_ep(name: str, description: str, *, capabilities: tuple[str, ...], weights: str, activations: str,
            config_class: str, pack_format: str, align: tuple[int, int] = (128, 128), **kw) -> Kernel:
    return Kernel(name=name, family="moe_ep", description=description, kernel_name=name,
                  capabilities=capabilities, weight_format=weights, activation_format=activations,
                  consumes="fp4" if pack_format.startswith("fp4") else "any",
                  needs_packages=("flashinfer", *kw.pop("needs_packages", ())), runtime_module="flashinfer.moe_ep",
                  config_class=config_class, pack_format=pack_format, align=align, **kw)


SM100 = ("10.0", "10.3")

KERNELS: tuple[Kernel, ...] = (
    Kernel("bf16", "bf16", "routed experts dequantized to BF16 [out, in], same names, .scale dropped; "
           "--param dense=bf16 also dequantizes the FP8 dense linears (a plain BF16 checkpoint)",
           weight_format="bf16", activation_format="bf16", consumes="any", params={"dense": ("fp8", "bf16")},
           engines="transformers; vLLM; SGLang with SGLANG_DSV4_FP4_EXPERTS=0; dense=bf16: transformers and "
                   "training stacks (not vLLM's CUDA path)"),
    Kernel("fp8_block", "fp8_block",
           "routed experts FP4 -> FP8 E4M3 with one scale per weight_block_size tile (DeepSeek's convert.py "
           "--expert-dtype fp8 rule), lossless where exact; same names; --param scale_dtype=e8m0|f32",
           weight_format="fp8_e4m3 [out, in] + one E8M0 (or F32) scale per weight_block_size tile",
           activation_format="engine's choice (FP8 block GEMM)", params={"scale_dtype": ("e8m0", "f32")},
           engines="scale_dtype=e8m0: SGLang, DeepSeek's inference, transformers; scale_dtype=f32: vLLM, "
                   "transformers"),
    Kernel("megamoe_sm90_mxfp4", "megamoe",
           "flashinfer.megamoe SM90 fused MegaMoE: MXFP4 tiles + per-expert FP32 global scales",
           kernel_name="megamoe_sm90_mxfp4", capabilities=("9.0",),
           weight_format="mxfp4 (FP4 checkpoint verbatim, Marlin order)", activation_format="fp8_e4m3 (1x128 blocks)",
           needs_packages=("flashinfer",), runtime_module="flashinfer.megamoe", recommended=True,
           engines="FlashInfer flashinfer.megamoe, through fimoe_convert.runtime.load_megamoe_weights",
           align=(256, 128), max_ep_size=32),  # hidden: MegaMoESymmBuffer needs 256; intermediate: the 128 tile
    _moe_ep("sm100_mxfp8_mxfp4_bf16_cutedsl",
            "SM100 CuTe-DSL megakernel, MXFP8 activations x MXFP4 weights; checkpoint FP4 bytes kept, scales swizzled",
            capabilities=SM100, weights="mxfp4 (FP4 checkpoint verbatim)", activations="mxfp8",
            config_class="Sm100_Mxfp8_Mxfp4_Bf16_Cutedsl_MegaMoeConfig", pack_format="fp4", needs_nvshmem=True,
            recommended=True, expert_chunks=True),
    _moe_ep("sm107_mxfp8_mxfp4_bf16_cutedsl", "SM107 CuTe-DSL megakernel, MXFP8 activations x MXFP4 weights",
            capabilities=("10.7",), weights="mxfp4 (FP4 checkpoint verbatim)", activations="mxfp8",
            config_class="Sm107_Mxfp8_Mxfp4_Bf16_Cutedsl_MegaMoeConfig", pack_format="fp4_e8m0", needs_nvshmem=True,
            recommended=True, expert_chunks=True),
    _moe_ep("sm107_mxfp4_mxfp4_bf16_cutedsl", "SM107 CuTe-DSL megakernel, MXFP4 activations x MXFP4 weights",
            capabilities=("10.7",), weights="mxfp4 (FP4 checkpoint verbatim)", activations="mxfp4",
            config_class="Sm107_Mxfp4_Mxfp4_Bf16_Cutedsl_MegaMoeConfig", pack_format="fp4_e8m0", needs_nvshmem=True,
            recommended=True, expert_chunks=True),
    _moe_ep("sm120_mxfp4_mxfp8_bf16_cake", "SM120 cake megakernel, MXFP8 activations x MXFP4 weights",
            capabilities=("12.0",), weights="mxfp4 (FP4 checkpoint verbatim)", activations="mxfp8",
            config_class="Sm120_Mxfp4_Mxfp8_Bf16_Cake_MegaMoeConfig", pack_format="fp4", recommended=True,
            structure_classes={"flashinfer.moe_ep.backends.mega.kernel.sm120.mxfp4_mxfp8_bf16_cake.cake_weights:"
                               "TransformedCakeMegaWeights": {
                                   **dict.fromkeys(("w1_fp4", "w1_sfb", "w2_fp4", "w2_sfb", "w1_b8", "w2_b8"),
                                                   "tensor"),
                                   "hidden_size": "int", "intermediate_size": "int", "local_experts": "int",
                                   "has_shared_expert": "bool"}}),
    _moe_ep("sm100_bf16_bf16_bf16_cutedsl",
            "SM100 CuTe-DSL megakernel on BF16 weights (exact dequant of the FP4 experts)",
            capabilities=SM100, weights="bf16 (exact dequant)", activations="bf16",
            config_class="Sm100_Bf16_Bf16_Bf16_Cutedsl_MegaMoeConfig", pack_format="bf16", align=(32, 64),
            aliases=("bf16_cutedsl",), needs_nvshmem=True, expert_chunks=True),
    _moe_ep("sm100_mxfp8_mxfp8_bf16_cutedsl",
            "SM100 CuTe-DSL megakernel, MXFP8 weights requantized by FlashInfer from the exact BF16 dequant",
            capabilities=SM100, weights="mxfp8 (FlashInfer requantizes the exact BF16 dequant)", activations="mxfp8",
            config_class="Sm100_Mxfp8_Mxfp8_Bf16_Cutedsl_MegaMoeConfig", pack_format="bf16", align=(64, 64),
            aliases=("mxfp8_cutedsl",), needs_nvshmem=True, expert_chunks=True),
    _moe_ep("sm90_fp8_fp8_bf16_pull_cutedsl",
            "SM90 pull-style CuTe-DSL megakernel, FP8 weights; --param fp8_scale_mode=per_tensor|blockwise",
            capabilities=("9.0",), weights="fp8_e4m3 (FlashInfer requantizes the exact BF16 dequant; ~2% rel. L2)",
            activations="fp8_e4m3", config_class="Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig", pack_format="bf16",
            aliases=("sm90_pull_fp8",), needs_nvshmem=True, params={"fp8_scale_mode": ("per_tensor", "blockwise")},
            expert_chunks=True),  # per_tensor: a scale per expert; the activation scales are expert-invariant
    _moe_ep("sm100_nvfp4_nvfp4_bf16_cutedsl",
            "SM100 CuTe-DSL megakernel, NVFP4 weights requantized by FlashInfer (preprocessing needs CUDA)",
            capabilities=SM100, weights="nvfp4 (FlashInfer requantizes the exact BF16 dequant)", activations="nvfp4",
            config_class="Sm100_Nvfp4_Nvfp4_Bf16_Cutedsl_MegaMoeConfig", pack_format="bf16", align=(64, 64),
            aliases=("nvfp4_cutedsl", "flashinfer_moe_ep_mega_cutedsl"),
            vllm_moe_backend="flashinfer_moe_ep_mega_cutedsl", needs_nvshmem=True, preprocess_needs_cuda=True,
            preprocess_capabilities=SM100),  # ptxas refuses its cvt.e2m1x2.f32 for sm_90a (docs/GPU_CHECKS.md)
    _moe_ep("sm90_fp8_mxfp4_bf16_pull_cutedsl",
            "SM90 pull-style CuTe-DSL megakernel, FP8 activations x MXFP4 weights (preprocessing needs CUDA)",
            capabilities=("9.0",), weights="mxfp4 (FP4 checkpoint, FlashInfer's Humming scale fold)",
            activations="fp8_e4m3", config_class="Sm90_Fp8_Mxfp4_Bf16_PullCutedsl_MegaMoeConfig", pack_format="fp4",
            needs_nvshmem=True, preprocess_needs_cuda=True, recommended=True),
    _moe_ep("sm100_fp8_fp4_bf16_deepgemm",
            "SM100 DeepGEMM mega MoE, FP8 activations x FP4 weights (preprocessing needs the deep_gemm package)",
            capabilities=SM100, weights="fp4 (checkpoint verbatim, DeepGEMM layout)", activations="fp8_e4m3",
            config_class="Sm100_Fp8_Fp4_Bf16_Deepgemm_MegaMoeConfig", pack_format="fp4",
            aliases=("deep_gemm_mega", "flashinfer_moe_ep_mega_deep_gemm"),
            vllm_moe_backend="flashinfer_moe_ep_mega_deep_gemm", needs_packages=("deep_gemm",), recommended=True,
            # DeepGEMM's scale transform refuses SM90 ("Unknown SF transformation":
            # benchmarks/results/h200/2026-12-01-deepgemm.log)
            preprocess_needs_cuda=True, preprocess_capabilities=SM100),
)

# Compute capability -> the GPUs that have it, for suggestions.
GPU_FAMILIES = {"9.0": "H100/H200", "10.0": "B200/GB200", "10.3": "B300/GB300", "10.7": "SM107",
                "12.0": "RTX PRO 6000, RTX 50"}

# What to install for a package a conversion needs (Kernel.needs_packages).
# (flashinfer: `pip install 'flashinfer-python>=MIN'`, from versions.py: it works however fimoe-convert was installed)
INSTALL = {"deep_gemm": "install a DeepGEMM build with transform_sf_into_required_layout for your torch and CUDA "
                        "(docs/ENGINES.md, DeepGEMM)"}

BY_NAME: dict[str, Kernel] = {k.name: k for k in KERNELS}


def _normal(name: str) -> str:
    """Case and '-' vs '_' do not matter in a target name."""
    return name.strip().lower().replace("-", "_")


_LOOKUP: dict[str, Kernel] = {_normal(n): k for k in KERNELS for n in (k.name, *k.aliases)}


def get_kernel(name: str) -> Kernel:
    """A target by its name or an alias (FlashInfer's short names, vLLM's --moe-backend names); an unknown name
    is a UsageError with the closest names."""
    kernel = _LOOKUP.get(_normal(name))
    if kernel is not None:
        return kernel
    # a prefix or part of a name first (difflib's ratio misses "megamoe"), else similar names
    close = [k for k in _LOOKUP if _normal(name) and _normal(name) in k] or difflib.get_close_matches(
        _normal(name), list(_LOOKUP), n=3, cutoff=0.6)
    hint = (f"did you mean {' or '.join(repr(n) for n in list(dict.fromkeys(_LOOKUP[c].name for c in close))[:3])}? "
            if close else "")
    raise UsageError(f"--target {name}: unknown target; {hint}known: {', '.join(BY_NAME)} "
                     "(`fimoe-convert targets` lists them with their aliases)")


def suggested(capability: str) -> list[Kernel]:
    """The recommended kernel targets for a compute capability ("9.0"), best first."""
    return [k for k in KERNELS if k.recommended and capability in k.capabilities]


def vllm_backends() -> dict[str, Kernel]:
    """vLLM's --moe-backend names of FlashInfer megakernels -> the kernel each runs."""
    return {k.vllm_moe_backend: k for k in KERNELS if k.vllm_moe_backend}
