"""`bf16`: routed experts dequantized to BF16 `[out, in]` under their own names; scales dropped.
Bit-identical to the seed formula for FP4 experts; FP8 (Base) experts are dequantized too."""

from __future__ import annotations

import torch

from ..checkpoint import EXPERT_LEGS, ModelSpec, leg_shape
from ..numerics import dequant_fp4_to_bf16, dequant_fp8_block_to_bf16
from ..plan import OutTensor, Unit
from .base import OutputPool, Target, TargetInfo, TargetOptions, check_scales, rank_ranges, to_host


class Bf16Target(Target):
    info = TargetInfo(
        name="bf16",
        description="routed experts dequantized to BF16 [out, in], same names, .scale dropped",
        weight_format="bf16",
        activation_format="bf16",
        consumes="any",
    )

    def __init__(self):
        self._pool = OutputPool()

    def units(self, model: ModelSpec, opts: TargetOptions) -> list[Unit]:
        units = []
        ranges = rank_ranges(model, opts)
        for block in model.moe_blocks:
            for rank, (lo, hi) in enumerate(ranges):
                for j in range(lo, hi):
                    prefix = f"{block}.ffn.experts.{j}"
                    outs = tuple(OutTensor(f"{prefix}.{leg}.weight", "BF16", leg_shape(model, leg), prefix,
                                           rank if opts.ep_size > 1 else None) for leg in EXPERT_LEGS)
                    ins = tuple(f"{prefix}.{leg}.{kind}" for leg in EXPERT_LEGS for kind in ("weight", "scale"))
                    units.append(Unit(prefix, block, rank, (j, j + 1), ins, outs,
                                      {"fp8_block": model.weight_block_size if model.expert_dtype == "fp8" else None}))
        return units

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
        check_scales(inputs)
        out = {}
        fp8_block = unit.params.get("fp8_block")
        for t in unit.outputs:
            w, s = inputs[t.name], inputs[t.name.removesuffix(".weight") + ".scale"]
            if device == "cuda":
                w, s = w.to(device, non_blocking=True), s.to(device, non_blocking=True)
            if fp8_block:
                y = dequant_fp8_block_to_bf16(w, s, tuple(fp8_block))
            elif device == "cpu":
                y = dequant_fp4_to_bf16(w, s, out=self._pool.take(t.shape, torch.bfloat16))
            else:
                y = dequant_fp4_to_bf16(w, s)
            out[t.name] = to_host(y)
        return out

    def recycle(self, tensor: torch.Tensor) -> None:
        self._pool.give(tensor)

    def layers_record(self, model: ModelSpec, opts: TargetOptions, units: list[Unit]) -> dict:
        return {block: {"format": "bf16", "tensors": f"{block}.ffn.experts.{{j}}.{{w1,w2,w3}}.weight",
                        "experts": [0, model.n_routed_experts]} for block in model.moe_blocks}

    def update_config(self, config: dict, model: ModelSpec, opts: TargetOptions) -> dict:
        config = dict(config)
        if model.dialect == "v4.1":
            text = dict(config.get("text_config") or {})
            q = dict(config.get("quantization_config") or text.get("quantization_config") or {})
            q["expert_dtype"] = "bf16"
            if "quantization_config" in config:
                config["quantization_config"] = q
            else:
                text["quantization_config"] = q
                config["text_config"] = text
        else:
            config["expert_dtype"] = "bf16"
        return config
