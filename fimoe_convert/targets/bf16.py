"""`bf16`: routed experts dequantized to BF16 `[out, in]` under their own names; scales dropped.
Bit-identical to the seed formula for FP4 experts; FP8 (Base) experts are dequantized too."""

from __future__ import annotations

import torch

from ..checkpoint import EXPERT_LEGS, leg_shape
from ..numerics import dequant_fp4_to_bf16, dequant_fp8_block_to_bf16
from ..plan import OutTensor, Unit
from .base import OutputPool, Target, check_scales, to_host


class Bf16Target(Target):
    def __init__(self, *args):
        super().__init__(*args)
        self._pool = OutputPool()

    def units(self) -> list[Unit]:
        units = []
        for block in self.model.moe_blocks:
            for rank, (lo, hi) in enumerate(self.ranks()):
                for j in range(lo, hi):
                    prefix = f"{block}.ffn.experts.{j}"
                    outs = tuple(OutTensor(f"{prefix}.{leg}.weight", "BF16", leg_shape(self.model, leg), prefix,
                                           rank if self.opts.ep_size > 1 else None) for leg in EXPERT_LEGS)
                    ins = tuple(f"{prefix}.{leg}.{kind}" for leg in EXPERT_LEGS for kind in ("weight", "scale"))
                    units.append(Unit(prefix, block, rank, (j, j + 1), ins, outs))
        return units

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        check_scales(inputs)
        device = self.opts.device
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
            out[t.name] = to_host(y)
        return out

    def recycle(self, tensor: torch.Tensor) -> None:
        self._pool.give(tensor)

    def layers_record(self, units: list[Unit]) -> dict:
        return {block: {"format": "bf16", "tensors": f"{block}.ffn.experts.{{j}}.{{w1,w2,w3}}.weight",
                        "experts": [0, self.model.n_routed_experts]} for block in self.model.moe_blocks}

    def update_config(self, config: dict) -> dict:
        config = dict(config)
        if self.model.dialect == "v4.1":
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
