"""`megamoe_sm90_mxfp4`: FlashInfer's SM90 MegaMoE (H100/H200), MXFP4 weights x FP8 activations.

The inputs FlashInfer documents (flashinfer.megamoe.weights): gate rows then up rows, Marlin nibble
order, E8M0 scales inside [2**-5, 2**6] with each expert's excess in a power-of-two FP32 global
scale (gate and up share one). `transform_mxfp4_weights_for_mega_moe` owns the tile layout."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterable

import torch

from ..budget import UNIT_BYTES_MAX
from ..checkpoint import expert_name
from ..errors import LossyRepackError
from ..numerics import dequant_fp4_to_bf16
from ..numerics.mxfp4 import linear_to_marlin, window_scales
from ..plan import OutTensor, Unit
from ..records import Block, RankLayer, TargetReport, TensorNode, TupleNode, WindowReport
from .base import Target, check_scales, kernel_target_config, prefix

LEG_SOURCES = {"l1": ("w1", "w3"), "l2": ("w2",)}  # l1: gate rows, then up rows
# Leaf order of the object mxfp4_mega_moe takes: (l1, l2, l1_global_scales, l2_global_scales). In the file each
# leg's weight comes before its global scale (names sort that way), so a unit's tiny scale piece waits, not its weight.
STRUCTURE = (("l1", "weight"), ("l2", "weight"), ("l1", "weight_global_scale"), ("l2", "weight_global_scale"))
GLOBAL_SCALE_BYTES = 4  # one FP32 per expert


def _transform(l1, l2):
    from flashinfer.megamoe import transform_mxfp4_weights_for_mega_moe

    return transform_mxfp4_weights_for_mega_moe(l1, l2)


@functools.cache
def _leg_transform():
    """FlashInfer's per-leg transform (`weights._transform_one` in 0.7.4, which its public function calls for
    each leg), when it is there with that signature; else None."""
    import inspect

    from flashinfer.megamoe import weights

    one = getattr(weights, "_transform_one", None)
    try:
        ok = one is not None and list(inspect.signature(one).parameters) == ["weights", "group_size", "interleave",
                                                                             "decode_tiles"]
    except (TypeError, ValueError):
        ok = False
    return one if ok else None


def transform_leg(leg: str, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's tile layout of one leg ([E, N, K/2] Marlin-order codes and [E, N, K/32] scale bytes), the
    bytes its public `transform_mxfp4_weights_for_mega_moe` gives for that leg. Legs are transformed apart so
    that a unit holds one leg's chunk; without the per-leg helper, the other leg is an all-zero stand-in
    (same bytes, twice the work)."""
    one = _leg_transform()
    if one is not None:
        return one((packed, scales), 32, leg == "l1", True)
    e, n, half_k = packed.shape
    if leg == "l1":  # [E, 2I, H/2] pairs with l2 [E, H, I/2]
        other = (packed.new_zeros(e, 2 * half_k, n // 4), packed.new_full((e, 2 * half_k, n // 64), 127))
        return _transform((packed, scales), other)[0]
    other = (packed.new_zeros(e, 4 * half_k, n // 2), packed.new_full((e, 4 * half_k, n // 32), 127))
    return _transform(other, (packed, scales))[1]


@functools.lru_cache(maxsize=8)
def _tile_shapes(hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    """Per-expert output shape of each leg, asked of FlashInfer by transforming one all-zero expert."""
    l1p = torch.zeros(1, 2 * inter, hidden // 2, dtype=torch.uint8)
    l1s = torch.full((1, 2 * inter, hidden // 32), 127, dtype=torch.uint8)
    l2p = torch.zeros(1, hidden, inter // 2, dtype=torch.uint8)
    l2s = torch.full((1, hidden, inter // 32), 127, dtype=torch.uint8)
    a, b = _transform((l1p, l1s), (l2p, l2s))
    return {"l1": tuple(a.shape[1:]), "l2": tuple(b.shape[1:])}


def _window_report(reps) -> TargetReport:
    r = WindowReport()
    for rep in reps:
        r.merge(rep)
    return TargetReport(mxfp4_window=r)


class MegaMoeTarget(Target):
    def __init__(self, *args):
        super().__init__(*args)
        self._reports: dict[str, WindowReport] = {}
        self._lock = threading.Lock()

    def units(self) -> list[Unit]:
        """Per block, EP rank and leg, chunks of experts whose output is about `opts.unit_bytes`: the
        transform is per expert, so chunks concatenate to the bytes of the whole rank at once."""
        shapes = _tile_shapes(self.model.hidden_size, self.model.moe_intermediate_size)
        units = []
        for block in self.model.moe_blocks:
            for rank, (lo, hi) in enumerate(self.ranks()):
                pre = prefix(block, rank)
                for leg, shape in shapes.items():
                    per_expert = math.prod(shape) + GLOBAL_SCALE_BYTES
                    step = max(1, (self.opts.unit_bytes or UNIT_BYTES_MAX) // per_expert)
                    for a in range(lo, hi, step):
                        b = min(hi, a + step)
                        key = f"{pre}.{leg}.{a}-{b}"
                        outs = (OutTensor(f"{pre}.{leg}.weight", "U8", (b - a, *shape), key, rank),
                                OutTensor(f"{pre}.{leg}.weight_global_scale", "F32", (b - a,), key, rank))
                        ins = tuple(expert_name(block, j, w, kind) for j in range(a, b)
                                    for w in LEG_SOURCES[leg] for kind in ("weight", "scale"))
                        units.append(Unit(key, block, rank, (a, b), ins, outs, leg))
        return units

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        got = self.transform(unit, inputs)
        out = {}
        for t in unit.outputs:
            v = self.output(got[t.name])
            if tuple(v.shape) != t.shape:
                raise AssertionError(f"{t.name}: FlashInfer returned shape {tuple(v.shape)}, planned {t.shape}")
            out[t.name] = v
        return out

    def transform(self, unit: Unit, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The unit's kernel-ready rows on the options' device, by output name (its leg's `weight` and
        `weight_global_scale`): what a server would otherwise compute at load time."""
        lo, hi = unit.experts
        leg, device, allow_lossy = unit.leg, self.opts.device, self.opts.allow_lossy
        check_scales(inputs)

        def stack(kind):
            per_source = [torch.stack([inputs[expert_name(unit.block, j, w, kind)].view(torch.uint8)
                                       .to(device, non_blocking=True) for j in range(lo, hi)])
                          for w in LEG_SOURCES[leg]]
            return per_source[0] if len(per_source) == 1 else torch.cat(per_source, dim=1)

        p, s = stack("weight"), stack("scale")
        newp, news, g, rep, bad = window_scales(p, s, allow_lossy)
        if bad and not allow_lossy:
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
        with self._lock:  # by unit: lanes convert at once, and a unit split between shards runs in each
            self._reports[unit.key] = rep
        pre = prefix(unit.block, unit.rank)
        return {f"{pre}.{leg}.weight": transform_leg(leg, linear_to_marlin(newp), news),
                f"{pre}.{leg}.weight_global_scale": torch.exp2(g.float())}

    def report(self, units: Iterable[str] | None = None) -> TargetReport:
        with self._lock:
            reps = [self._reports[k] for k in (list(self._reports) if units is None else units) if k in self._reports]
        return _window_report(reps)

    def merge_reports(self, parts: list[TargetReport]) -> TargetReport:
        return _window_report(p.mxfp4_window for p in parts if p.mxfp4_window is not None)

    def layers_record(self, units: list[Unit]) -> dict[str, Block]:
        shapes = _tile_shapes(self.model.hidden_size, self.model.moe_intermediate_size)
        rec: dict[str, dict] = {}
        for block in self.model.moe_blocks:
            for rank, (lo, hi) in enumerate(self.ranks()):
                pre, e = prefix(block, rank), hi - lo
                leaves = tuple(TensorNode(tensor=f"{pre}.{leg}.{slot}",
                                          dtype="uint8" if slot == "weight" else "float32",
                                          shape=(e, *shapes[leg]) if slot == "weight" else (e,))
                               for leg, slot in STRUCTURE)
                rec.setdefault(block, {})[str(rank)] = RankLayer(experts=(lo, hi), structure=TupleNode(leaves))
        return rec

    def update_config(self, config: dict) -> dict:
        return kernel_target_config(self, config)
