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
  expert_dtype "fp8", and reads their block scales as float32)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable

import torch

from ..checkpoint import EXPERT_LEGS, ModelSpec, leg_shape, natural_key
from ..errors import InputError
from ..numerics import FP4_GROUP
from ..numerics.fp8 import EXACT_SPAN, fp4_to_fp8_block
from ..plan import OutTensor, Unit
from .base import Target, TargetInfo, TargetOptions, check_scales, rank_ranges, to_host

SCALE_DTYPES = {"e8m0": "F8_E8M0", "f32": "F32"}
MAX_EXAMPLES = 5  # lossy tiles named in the report


class LossyRepackError(InputError):
    pass


@dataclass
class Fp8BlockReport:
    tensors: int = 0
    tiles: int = 0
    lossy_tiles: int = 0
    lossy_tensors: int = 0
    worst_abs_err: float = 0.0
    worst_rel_err: float = 0.0
    examples: list = field(default_factory=list)  # "tensor tile (r, c)" of the first lossy tiles

    def to_json(self) -> dict:
        return {"tensors": self.tensors, "tiles": self.tiles, "lossy_tiles": self.lossy_tiles,
                "lossy_tensors": self.lossy_tensors, "worst_abs_err": self.worst_abs_err,
                "worst_rel_err": self.worst_rel_err, "lossy_examples": list(self.examples)}


def _scale_dtype(opts: TargetOptions) -> str:
    return opts.params.get("scale_dtype", "e8m0")


def tile_shape(model: ModelSpec, leg: str) -> tuple[int, int]:
    out, inp = leg_shape(model, leg)
    rows, cols = model.weight_block_size
    return (-(-out // rows), -(-inp // cols))


class Fp8BlockTarget(Target):
    info = TargetInfo(
        name="fp8_block",
        description="routed experts FP4 -> FP8 E4M3 with one scale per weight_block_size tile (DeepSeek's "
                    "convert.py --expert-dtype fp8 rule), lossless where exact; same names; "
                    "--param scale_dtype=e8m0|f32",
        weight_format="fp8_e4m3 [out, in] + one E8M0 (or F32) scale per weight_block_size tile",
        activation_format="engine's choice (FP8 block GEMM)",
        consumes="fp4",
    )
    param_choices = {"scale_dtype": tuple(SCALE_DTYPES)}

    def __init__(self):
        # unit -> tensor -> report: a unit split between shards runs in each lane that writes part of it
        self._units: dict[str, dict[str, Fp8BlockReport]] = {}
        self._lock = threading.Lock()

    def check(self, model: ModelSpec, opts: TargetOptions) -> list[str]:
        p = []
        rows, cols = model.weight_block_size
        if cols % FP4_GROUP:
            p.append(f"--target {self.info.name}: quantization_config.weight_block_size is [{rows}, {cols}]; the "
                     f"columns must be a multiple of {FP4_GROUP} (one tile holds whole FP4 scale groups); use --target bf16")
        for key, value in opts.params.items():
            if key not in self.param_choices:
                p.append(f"--param {key}={value}: {self.info.name} takes "
                         + ", ".join(f"{k} ({'|'.join(v)})" for k, v in self.param_choices.items()))
            elif value not in self.param_choices[key]:
                p.append(f"--param {key}={value}: expected one of {', '.join(self.param_choices[key])}")
        return p

    def units(self, model: ModelSpec, opts: TargetOptions) -> list[Unit]:
        sdt = SCALE_DTYPES.get(_scale_dtype(opts), "F8_E8M0")
        params = {"block": tuple(model.weight_block_size), "scale_dtype": sdt, "allow_lossy": opts.allow_lossy}
        units = []
        for block in model.moe_blocks:
            for rank, (lo, hi) in enumerate(rank_ranges(model, opts)):
                for j in range(lo, hi):
                    prefix = f"{block}.ffn.experts.{j}"
                    r = rank if opts.ep_size > 1 else None
                    outs = []
                    for leg in EXPERT_LEGS:
                        outs.append(OutTensor(f"{prefix}.{leg}.weight", "F8_E4M3", leg_shape(model, leg), prefix, r))
                        outs.append(OutTensor(f"{prefix}.{leg}.scale", sdt, tile_shape(model, leg), prefix, r))
                    ins = tuple(f"{prefix}.{leg}.{kind}" for leg in EXPERT_LEGS for kind in ("weight", "scale"))
                    units.append(Unit(prefix, block, rank, (j, j + 1), ins, tuple(outs), dict(params)))
        return units

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
        block, sdt, allow_lossy = unit.params["block"], unit.params["scale_dtype"], unit.params["allow_lossy"]
        check_scales(inputs)
        out = {}
        for leg in EXPERT_LEGS:
            wname, sname = f"{unit.key}.{leg}.weight", f"{unit.key}.{leg}.scale"
            w, s = inputs[wname], inputs[sname]
            if device == "cuda":
                w, s = w.to(device, non_blocking=True), s.to(device, non_blocking=True)
            r = fp4_to_fp8_block(w, s, block)
            self._account(unit.key, wname, r, s, block, allow_lossy)
            scale = r.tile_scales_f32() if sdt == "F32" else r.tile_scales_e8m0()
            out[wname], out[sname] = to_host(r.weight), to_host(scale)
        return out

    def _account(self, key: str, name: str, r, scales: torch.Tensor, block: tuple[int, int], allow_lossy: bool
                 ) -> None:
        rep = Fp8BlockReport()
        n_lossy = r.lossy_tiles
        if n_lossy and not allow_lossy:
            tr, tc = (int(i) for i in r.lossy.nonzero()[0])
            rows, cols = block
            sb = scales.view(torch.uint8)[tr * rows:(tr + 1) * rows, tc * cols // FP4_GROUP:(tc + 1) * cols // FP4_GROUP]
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

    def report(self, units: Iterable[str] | None = None) -> dict:
        with self._lock:
            tensors = {name: rep for k in (list(self._units) if units is None else units)
                       for name, rep in self._units.get(k, {}).items()}
        return self.merge_reports([{"fp8_block": tensors[n].to_json()} for n in sorted(tensors, key=natural_key)])

    def merge_reports(self, parts: list[dict]) -> dict:
        total = Fp8BlockReport()
        for part in parts:
            rep = part.get("fp8_block")
            if not rep:
                continue
            total.tensors += rep["tensors"]
            total.tiles += rep["tiles"]
            total.lossy_tiles += rep["lossy_tiles"]
            total.lossy_tensors += rep["lossy_tensors"]
            total.worst_abs_err = max(total.worst_abs_err, rep["worst_abs_err"])
            total.worst_rel_err = max(total.worst_rel_err, rep["worst_rel_err"])
            total.examples += rep["lossy_examples"][:MAX_EXAMPLES - len(total.examples)]
        return {"fp8_block": total.to_json()}

    def layers_record(self, model: ModelSpec, opts: TargetOptions, units: list[Unit]) -> dict:
        rows, cols = model.weight_block_size
        return {block: {"format": "fp8_block", "tensors": f"{block}.ffn.experts.{{j}}.{{w1,w2,w3}}.{{weight,scale}}",
                        "weight_dtype": "F8_E4M3", "scale_dtype": SCALE_DTYPES[_scale_dtype(opts)],
                        "block": [rows, cols], "experts": [0, model.n_routed_experts]}
                for block in model.moe_blocks}

    def update_config(self, config: dict, model: ModelSpec, opts: TargetOptions) -> dict:
        """e8m0: `expert_dtype` removed (wherever it is); f32: `expert_dtype: "fp8"` where the dialect keeps it."""
        config = dict(config)
        f32 = _scale_dtype(opts) == "f32"
        text = dict(config.get("text_config") or {}) if "text_config" in config else None
        qkey = "quantization_config"
        top_q = dict(config[qkey]) if isinstance(config.get(qkey), dict) else None
        text_q = dict(text[qkey]) if text is not None and isinstance(text.get(qkey), dict) else None
        for d in (config, text, top_q, text_q):
            if d is not None:
                d.pop("expert_dtype", None)
        if f32:
            if model.dialect == "v4.1":  # V4.1 keeps expert_dtype inside quantization_config
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
