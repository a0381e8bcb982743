"""`bf16`: routed experts dequantized to BF16 `[out, in]` under their own names; scales dropped.
Bit-identical to the seed formula for FP4 experts; FP8 (Base) experts are dequantized too.

`--param dense=fp8` (default): the FP8 dense linears (attention, shared experts, MTP e/h_proj) stay as they
are; config.json keeps the FP8 `quantization_config`, loses `expert_dtype` (transformers and vLLM accept only
fp4/fp8) and lists every MoE block's experts as not quantized (`ignored_layers`), which transformers, vLLM and
SGLang read (docs/ENGINES.md). `--param dense=bf16`: every FP8 dense linear is dequantized to BF16 too (exact:
an E4M3 value times a power of two), its `.scale` is dropped, and `quantization_config` goes: a plain BF16
checkpoint (training stacks, CPU inference, GPUs without FP8)."""

from __future__ import annotations

import torch

from ..checkpoint import EXPERT_LEGS, ModelSpec, expert_name, fp8_linears, leg_shape
from ..numerics import dequant_fp4_to_bf16, dequant_fp8_block_to_bf16
from ..plan import OutTensor, Unit
from ..records import Block, DenseLayout
from .base import OutputPool, Target, check_scales


class Bf16Target(Target):
    def __init__(self, *args):
        super().__init__(*args)
        self._pool = OutputPool()

    def units(self) -> list[Unit]:
        units = []
        for block in self.model.moe_blocks:
            for rank, (lo, hi) in enumerate(self.ranks()):
                for j in range(lo, hi):
                    prefix = expert_name(block, j)
                    outs = tuple(OutTensor(expert_name(block, j, leg, "weight"), "BF16", leg_shape(self.model, leg),
                                           prefix, rank if self.opts.ep_size > 1 else None) for leg in EXPERT_LEGS)
                    ins = tuple(expert_name(block, j, leg, kind) for leg in EXPERT_LEGS for kind in ("weight", "scale"))
                    units.append(Unit(prefix, block, rank, (j, j + 1), ins, outs))
        return units

    def dense_units(self, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> list[Unit]:
        """dense=bf16: one unit per FP8 dense linear, `X.weight` (F8_E4M3) + `X.scale` -> `X.weight` (BF16)."""
        if self.param("dense") != "bf16":
            return []
        units = []
        for w, s, shape, _ in fp8_linears(self.model, tensors):
            key = "dense:" + w.removesuffix(".weight")
            units.append(Unit(key, w.removesuffix(".weight"), None, (0, 0), (w, s), (OutTensor(w, "BF16", shape, key),),
                              dense=True))
        return units

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        check_scales(inputs)
        device = self.opts.device
        if unit.dense:
            (w, s), (t,) = unit.inputs, unit.outputs
            return {t.name: self.output(dequant_fp8_block_to_bf16(inputs[w].to(device), inputs[s].to(device),
                                                              self.model.weight_block_size))}
        out = {}
        for t in unit.outputs:
            w, s = inputs[t.name], inputs[t.name.removesuffix(".weight") + ".scale"]
            if device == "cuda":
                w, s = w.to(device, non_blocking=True), s.to(device, non_blocking=True)
            if self.model.expert_dtype == "fp8":
                y = dequant_fp8_block_to_bf16(w, s, self.model.weight_block_size)
            elif device == "cpu":
                y = dequant_fp4_to_bf16(w, s, out=self._pool.take(t.shape, torch.bfloat16))
            else:
                y = dequant_fp4_to_bf16(w, s)
            out[t.name] = self.output(y)
        return out

    def recycle(self, tensor: torch.Tensor) -> None:
        self._pool.give(tensor)

    def layers_record(self, units: list[Unit]) -> dict[str, Block]:
        return {block: DenseLayout(format="bf16", tensors=f"{block}.ffn.experts.{{j}}.{{w1,w2,w3}}.weight",
                                   experts=(0, self.model.n_routed_experts)) for block in self.model.moe_blocks}

    def update_config(self, config: dict) -> dict:
        """No `expert_dtype` anywhere. dense=fp8: every MoE block's experts in quantization_config.ignored_layers
        (and in modules_to_not_convert if the source has that list); dense=bf16: no quantization_config."""
        dense_bf16 = self.param("dense") == "bf16"
        config = dict(config)
        config.pop("expert_dtype", None)
        holders = [config]
        if isinstance(config.get("text_config"), dict):
            config["text_config"] = dict(config["text_config"])
            config["text_config"].pop("expert_dtype", None)
            holders.append(config["text_config"])
        skip = expert_skip_list(self.model)
        for h in holders:
            q = h.get("quantization_config")
            if not isinstance(q, dict):
                continue
            if dense_bf16:
                del h["quantization_config"]
                continue
            q = {k: v for k, v in q.items() if k != "expert_dtype"}
            for key in ("ignored_layers", "modules_to_not_convert"):
                if key == "ignored_layers" or key in q:
                    have = list(q.get(key) or [])
                    q[key] = have + [n for n in skip if n not in have]
            h["quantization_config"] = q
        return config


def expert_skip_list(model: ModelSpec) -> list[str]:
    """Module names of every MoE block's routed experts for quantization_config.ignored_layers, in the spellings the
    engines match (docs/ENGINES.md): `layers.N.ffn.experts` (DeepSeek's; transformers renames it to
    `layers.N.mlp.experts` and matches it as a suffix), `layers.N.mlp.experts` (SGLang matches
    `model.layers.N.mlp.experts` exactly and keeps both `X` and `model.X` of each entry), and vLLM's own module name
    (`vllm_experts_module`: its DeepSeek V4 quant config matches routed experts exactly); for MTP block 0 also
    `model.decoder.mlp.experts`, the module of SGLang's MTP draft model (DeepseekV4ForCausalLMNextN builds that block
    as `model.decoder`; without the entry its BF16 experts are cast into FP8 parameters). `lm_head` first:
    transformers stops skipping it once a list is given."""
    names = ["lm_head"]
    for block in model.moe_blocks:
        names += [f"{block}.ffn.experts", f"{block}.mlp.experts", vllm_experts_module(model, block)]
        if block == "mtp.0":
            names.append("model.decoder.mlp.experts")
    return names


def vllm_experts_module(model: ModelSpec, block: str) -> str:
    """vLLM's own name of a block's routed-experts module, which its DeepSeek V4 quant config matches exactly
    (`is_layer_skipped`, exact mode): `model.layers.N.ffn.experts`, MTP block k as layer num_hidden_layers + k."""
    kind, index = block.split(".")
    n = int(index) + (model.num_hidden_layers if kind == "mtp" else 0)
    return f"model.layers.{n}.ffn.experts"
