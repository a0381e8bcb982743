"""What each family of targets says about its outputs, asked of a kernel-table row or of a manifest's target
record (both carry name, kernel_name, needs_nvshmem, runtime_module): its own rules on the model, the readable
line of its report, what the model card says to load it, what the serving process needs, what the runtime can
make of it, and (moe_ep) FlashInfer's kernel config, built here for conversion and runtime alike. Pure: no torch;
FlashInfer is imported only to build a kernel config."""

from __future__ import annotations

import dataclasses

from ..checkpoint import ModelSpec, expert_name
from ..dtypes import FP4_GROUP
from ..kernels import BY_NAME, Kernel
from ..records import TargetReport

FETCH = ('from huggingface_hub import snapshot_download\n'
         'out = snapshot_download("REPO_ID")  # or the local OUT folder\n')
NOT_A_MEGAKERNEL = ("this output keeps BF16 experts for the engine's own MoE kernels and has no FlashInfer megakernel; "
                    "convert with a FlashInfer target for one (`fimoe-convert targets`)")


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else words or word + 's'}"


class Family:
    """The defaults: an output that dense engines load under the checkpoint's own names."""

    def validate(self, kernel: Kernel, model: ModelSpec) -> list[str]:
        """Problems of this family's own with converting `model` for `kernel` (the generic ones: rules.py)."""
        return []

    def report_line(self, report: TargetReport) -> str:
        """The target's report (Target.merge_reports) as one readable line; '' for none."""
        return ""

    def runtime_needs(self, target) -> list[str]:
        """What the serving process must provide for an output of `target`."""
        return []

    def load_snippet(self, target, layer: str) -> str:
        """The model card's Python that loads block `layer` of an output of `target`."""
        name = expert_name(layer, 0, "w1", "weight")
        what, kind = self.dense_description()
        return (FETCH + what + "import json, os\nfrom safetensors import safe_open\n"
                'weight_map = json.load(open(os.path.join(out, "model.safetensors.index.json")))["weight_map"]\n'
                f'with safe_open(os.path.join(out, weight_map["{name}"]), "pt") as f:\n'
                f'    w1 = f.get_tensor("{name}")  # {kind}')

    def dense_description(self) -> tuple[str, str]:
        return ("# BF16 routed experts under their original names: serve it as a regular DeepSeek V4\n"
                "# checkpoint with BF16 experts (no shim needed), or read a tensor directly:\n", "BF16 [out, in]")

    def load_heading(self) -> str:
        return "Load:"

    def library_name(self) -> str:
        """The model card's library_name: the library that loads an output of this family."""
        return "transformers"

    def serve_lines(self, target) -> list[str]:
        """The model card's serve commands for an output of `target` (docs/SERVING.md has the details)."""
        dense_bf16 = target.parameters.get("dense") == "bf16"
        engines = ["vllm serve OUT --tensor-parallel-size 8",
                   "SGLANG_DSV4_FP4_EXPERTS=0 python3 -m sglang.launch_server --model-path OUT --tp 8"]
        return [*([] if dense_bf16 else engines),
                f"# transformers {'>= 5.20' if dense_bf16 else '5.17, 5.20 or 5.24 (checked)'}: "
                "AutoModelForCausalLM.from_pretrained(OUT)"]

    def megakernel_problem(self, target) -> str | None:
        """Why an output of `target` runs in no FlashInfer megakernel (None: it does)."""
        return f"--target {target.name}: {NOT_A_MEGAKERNEL}"

    def mega_config_problem(self, target) -> str | None:
        """Why an output of `target` gives no flashinfer.moe_ep MegaConfig (None: it does)."""
        return self.megakernel_problem(target)


class Bf16Family(Family):
    pass


class Fp8BlockFamily(Family):
    def validate(self, kernel: Kernel, model: ModelSpec) -> list[str]:
        rows, cols = model.weight_block_size
        if cols % FP4_GROUP:
            return [f"--target {kernel.name}: quantization_config.weight_block_size is [{rows}, {cols}]; the columns "
                    f"must be a multiple of {FP4_GROUP} (one tile holds whole FP4 scale groups); use --target bf16"]
        return []

    def report_line(self, report: TargetReport) -> str:
        r = report.fp8_block
        if r is None:
            return ""
        lossy = (f"{r.lossy_tiles} lossy in {plural(r.lossy_tensors, 'tensor')} (worst abs. error "
                 f"{r.worst_abs_err:.3g}, rel. {r.worst_rel_err:.3g})" if r.lossy_tiles else "all exact")
        return f"fp8_block: {plural(r.tensors, 'expert matrix', 'expert matrices')}, {plural(r.tiles, 'tile')}, {lossy}"

    def serve_lines(self, target) -> list[str]:
        if target.parameters.get("scale_dtype") == "f32":  # expert_dtype fp8 with F32 scales: what vLLM reads
            return ["vllm serve OUT --tensor-parallel-size 8  # or --data-parallel-size 8 --enable-expert-parallel",
                    "# transformers 5.17, 5.20 or 5.24 (checked): AutoModelForCausalLM.from_pretrained(OUT)"]
        return ["SGLANG_DSV4_FP4_EXPERTS=0 python3 -m sglang.launch_server --model-path OUT --tp 8  # or --ep-size 8",
                "# transformers 5.17, 5.20 or 5.24 (checked): AutoModelForCausalLM.from_pretrained(OUT)",
                "# not vLLM: it reads E8M0-scaled FP8 experts as FP4 (convert with --param scale_dtype=f32)"]

    def dense_description(self) -> tuple[str, str]:
        return ("# FP8 E4M3 routed experts with `.scale` tile scales under their original names: serve it as\n"
                "# a DeepSeek V4 FP8 checkpoint (E8M0 scales: SGLang, DeepSeek's inference code; F32 scales with\n"
                "# expert_dtype fp8: vLLM), or read a tensor directly:\n", "FP8 E4M3 [out, in]")


class KernelFamily(Family):
    """Outputs in a FlashInfer kernel's own layout, loaded through fimoe_convert.runtime."""

    def load_heading(self) -> str:
        return "Load with the fimoe-convert runtime shim (no load-time transform):"

    def library_name(self) -> str:
        return "flashinfer"  # FlashInfer's kernels run these layouts, loaded through fimoe_convert.runtime

    def serve_lines(self, target) -> list[str]:
        return ["# FlashInfer's megakernel through fimoe_convert.runtime (below); no engine reads this layout as is"]

    def megakernel_problem(self, target) -> str | None:
        return None


class MegaMoeFamily(KernelFamily):
    def report_line(self, report: TargetReport) -> str:
        r = report.mxfp4_window
        if r is None:
            return ""
        lossy = (f"{r.clamped_groups} clamped in {plural(r.lossy_experts, 'expert')} (worst rel. L2 "
                 f"{r.worst_rel_l2:.3g})" if r.clamped_groups else "all exact")
        return f"MXFP4 scale window: {plural(r.groups, 'scale group')}, {lossy}"

    def runtime_needs(self, target) -> list[str]:
        return ["torch.distributed (process group)", "torch symmetric memory (MegaMoESymmBuffer)"]

    def load_snippet(self, target, layer: str) -> str:
        return (FETCH + "from fimoe_convert.runtime import load_megamoe_weights\n"
                f'l1, l2, l1_scales, l2_scales = load_megamoe_weights(out, "{layer}", rank=0, device="cuda")\n'
                "# flashinfer.megamoe.mxfp4_mega_moe(y, l1, l2, symm_buffer, num_tokens=m,\n"
                "#     l1_global_scales=l1_scales, l2_global_scales=l2_scales)")

    def mega_config_problem(self, target) -> str | None:
        return (f"--target {target.name}: this output is for flashinfer.megamoe, which takes no MegaConfig; load each "
                "block with fimoe_convert.runtime.load_megamoe_weights(out_dir, layer, rank, device) and call "
                "flashinfer.megamoe.mxfp4_mega_moe")


class MoeEpFamily(KernelFamily):
    def runtime_needs(self, target) -> list[str]:
        return ["torch.distributed"] + (["NVSHMEM"] if target.needs_nvshmem else [])

    def load_snippet(self, target, layer: str) -> str:
        return (FETCH + "from fimoe_convert.runtime import mega_config\n" f'cfg = mega_config(out, "{layer}", '
                'rank=0, device="cuda")  # MegaConfig(preprocess_weights=False, ...)')


FAMILIES: dict[str, Family] = {"bf16": Bf16Family(), "fp8_block": Fp8BlockFamily(), "megamoe": MegaMoeFamily(),
                               "moe_ep": MoeEpFamily()}


def family(target) -> Family:
    """The family of `target`: a kernel-table row, or anything with the `name` of one (a manifest's record)."""
    kernel = target if isinstance(target, Kernel) else BY_NAME.get(target.name)
    if kernel is None:
        raise KeyError(target.name)
    return FAMILIES[kernel.family]


# FlashInfer's kernel config: one builder, for the conversion's preprocess and for the runtime's MegaConfig -----

def config_class(kernel: Kernel) -> type | None:
    """The flashinfer.moe_ep config dataclass the kernel table names for `kernel` (None: not in this FlashInfer)."""
    import flashinfer.moe_ep as me

    cls = getattr(me, kernel.config_class or "", None)
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


def kernel_config(cls: type, sizes: tuple[int, int], params: dict, kernel_options: dict | None = None):
    """`cls` made from the --param values, then `kernel_options` (other fields), then the checkpoint's `sizes`
    (moe_intermediate_size, num_experts_per_tok) as far as `cls` has fields for them."""
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    geometry = {k: v for k, v in zip(("intermediate_size", "top_k"), sizes) if k in fields}
    return cls(**{**params, **(kernel_options or {}), **geometry})
