"""DeepSeek V4 model spec from config.json (V4 and V4.1 dialects) and routed-expert tensor names."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from ..dtypes import FP4_GROUP
from ..errors import InputError, ValidationError
from ..records import Geometry

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
        return expert_name(self.block, self.expert, self.leg, self.kind)


def expert_name(block: str, expert: int, leg: str | None = None, kind: str | None = None) -> str:
    """`layers.3.ffn.experts.7.w2.scale`, the one spelling of a routed expert's tensor; without `leg` and `kind`
    the expert's prefix `layers.3.ffn.experts.7`."""
    prefix = f"{block}.ffn.experts.{expert}"
    return prefix if leg is None else f"{prefix}.{leg}.{kind}"


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

    def geometry(self) -> Geometry:
        """The record of this spec (the manifest's `model`)."""
        return Geometry(**asdict(self), moe_blocks=len(self.moe_blocks))

    def to_json(self) -> dict:
        return self.geometry().to_json()


# Sane absolute caps on what config.json declares (the largest V4 has 384 experts, 61 layers, hidden 7168): no
# count or size above them is a real checkpoint, and each is used to size lists and shapes.
MAX_FIELD = {"hidden_size": 1 << 20, "moe_intermediate_size": 1 << 20, "n_routed_experts": 1 << 16,
             "num_experts_per_tok": 1 << 16, "num_hidden_layers": 1 << 12, "num_hash_layers": 1 << 12,
             "num_nextn_predict_layers": 1 << 6, "first_k_dense_replace": 1 << 12}
MAX_BLOCK = 1 << 16  # rows or columns of one quantization block


def _obj(value) -> dict:
    """`value` if it is a JSON object, else {} (its type is reported where it is read)."""
    return value if isinstance(value, dict) else {}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def model_spec_from_config(config: dict, where: str = "config.json") -> ModelSpec:
    """Read the geometry of a DeepSeek V4 / V4.1 config; every missing or bad field at once. Any JSON value gives
    a ModelSpec or a ValidationError naming the field, nothing else."""
    if not isinstance(config, dict):
        raise ValidationError([f"{where}: is {type(config).__name__}; expected a JSON object"])
    problems: list[str] = []
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise ValidationError([f"{where}: model_type is {_shown(model_type)}; expected one of "
                               f"{', '.join(MODEL_TYPES)} (a DeepSeek V4 checkpoint)"])
    dialect = MODEL_TYPES[model_type]
    text = config
    if dialect == "v4.1" and config.get("text_config") is not None:
        text = config["text_config"]
        if not isinstance(text, dict):
            raise ValidationError([f"{where}: text_config is {_shown(text)}; expected an object (V4.1 nests the "
                                   "text model under it)"])
        text = text or config
    for key, holder in [("quantization_config", config)] + ([] if text is config else
                                                            [("text_config.quantization_config", text)]):
        value = holder.get("quantization_config")
        if value is not None and not isinstance(value, dict):
            problems.append(f"{where}: {key} is {_shown(value)}; expected an object")
    qcfg = _obj(config.get("quantization_config")) or _obj(text.get("quantization_config"))
    values: dict[str, int] = {}
    for key in REQUIRED_FIELDS:
        v = text.get(key)
        if type(v) is not int or not 0 < v <= MAX_FIELD[key]:
            problems.append(f"{where}: {key} is {_shown(v)}; expected a positive integer"
                            + (f" of at most {MAX_FIELD[key]}" if type(v) is int and v > 0 else ""))
            v = 0
        values[key] = v
    optional = {}
    for key in ("num_hash_layers", "num_nextn_predict_layers", "first_k_dense_replace"):
        v = text.get(key, 0)
        if type(v) is not int or not 0 <= v <= MAX_FIELD[key]:
            problems.append(f"{where}: {key} is {_shown(v)}; expected a non-negative integer"
                            + (f" of at most {MAX_FIELD[key]}" if type(v) is int and v > 0 else ""))
            v = 0
        optional[key] = v
    if dialect == "v4.1":
        expert_dtype = qcfg.get("expert_dtype", text.get("expert_dtype"))
    else:
        expert_dtype = text.get("expert_dtype", qcfg.get("expert_dtype"))
    expert_dtype = "fp8" if expert_dtype is None else expert_dtype  # Base checkpoints omit it and ship FP8 experts
    if not isinstance(expert_dtype, str) or expert_dtype not in ("fp4", "fp8"):
        problems.append(f"{where}: expert_dtype is {_shown(expert_dtype)}; expected 'fp4' or 'fp8'")
        expert_dtype = "fp8"
    block = qcfg.get("weight_block_size", [FP8_BLOCK, FP8_BLOCK])
    if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and 0 < b <= MAX_BLOCK for b in block)):
        problems.append(f"{where}: quantization_config.weight_block_size is {_shown(block)}; expected [rows, cols] "
                        f"(positive integers of at most {MAX_BLOCK})")
        block = [FP8_BLOCK, FP8_BLOCK]
    h, i = values["hidden_size"], values["moe_intermediate_size"]
    if expert_dtype == "fp4":
        for key, v in (("hidden_size", h), ("moe_intermediate_size", i)):
            if v and v % FP4_GROUP:
                problems.append(f"{where}: {key} is {v}; FP4 experts need a multiple of {FP4_GROUP}")
    e, k = values["n_routed_experts"], values["num_experts_per_tok"]
    if e and k and k > e:
        problems.append(f"{where}: num_experts_per_tok is {k}; expected at most n_routed_experts ({e})")
    if values["num_hidden_layers"] and optional["first_k_dense_replace"] > values["num_hidden_layers"]:
        problems.append(f"{where}: first_k_dense_replace is {optional['first_k_dense_replace']}; "
                        f"expected at most num_hidden_layers ({values['num_hidden_layers']})")
    architectures = config.get("architectures") or []
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        problems.append(f"{where}: architectures is {_shown(architectures)}; expected a list of class names")
        architectures = []
    if problems:
        raise ValidationError(problems)
    return ModelSpec(
        model_type=model_type, dialect=dialect, hidden_size=h, moe_intermediate_size=i,
        n_routed_experts=e, num_experts_per_tok=k, num_hidden_layers=values["num_hidden_layers"],
        num_hash_layers=optional["num_hash_layers"], num_nextn_predict_layers=optional["num_nextn_predict_layers"],
        first_k_dense_replace=optional["first_k_dense_replace"], expert_dtype=expert_dtype,
        weight_block_size=tuple(block), architectures=tuple(architectures),
    )


_BLOCK_RE = re.compile(r"^(layers|mtp)\.(\d+)\.")


def check_counts(spec: ModelSpec, names, where: str = "config.json") -> list[str]:
    """Counts config.json declares against the tensor `names` present (the index): layers, MTP blocks and, where
    there are MoE blocks, experts. Run before anything loops over the declared counts, so that a config declaring
    10^7 experts fails here in one line instead of growing lists."""
    present: dict[str, set[int]] = {"layers": set(), "mtp": set()}
    experts: set[int] = set()
    for name in names:
        m = _BLOCK_RE.match(name)
        if m:
            present[m[1]].add(int(m[2]))
        key = parse_expert_name(name)
        if key is not None:
            experts.add(key.expert)
    problems = []
    declared = (("num_hidden_layers", spec.num_hidden_layers, "layers", "layers"),
                ("num_nextn_predict_layers", spec.num_nextn_predict_layers, "mtp", "MTP blocks"))
    for key, n, prefix, what in declared:
        if n > len(present[prefix]):
            problems.append(f"{where}: {key} is {n}, but the index holds {_count(present[prefix], prefix, what)}; "
                            "the checkpoint is incomplete or config.json declares more than it holds")
    moe_blocks = spec.num_hidden_layers - spec.first_k_dense_replace + spec.num_nextn_predict_layers
    if moe_blocks and spec.n_routed_experts > len(experts):
        problems.append(f"{where}: n_routed_experts is {spec.n_routed_experts}, but the index holds "
                        f"{_count(experts, 'experts', 'routed experts')}; the checkpoint is incomplete or "
                        "config.json declares more experts than it holds")
    return problems


def _count(ids: set[int], prefix: str, what: str) -> str:
    if not ids:
        return f"no {what}"
    return f"{len(ids)} {what} ({prefix}.{min(ids)} to {prefix}.{max(ids)})"


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
