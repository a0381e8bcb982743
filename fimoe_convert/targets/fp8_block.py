"""`fp8_block`: routed experts FP4 -> FP8 E4M3 with one scale per `weight_block_size` tile (128x128 for
V4, 32x32 for V4.1), the rule of DeepSeek's `convert.py --expert-dtype fp8`; lossless only where every
value is exact in E4M3, checked per tile (numerics.fp8). Names stay: `...experts.{j}.w{1,2,3}.weight`
(F8_E4M3 [out, in]) and `.scale` ([ceil(out/rows), ceil(in/cols)]).

Two output layouts (--param scale_dtype=...):
- `e8m0` (default): F8_E8M0 tile scales and no `expert_dtype` in config.json, like the community FP8
  repackages (sgl-project/DeepSeek-V4-Flash-FP8) and the tensors DeepSeek's own convert.py writes;
  SGLang detects FP8 experts from the F8_E4M3 weight dtype, DeepSeek's inference from the absent
  expert_dtype.
- `f32`: F32 tile scales and `expert_dtype: "fp8"` (V4.1: inside quantization_config), the layout of
  the Base checkpoints, which vLLM's DeepSeek V4 loader keys on (it loads FP8 experts only with
  expert_dtype "fp8", and then reads *every* FP8 block scale, dense linears included, as float32:
  `DeepseekV4FP8Config.is_scale_e8m0` is `expert_dtype == "fp4"`). So the E8M0 scales of the dense FP8
  linears become F32 too (exact: powers of two), as in the Base checkpoints (docs/ENGINES.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from ..checkpoint import EXPERT_LEGS, ModelSpec, expert_name, fp8_linears, leg_shape, natural_key
from ..dtypes import FP4_GROUP
from ..errors import LossyRepackError
from ..numerics.fp8 import EXACT_SPAN, e8m0_to_f32, fp4_to_fp8_block
from ..plan import OutTensor, Unit
from ..records import Block, DenseLayout, Fp8BlockReport, TargetReport
from .base import Target, check_scales

SCALE_DTYPES = {"e8m0": "F8_E8M0", "f32": "F32"}
MAX_EXAMPLES = 5  # lossy tiles named in the report


def tile_shape(model: ModelSpec, leg: str) -> tuple[int, int]:
    out, inp = leg_shape(model, leg)
    rows, cols = model.weight_block_size
    return (-(-out // rows), -(-inp // cols))


class Fp8BlockTarget(Target):
    def __init__(self, *args):
        super().__init__(*args)
        # unit -> tensor -> report: a unit split between shards runs in each lane that writes part of it
        self._units: dict[str, dict[str, Fp8BlockReport]] = {}
        self._lock = threading.Lock()

    @property
    def scale_dtype(self) -> str:
        return SCALE_DTYPES[self.param("scale_dtype")]

    @property
    def f32(self) -> bool:
        return self.scale_dtype == "F32"

    def units(self) -> list[Unit]:
        model, sdt = self.model, self.scale_dtype
        units = []
        for block in model.moe_blocks:
            for rank, (lo, hi) in enumerate(self.ranks()):
                for j in range(lo, hi):
                    prefix = expert_name(block, j)
                    r = rank if self.opts.ep_size > 1 else None
                    outs = []
                    for leg in EXPERT_LEGS:
                        outs.append(OutTensor(expert_name(block, j, leg, "weight"), "F8_E4M3", leg_shape(model, leg),
                                              prefix, r))
                        outs.append(OutTensor(expert_name(block, j, leg, "scale"), sdt, tile_shape(model, leg),
                                              prefix, r))
                    ins = tuple(expert_name(block, j, leg, kind) for leg in EXPERT_LEGS for kind in ("weight", "scale"))
                    units.append(Unit(prefix, block, rank, (j, j + 1), ins, tuple(outs)))
        return units

    def dense_units(self, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> list[Unit]:
        """f32: one unit per dense FP8 linear whose scale is F8_E8M0, rewriting that scale as F32."""
        if not self.f32:
            return []
        units = []
        for _, s, _, sdtype in fp8_linears(self.model, tensors):
            if sdtype == "F8_E8M0":
                key = "dense:" + s.removesuffix(".scale")
                units.append(Unit(key, s.removesuffix(".scale"), None, (0, 0), (s,),
                                  (OutTensor(s, "F32", tensors[s][1], key),), dense=True))
        return units

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        block, device, allow_lossy = self.model.weight_block_size, self.opts.device, self.opts.allow_lossy
        check_scales(inputs)
        if unit.dense:  # an E8M0 tile scale as F32: 2**(s-127), exact
            return {n: e8m0_to_f32(t) for n, t in inputs.items()}
        out = {}
        for leg in EXPERT_LEGS:
            wname, sname = f"{unit.key}.{leg}.weight", f"{unit.key}.{leg}.scale"
            w, s = inputs[wname], inputs[sname]
            if device == "cuda":
                w, s = w.to(device, non_blocking=True), s.to(device, non_blocking=True)
            r = fp4_to_fp8_block(w, s, block)
            self._account(unit.key, wname, r, s, block, allow_lossy)
            scale = r.tile_scales_f32() if self.f32 else r.tile_scales_e8m0()
            out[wname], out[sname] = self.output(r.weight), self.output(scale)
        return out

    def _account(self, key: str, name: str, r, scales: torch.Tensor, block: tuple[int, int], allow_lossy: bool
                 ) -> None:
        rep = Fp8BlockReport()
        n_lossy = r.lossy_tiles
        if n_lossy and not allow_lossy:
            tr, tc = (int(i) for i in r.lossy.nonzero()[0])
            rows, cols = block
            g0, g1 = tc * cols // FP4_GROUP, (tc + 1) * cols // FP4_GROUP  # the tile's scale groups
            sb = scales.view(torch.uint8)[tr * rows:(tr + 1) * rows, g0:g1]
            raise LossyRepackError(
                f"tensor {name!r}: tile ({tr}, {tc}) (rows {tr * rows}..{min(r.weight.shape[0], (tr + 1) * rows) - 1}, "
                f"columns {tc * cols}..{min(r.weight.shape[1], (tc + 1) * cols) - 1}) is not exact in FP8 E4M3 "
                f"({n_lossy} of {r.lossy.numel()} tiles of this tensor are lossy): its per-32 scale bytes span "
                f"{int(sb.min())}..{int(sb.max())}, more than the {EXACT_SPAN} steps one {rows}x{cols} E8M0 tile "
                f"scale keeps exact; run again with --allow-lossy --overwrite to convert and report the error, "
                "or use --target bf16")
        rep.tensors += 1
        rep.tiles += r.lossy.numel()
        if n_lossy:
            rep.lossy_tiles += n_lossy
            rep.lossy_tensors += 1
            rep.worst_abs_err = max(rep.worst_abs_err, float(r.max_abs.max()))
            rep.worst_rel_err = max(rep.worst_rel_err, float(r.max_rel.max()))
            rep.examples = [f"{name} tile ({tr}, {tc})" for tr, tc in r.lossy.nonzero().tolist()[:MAX_EXAMPLES]]
        with self._lock:
            self._units.setdefault(key, {})[name] = rep

    def report(self, units: Iterable[str] | None = None) -> TargetReport:
        with self._lock:
            tensors = {name: rep for k in (list(self._units) if units is None else units)
                       for name, rep in self._units.get(k, {}).items()}
        return self.merge_reports([TargetReport(fp8_block=tensors[n]) for n in sorted(tensors, key=natural_key)])

    def merge_reports(self, parts: list[TargetReport]) -> TargetReport:
        total = Fp8BlockReport()
        for rep in (part.fp8_block for part in parts):
            if rep is None:
                continue
            total.tensors += rep.tensors
            total.tiles += rep.tiles
            total.lossy_tiles += rep.lossy_tiles
            total.lossy_tensors += rep.lossy_tensors
            total.worst_abs_err = max(total.worst_abs_err, rep.worst_abs_err)
            total.worst_rel_err = max(total.worst_rel_err, rep.worst_rel_err)
            total.examples += rep.examples[:MAX_EXAMPLES - len(total.examples)]
        return TargetReport(fp8_block=total)

    def layers_record(self, units: list[Unit]) -> dict[str, Block]:
        rows, cols = self.model.weight_block_size
        pattern = "{block}.ffn.experts.{{j}}.{{w1,w2,w3}}.{{weight,scale}}"
        return {block: DenseLayout(format="fp8_block", tensors=pattern.format(block=block),
                                   weight_dtype="F8_E4M3", scale_dtype=self.scale_dtype, block=(rows, cols),
                                   experts=(0, self.model.n_routed_experts))
                for block in self.model.moe_blocks}

    def update_config(self, config: dict) -> dict:
        """e8m0: `expert_dtype` removed (wherever it is); f32: `expert_dtype: "fp8"` where the dialect keeps it."""
        config = dict(config)
        f32 = self.f32
        text = dict(config.get("text_config") or {}) if "text_config" in config else None
        qkey = "quantization_config"
        top_q = dict(config[qkey]) if isinstance(config.get(qkey), dict) else None
        text_q = dict(text[qkey]) if text is not None and isinstance(text.get(qkey), dict) else None
        for d in (config, text, top_q, text_q):
            if d is not None:
                d.pop("expert_dtype", None)
        if f32:
            if self.model.dialect == "v4.1":  # V4.1 keeps expert_dtype inside quantization_config
                q = top_q if top_q is not None else text_q
                if q is None:
                    top_q = q = {}
                q["expert_dtype"] = "fp8"
            else:
                config["expert_dtype"] = "fp8"
        if top_q is not None:
            config[qkey] = top_q
        if text is not None:
            if text_q is not None:
                text[qkey] = text_q
            config["text_config"] = text
        return config
