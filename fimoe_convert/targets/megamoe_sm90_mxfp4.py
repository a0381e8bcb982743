"""`megamoe_sm90_mxfp4`: FlashInfer's SM90 MegaMoE (H100/H200), MXFP4 weights x FP8 activations.

The inputs FlashInfer documents (flashinfer.megamoe.weights): gate rows then up rows, Marlin nibble
order, E8M0 scales inside [2**-5, 2**6] with each expert's excess in a power-of-two FP32 global
scale (gate and up share one). `transform_mxfp4_weights_for_mega_moe` owns the tile layout."""

from __future__ import annotations

import functools

import torch

from ..checkpoint import ModelSpec
from ..errors import InputError
from ..numerics import dequant_fp4_to_bf16
from ..numerics.mxfp4 import WindowReport, linear_to_marlin, window_scales
from ..plan import OutTensor, Unit
from .base import Target, TargetInfo, TargetOptions, check_scales, rank_ranges, to_host

TILE = 128  # the kernel's N and K tile (elements)
SYMM_HIDDEN_MULTIPLE = 256  # MegaMoESymmBuffer needs hidden % 256 == 0
MAX_RANKS = 32
SLOTS = (("l1", "weight"), ("l2", "weight"), ("l1", "global_scale"), ("l2", "global_scale"))


class LossyRepackError(InputError):
    pass


def _transform(l1, l2):
    from flashinfer.megamoe import transform_mxfp4_weights_for_mega_moe

    return transform_mxfp4_weights_for_mega_moe(l1, l2)


@functools.lru_cache(maxsize=8)
def _tile_shapes(hidden: int, inter: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-expert output shapes, asked of FlashInfer by transforming one all-zero expert."""
    l1p = torch.zeros(1, 2 * inter, hidden // 2, dtype=torch.uint8)
    l1s = torch.full((1, 2 * inter, hidden // 32), 127, dtype=torch.uint8)
    l2p = torch.zeros(1, hidden, inter // 2, dtype=torch.uint8)
    l2s = torch.full((1, hidden, inter // 32), 127, dtype=torch.uint8)
    a, b = _transform((l1p, l1s), (l2p, l2s))
    return tuple(a.shape[1:]), tuple(b.shape[1:])


def prefix(block: str, rank: int) -> str:
    return f"{block}.ffn.experts.ep{rank}"


class MegaMoeSm90Mxfp4(Target):
    info = TargetInfo(
        name="megamoe_sm90_mxfp4",
        description="flashinfer.megamoe SM90 fused MegaMoE: MXFP4 tiles + per-expert FP32 global scales",
        kernel_name="megamoe_sm90_mxfp4",
        capabilities=("9.0",),
        weight_format="mxfp4 (FP4 checkpoint verbatim, Marlin order)",
        activation_format="fp8_e4m3 (1x128 blocks)",
        consumes="fp4",
        needs_nvshmem=False,
        needs_packages=("flashinfer",),
        runtime_module="flashinfer.megamoe",
    )

    def __init__(self):
        self._report = WindowReport()

    def check(self, model: ModelSpec, opts: TargetOptions) -> list[str]:
        p = []
        h, i = model.hidden_size, model.moe_intermediate_size
        if h % SYMM_HIDDEN_MULTIPLE:
            p.append(f"--target {self.info.name}: hidden_size {h} must be a multiple of {SYMM_HIDDEN_MULTIPLE} "
                     "(MegaMoESymmBuffer); this model cannot use this kernel, use --target bf16")
        if i % TILE:
            p.append(f"--target {self.info.name}: moe_intermediate_size {i} must be a multiple of {TILE}; "
                     "use --target bf16")
        n = opts.ep_size
        if n > MAX_RANKS or n & (n - 1):
            p.append(f"--ep-size {n}: {self.info.name} runs on a power-of-two number of ranks up to {MAX_RANKS}")
        return p

    def units(self, model: ModelSpec, opts: TargetOptions) -> list[Unit]:
        s1, s2 = _tile_shapes(model.hidden_size, model.moe_intermediate_size)
        units = []
        for block in model.moe_blocks:
            for rank, (lo, hi) in enumerate(rank_ranges(model, opts)):
                e = hi - lo
                pre = prefix(block, rank)
                shapes = {("l1", "weight"): ("U8", (e, *s1)), ("l2", "weight"): ("U8", (e, *s2)),
                          ("l1", "global_scale"): ("F32", (e,)), ("l2", "global_scale"): ("F32", (e,))}
                outs = tuple(OutTensor(f"{pre}.{leg}.{slot}", *shapes[(leg, slot)], pre, rank) for leg, slot in SLOTS)
                ins = tuple(f"{block}.ffn.experts.{j}.{leg}.{kind}" for j in range(lo, hi)
                            for leg in ("w1", "w2", "w3") for kind in ("weight", "scale"))
                units.append(Unit(pre, block, rank, (lo, hi), ins, outs, {"allow_lossy": opts.allow_lossy}))
        return units

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
        out = {}
        got = self.transform(unit, inputs, device)
        for t in unit.outputs:
            v = to_host(got[t.name.removeprefix(unit.key + ".")])
            if tuple(v.shape) != t.shape:
                raise AssertionError(f"{t.name}: FlashInfer returned shape {tuple(v.shape)}, planned {t.shape}")
            out[t.name] = v
        return out

    def transform(self, unit: Unit, inputs: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
        """The unit's kernel-ready tensors on `device` ("l1.weight", "l2.weight", "l1.global_scale",
        "l2.global_scale"): what a server would otherwise compute at load time."""
        lo, hi = unit.experts
        check_scales(inputs)

        def stack(leg, kind):
            return torch.stack([inputs[f"{unit.block}.ffn.experts.{j}.{leg}.{kind}"].view(torch.uint8)
                                .to(device, non_blocking=True) for j in range(lo, hi)])

        l1p = torch.cat([stack("w1", "weight"), stack("w3", "weight")], dim=1)  # gate rows, then up rows
        l1s = torch.cat([stack("w1", "scale"), stack("w3", "scale")], dim=1)
        l2p, l2s = stack("w2", "weight"), stack("w2", "scale")
        legs = {}
        for leg, (p, s) in (("l1", (l1p, l1s)), ("l2", (l2p, l2s))):
            newp, news, g, rep, bad = window_scales(p, s, unit.params["allow_lossy"])
            if bad and not unit.params["allow_lossy"]:
                which = ", ".join(str(lo + b) for b in bad[:8])
                raise LossyRepackError(
                    f"{unit.block} experts {which} ({'gate/up' if leg == 'l1' else 'down'}): scale bytes span more than "
                    f"the 12 exponents the SM90 MXFP4 decoder keeps exact, so the repack would be lossy; "
                    f"run again with --allow-lossy --overwrite to convert and report the error, or use --target bf16")
            if rep.clamped_groups:  # measured on the lossy experts only
                before = dequant_fp4_to_bf16(p[bad], s[bad]).float()
                after = dequant_fp4_to_bf16(newp[bad], news[bad]).float() * torch.exp2(g[bad].float()).view(-1, 1, 1)
                err = (after - before).flatten(1).norm(dim=1) / before.flatten(1).norm(dim=1).clamp_min(1e-30)
                rep.worst_rel_l2 = float(err.max())
            self._report.merge(rep)
            legs[leg] = (linear_to_marlin(newp), news, torch.exp2(g.float()))
        l1, l2 = _transform(legs["l1"][:2], legs["l2"][:2])
        return {"l1.weight": l1, "l2.weight": l2, "l1.global_scale": legs["l1"][2], "l2.global_scale": legs["l2"][2]}

    def report(self) -> dict:
        r = self._report
        return {"mxfp4_window": {"groups": r.groups, "clamped_groups": r.clamped_groups,
                                 "lossy_experts": r.lossy_experts, "worst_rel_l2": r.worst_rel_l2}}

    def layers_record(self, model: ModelSpec, opts: TargetOptions, units: list[Unit]) -> dict:
        rec: dict[str, dict] = {}
        for u in units:
            leaves = [{"tensor": t.name, "dtype": "uint8" if t.dtype == "U8" else "float32", "shape": list(t.shape)}
                      for t in u.outputs]
            rec.setdefault(u.block, {})[str(u.rank)] = {
                "experts": list(u.experts),
                "structure": {"tuple": leaves},  # (l1, l2, l1_global_scales, l2_global_scales)
            }
        return rec

    def update_config(self, config: dict, model: ModelSpec, opts: TargetOptions) -> dict:
        return {**config, "fimoe_convert": {"target": self.info.name, "ep_size": opts.ep_size,
                                            "manifest": "fimoe-manifest.json"}}
