"""DeepSeek V4 model spec from config.json (V4 and V4.1 dialects) and routed-expert tensor names."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from ..dtypes import FP4_GROUP
from ..errors import InputError, ValidationError

FP8_BLOCK = 128  # rows x cols per F32 scale in FP8 (Base) experts
EXPERT_LEGS = ("w1", "w2", "w3")  # gate, down, up

MODEL_TYPES = {"deepseek_v4": "v4", "deepseek_v41": "v4.1"}
REQUIRED_FIELDS = ("hidden_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                   "num_hidden_layers")

_EXPERT_RE = re.compile(
    r"^(?P<block>(?:layers|mtp)\.(?P<idx>\d+))\.ffn\.experts\.(?P<expert>\d+)\.(?P<leg>w[123])\.(?P<kind>weight|scale)$"
)


@dataclass(frozen=True)
class ExpertKey:
    block: str  # "layers.3" or "mtp.0"
    expert: int
    leg: str  # w1 | w2 | w3
    kind: str  # weight | scale

    def name(self) -> str:
        return f"{self.block}.ffn.experts.{self.expert}.{self.leg}.{self.kind}"


def parse_expert_name(name: str) -> ExpertKey | None:
    """`layers.3.ffn.experts.7.w2.scale` -> ExpertKey; None for any other tensor."""
    m = _EXPERT_RE.match(name)
    if not m:
        return None
    return ExpertKey(m["block"], int(m["expert"]), m["leg"], m["kind"])


def natural_key(name: str) -> tuple:
    """Sort key that orders `layers.10` after `layers.9` (numbers compared as numbers)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    dialect: str  # "v4" | "v4.1"
    hidden_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    num_hidden_layers: int
    num_hash_layers: int
    num_nextn_predict_layers: int
    first_k_dense_replace: int
    expert_dtype: str  # "fp4" | "fp8"
    weight_block_size: tuple[int, int]
    architectures: tuple[str, ...] = field(default=())

    @property
    def moe_blocks(self) -> list[str]:
        """Block prefixes that hold routed experts, in file-name order (MTP blocks last)."""
        layers = [f"layers.{i}" for i in range(self.first_k_dense_replace, self.num_hidden_layers)]
        return layers + [f"mtp.{k}" for k in range(self.num_nextn_predict_layers)]

    def to_json(self) -> dict:
        d = asdict(self)
        d["weight_block_size"] = list(self.weight_block_size)
        d["architectures"] = list(self.architectures)
        d["moe_blocks"] = len(self.moe_blocks)
        return d


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def model_spec_from_config(config: dict, where: str = "config.json") -> ModelSpec:
    """Read the geometry of a DeepSeek V4 / V4.1 config; every missing or bad field at once."""
    problems: list[str] = []
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValidationError([f"{where}: model_type is {model_type!r}; expected one of "
                               f"{', '.join(MODEL_TYPES)} (a DeepSeek V4 checkpoint)"])
    dialect = MODEL_TYPES[model_type]
    text = _text_config(config) if dialect == "v4.1" else config
    qcfg = config.get("quantization_config") or text.get("quantization_config") or {}
    values: dict[str, int] = {}
    for key in REQUIRED_FIELDS:
        v = text.get(key)
        if type(v) is not int or v <= 0:
            problems.append(f"{where}: {key} is {v!r}; expected a positive integer")
        values[key] = v if type(v) is int else 0
    optional = {}
    for key in ("num_hash_layers", "num_nextn_predict_layers", "first_k_dense_replace"):
        v = text.get(key, 0)
        if type(v) is not int or v < 0:
            problems.append(f"{where}: {key} is {v!r}; expected a non-negative integer")
            v = 0
        optional[key] = v
    if dialect == "v4.1":
        expert_dtype = qcfg.get("expert_dtype", text.get("expert_dtype"))
    else:
        expert_dtype = text.get("expert_dtype", qcfg.get("expert_dtype"))
    expert_dtype = expert_dtype or "fp8"  # Base checkpoints omit it and ship FP8 experts
    if expert_dtype not in ("fp4", "fp8"):
        problems.append(f"{where}: expert_dtype is {expert_dtype!r}; expected 'fp4' or 'fp8'")
    block = qcfg.get("weight_block_size", [FP8_BLOCK, FP8_BLOCK])
    if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
        problems.append(f"{where}: quantization_config.weight_block_size is {block!r}; expected [rows, cols]")
        block = [FP8_BLOCK, FP8_BLOCK]
    h, i = values["hidden_size"], values["moe_intermediate_size"]
    if expert_dtype == "fp4":
        for key, v in (("hidden_size", h), ("moe_intermediate_size", i)):
            if v and v % FP4_GROUP:
                problems.append(f"{where}: {key} is {v}; FP4 experts need a multiple of {FP4_GROUP}")
    e, k = values["n_routed_experts"], values["num_experts_per_tok"]
    if e and k and k > e:
        problems.append(f"{where}: num_experts_per_tok is {k}; expected at most n_routed_experts ({e})")
    if optional["first_k_dense_replace"] > values["num_hidden_layers"]:
        problems.append(f"{where}: first_k_dense_replace is {optional['first_k_dense_replace']}; "
                        f"expected at most num_hidden_layers ({values['num_hidden_layers']})")
    if problems:
        raise ValidationError(problems)
    return ModelSpec(
        model_type=model_type, dialect=dialect, hidden_size=h, moe_intermediate_size=i,
        n_routed_experts=e, num_experts_per_tok=k, num_hidden_layers=values["num_hidden_layers"],
        num_hash_layers=optional["num_hash_layers"], num_nextn_predict_layers=optional["num_nextn_predict_layers"],
        first_k_dense_replace=optional["first_k_dense_replace"], expert_dtype=expert_dtype,
        weight_block_size=tuple(block), architectures=tuple(config.get("architectures") or ()),
    )


def leg_shape(spec: ModelSpec, leg: str) -> tuple[int, int]:
    """Logical [out, in] of one expert matrix: w1/w3 [I, H], w2 [H, I]."""
    h, i = spec.hidden_size, spec.moe_intermediate_size
    return (h, i) if leg == "w2" else (i, h)


def expected_expert_tensors(spec: ModelSpec, leg: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{'weight': (dtype, shape), 'scale': (dtype, shape)} for one routed expert matrix."""
    out, inp = leg_shape(spec, leg)
    if spec.expert_dtype == "fp4":
        return {"weight": ("I8", (out, inp // 2)), "scale": ("F8_E8M0", (out, inp // FP4_GROUP))}
    rows, cols = spec.weight_block_size
    return {"weight": ("F8_E4M3", (out, inp)), "scale": ("F32", (math.ceil(out / rows), math.ceil(inp / cols)))}


FP8_WEIGHT = "F8_E4M3"


def fp8_linears(spec: ModelSpec, tensors: dict[str, tuple[str, tuple[int, ...]]]
                ) -> list[tuple[str, str, tuple[int, ...], str]]:
    """(weight, scale, weight shape, scale dtype) of every FP8 linear among `tensors` (name -> (safetensors dtype,
    shape); routed experts left out by the caller): an F8_E4M3 `X.weight` with an `X.scale` of one value per
    `weight_block_size` tile, [ceil(out/rows), ceil(in/cols)]."""
    rows, cols = spec.weight_block_size
    found = []
    for w, (dtype, shape) in tensors.items():
        s = w.removesuffix(".weight") + ".scale"
        if dtype != FP8_WEIGHT or not w.endswith(".weight") or len(shape) != 2 or s not in tensors:
            continue
        sdtype, sshape = tensors[s]
        want = (math.ceil(shape[0] / rows), math.ceil(shape[1] / cols))
        if tuple(sshape) != want:
            raise InputError(f"tensor {s!r}: shape {list(sshape)}, expected {list(want)} (one scale per {rows}x{cols} "
                             f"tile of {w!r} {list(shape)}); the checkpoint does not match "
                             "quantization_config.weight_block_size")
        found.append((w, s, tuple(shape), sdtype))
    return sorted(found, key=lambda f: natural_key(f[0]))
