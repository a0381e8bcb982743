"""What a DeepSeek V4 checkpoint of a given geometry holds, as released (pure: no data, no files): every tensor's
name, dtype, shape and shard, for the fixtures of `fixtures.py` and for tests of the released inventory.

Per block (DeepSeek's inference/model.py and transformers' modeling_deepseek_v4.py agree on these names and shapes):
attention wq_a/wq_b/wkv/wo_a/wo_b FP8 E4M3 + E8M0 128x128 scales (wo_a is [o_groups*o_lora, heads*head_dim/o_groups]),
q_norm, kv_norm, attn_sink; `compress_ratios[i]` 4 adds a compressor (wkv/wgate [2*head_dim, H], ape [4, 2*head_dim])
and the Lightning Indexer (wq_b FP8, weights_proj, its own ratio-4 compressor of index_head_dim); 128 adds a compressor
(wkv/wgate [head_dim, H], ape [128, head_dim]); 0 neither. Hash layers carry ffn.gate.tid2eid, the others
ffn.gate.bias. MTP blocks (ratio 0) add e_proj/h_proj, enorm/hnorm/norm and their own hc_head_*."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..checkpoint import EXPERT_LEGS, VARIANTS, expert_name, natural_key
from ..dtypes import FP4_GROUP
from ..files.safetensors.header import PlannedTensor

BLOCK = 128  # FP8 block size of attention and shared-expert weights
HC = 4  # hyper-connection copies
SCALE_SPAN = 8  # scale bytes of one expert's gate+up (and of its down) lie within this many steps


def flash_ratios(layers: int, first_window: int = 2) -> tuple[int, ...]:
    """V4-Flash's schedule: `first_window` sliding-window layers (0), then 4 on even and 128 on odd layers."""
    return tuple(0 if i < first_window else (4 if i % 2 == 0 else 128) for i in range(layers))


@dataclass(frozen=True)
class FixtureSpec:
    hidden: int = 256
    inter: int = 256
    experts: int = 8
    top_k: int = 2
    layers: int = 3
    hash_layers: int = 1
    mtp: int = 1
    vocab: int = 128
    heads: int = 4
    head_dim: int = 128
    q_lora: int = 128
    o_lora: int = 128
    o_groups: int = 2
    index_heads: int = 2
    index_head_dim: int = 128
    index_topk: int = 8
    rope_dim: int = 16  # qk_rope_head_dim
    routed_scaling: float = 1.5
    # Per main layer (0 sliding window, 4 CSA, 128 HCA); layers past its end follow V4-Flash's schedule.
    compress_ratios: tuple[int, ...] = (0, 4, 128)
    shards: int = 4
    shard_layout: str = "balanced"  # "balanced" | "release" (embed, one shard per layer, head, one per MTP block)
    seed: int = 0
    extreme_scales: bool = True  # layer 0 expert 0 uses scale bytes 1..9, expert 1 uses 246..254 (never routed)
    expert_dtype: str = "fp4"  # "fp4" | "fp8" (Base checkpoints)
    dialect: str = "v4"  # "v4" | "v4.1"
    scale_span: int = SCALE_SPAN  # FP4 scale bytes of an expert matrix span this many steps (> 14: fp8_block lossy)
    linear_scales: str = "e8m0"  # scales of FP8 attention/shared-expert weights: "e8m0" | "f32" (Base checkpoints)
    linear_block: int | None = None  # tile of FP8 attention/shared-expert weights (None: 128; V4.1: 32)
    expert_dtype_in_config: bool | None = None  # None: for FP4 only (V4), always (V4.1); True/False: always/never
    dspark: bool = False  # 0731/DSpark MTP blocks: main_proj/main_norm, markov/confidence heads, no e_proj/h_proj
    extra_tensors: bool = False  # more non-expert tensors (engram, indexer k_norm, vision tower), copied untouched

    def ratio(self, layer: int) -> int:
        if layer < len(self.compress_ratios):
            return self.compress_ratios[layer]
        return flash_ratios(layer + 1)[layer]

    def config_ratios(self) -> list[int]:
        """config.json's compress_ratios: one per main layer, then 0 per MTP block (as released)."""
        return [self.ratio(i) for i in range(self.layers)] + [0] * self.mtp


_FLASH = VARIANTS["V4-Flash"]
_PRO = VARIANTS["V4-Pro"]
PRESETS: dict[str, FixtureSpec] = {
    # Loads in transformers' DeepseekV4ForCausalLM (tests/engines); hidden and inter fit every kernel target.
    "tiny": FixtureSpec(),
    # V4-Flash expert geometry with few experts and layers: 5 MoE blocks x 16 experts, ~4 GB of BF16 out.
    "flash-geometry": FixtureSpec(hidden=_FLASH.hidden_size, inter=_FLASH.moe_intermediate_size,
                                  experts=16, top_k=6, layers=4, hash_layers=1, mtp=1, vocab=1024, heads=8,
                                  head_dim=128, q_lora=512, o_lora=512, compress_ratios=flash_ratios(4), shards=6,
                                  extreme_scales=False),
    # The releases at full size (their config.json and index): with make_checkpoint(..., sparse=True) only.
    "v4-flash": FixtureSpec(hidden=4096, inter=2048, experts=256, top_k=6, layers=43, hash_layers=3, mtp=1,
                            vocab=129280, heads=64, head_dim=512, q_lora=1024, o_lora=1024, o_groups=8,
                            index_heads=64, index_head_dim=128, index_topk=512, rope_dim=64, routed_scaling=1.5,
                            compress_ratios=flash_ratios(43), shards=46, shard_layout="release",
                            extreme_scales=False),
    "v4-pro": FixtureSpec(hidden=7168, inter=3072, experts=384, top_k=6, layers=61, hash_layers=3, mtp=1,
                          vocab=129280, heads=128, head_dim=512, q_lora=1536, o_lora=1024, o_groups=16,
                          index_heads=64, index_head_dim=128, index_topk=1024, rope_dim=64, routed_scaling=2.5,
                          compress_ratios=(128, 128) + flash_ratios(61)[2:], shards=64, shard_layout="release",
                          extreme_scales=False),
    # Variants (tests/targets/test_variants.py). V4-Flash is "tiny".
    # V4-Pro expert geometry (H=7168, I=3072) with 2 experts, 1 layer: ~130 MB in, ~330 MB of BF16 out.
    "pro-geometry": FixtureSpec(hidden=_PRO.hidden_size, inter=_PRO.moe_intermediate_size,
                                experts=2, top_k=2, layers=1, hash_layers=1, mtp=0, vocab=64, heads=2, head_dim=64,
                                q_lora=64, o_lora=64, shards=3, extreme_scales=False),
    # Base: FP8 E4M3 experts with F32 128x128 scales, F32 linear scales, no expert_dtype in config.json.
    "base": FixtureSpec(expert_dtype="fp8", linear_scales="f32"),
    # 0731/DSpark: three MTP blocks mtp.0..2 with routed experts and the DSpark extra tensors.
    "dspark": FixtureSpec(mtp=3, dspark=True),
    # V4.1: deepseek_v41, text_config, expert_dtype in quantization_config, 32x32 blocks, extra tensors.
    "v4.1": FixtureSpec(dialect="v4.1", linear_block=32, extra_tensors=True),
    # fp8_block lossy: per-32 scale bytes of an expert matrix span 20 steps (> 14), so some tiles are inexact.
    "lossy-fp8": FixtureSpec(layers=2, mtp=0, experts=4, extreme_scales=False, scale_span=20),
}

# Kinds of data (fixtures._make) -> safetensors dtype; "norm" is BF16 around 1, as trained RMSNorm weights are.
ST_DTYPE = {"bf16": "BF16", "norm": "BF16", "f32": "F32", "fp8": "F8_E4M3", "e8m0": "F8_E8M0", "fp4": "I8",
            "tid2eid": "I64", "f32scale": "F32", "fp4scale": "F8_E8M0"}


def config_block(spec: FixtureSpec) -> int:
    """quantization_config.weight_block_size (both sides): 128 for V4, 32 for V4.1."""
    return BLOCK if spec.dialect == "v4" else 32


def tensors(spec: FixtureSpec) -> dict[str, tuple]:
    """name -> (kind, shape, extra); `extra` of an FP4 expert scale is (block, expert, leg)."""
    h, v = spec.hidden, spec.vocab
    t: dict[str, tuple] = {}
    lb = spec.linear_block or BLOCK

    def fp8(name, out, inp):
        t[f"{name}.weight"] = ("fp8", (out, inp), None)
        t[f"{name}.scale"] = ("e8m0" if spec.linear_scales == "e8m0" else "f32scale",
                              (math.ceil(out / lb), math.ceil(inp / lb)), None)

    t["embed.weight"] = ("bf16", (v, h), None)
    for li in range(spec.layers):
        _block(spec, t, fp8, f"layers.{li}", li < spec.hash_layers, spec.ratio(li))
        if spec.extra_tensors:
            _extra_layer(spec, t, fp8, li)
    for k in range(spec.mtp):
        _mtp(spec, t, fp8, k)
    if spec.extra_tensors:
        t["vision.patch_embed.weight"] = ("bf16", (spec.head_dim, 3 * 14 * 14), None)
        t["vision.blocks.0.attn.qkv.weight"] = ("bf16", (3 * spec.head_dim, spec.head_dim), None)
        t["vision.blocks.0.norm1.weight"] = ("bf16", (spec.head_dim,), None)
        t["aligner.proj.weight"] = ("bf16", (h, spec.head_dim), None)
    t["norm.weight"] = ("norm", (h,), None)
    t["head.weight"] = ("bf16", (v, h), None)
    _hc_head(spec, t, "")
    return t


def _hc_head(spec, t, p):
    t[f"{p}hc_head_fn"] = ("f32", (HC, HC * spec.hidden), None)
    t[f"{p}hc_head_base"] = ("f32", (HC,), None)
    t[f"{p}hc_head_scale"] = ("f32", (1,), None)


def _attention(spec, t, fp8, a, ratio):
    h, hd = spec.hidden, spec.head_dim
    fp8(f"{a}.wq_a", spec.q_lora, h)
    t[f"{a}.q_norm.weight"] = ("norm", (spec.q_lora,), None)
    fp8(f"{a}.wq_b", spec.heads * hd, spec.q_lora)
    fp8(f"{a}.wkv", hd, h)
    t[f"{a}.kv_norm.weight"] = ("norm", (hd,), None)
    fp8(f"{a}.wo_a", spec.o_groups * spec.o_lora, spec.heads * hd // spec.o_groups)
    fp8(f"{a}.wo_b", h, spec.o_groups * spec.o_lora)
    t[f"{a}.attn_sink"] = ("f32", (spec.heads,), None)
    if ratio:
        _compressor(spec, t, f"{a}.compressor", ratio, hd)
    if ratio == 4:
        fp8(f"{a}.indexer.wq_b", spec.index_heads * spec.index_head_dim, spec.q_lora)
        t[f"{a}.indexer.weights_proj.weight"] = ("bf16", (spec.index_heads, h), None)
        _compressor(spec, t, f"{a}.indexer.compressor", 4, spec.index_head_dim)


def _compressor(spec, t, c, ratio, dim):
    """Ratio 4 overlaps windows: two `dim`-wide streams (wkv/wgate/ape rows 2*dim); 128 has one."""
    width = 2 * dim if ratio == 4 else dim
    t[f"{c}.wkv.weight"] = ("bf16", (width, spec.hidden), None)
    t[f"{c}.wgate.weight"] = ("bf16", (width, spec.hidden), None)
    t[f"{c}.ape"] = ("f32", (ratio, width), None)
    t[f"{c}.norm.weight"] = ("norm", (dim,), None)


def _block(spec, t, fp8, prefix, hashed, ratio):
    h, i, e = spec.hidden, spec.inter, spec.experts
    t[f"{prefix}.attn_norm.weight"] = ("norm", (h,), None)
    t[f"{prefix}.ffn_norm.weight"] = ("norm", (h,), None)
    for part in ("attn", "ffn"):
        t[f"{prefix}.hc_{part}_fn"] = ("f32", ((2 + HC) * HC, HC * h), None)
        t[f"{prefix}.hc_{part}_base"] = ("f32", ((2 + HC) * HC,), None)
        t[f"{prefix}.hc_{part}_scale"] = ("f32", (3,), None)
    _attention(spec, t, fp8, f"{prefix}.attn", ratio)
    f = f"{prefix}.ffn"
    t[f"{f}.gate.weight"] = ("bf16", (e, h), None)
    if hashed:
        t[f"{f}.gate.tid2eid"] = ("tid2eid", (spec.vocab, spec.top_k), None)
    else:
        t[f"{f}.gate.bias"] = ("f32", (e,), None)
    fp8(f"{f}.shared_experts.w1", i, h)
    fp8(f"{f}.shared_experts.w3", i, h)
    fp8(f"{f}.shared_experts.w2", h, i)
    eb = config_block(spec)
    for j in range(e):
        for leg in EXPERT_LEGS:
            out, inp = (h, i) if leg == "w2" else (i, h)
            name = f"{f}.experts.{j}.{leg}"
            if spec.expert_dtype == "fp4":
                t[f"{name}.weight"] = ("fp4", (out, inp // 2), None)
                t[f"{name}.scale"] = ("fp4scale", (out, inp // FP4_GROUP), (prefix, j, leg))
            else:
                t[f"{name}.weight"] = ("fp8", (out, inp), None)
                t[f"{name}.scale"] = ("f32scale", (math.ceil(out / eb), math.ceil(inp / eb)), None)


def _mtp(spec, t, fp8, k):
    h, v, p = spec.hidden, spec.vocab, f"mtp.{k}"
    _block(spec, t, fp8, p, False, 0)
    if not spec.dspark:
        fp8(f"{p}.e_proj", h, h)
        fp8(f"{p}.h_proj", h, h)
        for norm in ("enorm", "hnorm", "norm"):
            t[f"{p}.{norm}.weight"] = ("norm", (h,), None)
        _hc_head(spec, t, f"{p}.")
        return
    if k == 0:
        fp8(f"{p}.main_proj", h, 3 * h)  # three target layers' hidden states, concatenated
        t[f"{p}.main_norm.weight"] = ("norm", (h,), None)
    if k == spec.mtp - 1:
        t[f"{p}.norm.weight"] = ("norm", (h,), None)
        t[f"{p}.markov_head.embed.weight"] = ("bf16", (v, spec.head_dim), None)
        t[f"{p}.markov_head.head.weight"] = ("bf16", (v, spec.head_dim), None)
        t[f"{p}.confidence_head.proj.weight"] = ("bf16", (1, h + spec.head_dim), None)
        _hc_head(spec, t, f"{p}.")


def _extra_layer(spec, t, fp8, li):
    """V4.1's extra non-expert tensors: engram on the first two layers, an indexer k_norm (and the indexer where
    the schedule has none) on odd layers."""
    h, hd = spec.hidden, spec.head_dim
    if li < 2:
        fp8(f"layers.{li}.engram.wkv", hd, h)
        t[f"layers.{li}.engram.embed.weight"] = ("bf16", (spec.vocab, hd), None)
        t[f"layers.{li}.engram.q_weight"] = ("bf16", (hd, h), None)
        t[f"layers.{li}.engram.k_weight"] = ("bf16", (hd, h), None)
    if li % 2 == 1:
        if f"layers.{li}.attn.indexer.wq_b.weight" not in t:
            fp8(f"layers.{li}.attn.indexer.wq_b", spec.index_heads * spec.index_head_dim, spec.q_lora)
            t[f"layers.{li}.attn.indexer.weights_proj.weight"] = ("bf16", (spec.index_heads, h), None)
        t[f"layers.{li}.attn.indexer.k_norm.weight"] = ("norm", (spec.index_head_dim,), None)


def shard_groups(spec: FixtureSpec, table: dict[str, tuple]) -> list[list[str]]:
    """Tensor names per shard, in file order. "release": embed, then one shard per main layer, then head, norm and
    hc_head (and any tensor outside a block), then one shard per MTP block, as V4-Flash and V4-Pro ship.
    "balanced": size-balanced groups, then one more cut in the middle of layer 1's experts so they straddle two
    shards."""
    names = sorted(table, key=natural_key)
    if spec.shard_layout == "release":
        groups: list[list[str]] = [[] for _ in range(spec.layers + 2 + spec.mtp)]
        for n in names:
            head, _, rest = n.partition(".")
            idx = rest.split(".", 1)[0]
            if n == "embed.weight":
                groups[0].append(n)
            elif head == "layers" and idx.isdigit():
                groups[1 + int(idx)].append(n)
            elif head == "mtp" and idx.isdigit():
                groups[spec.layers + 2 + int(idx)].append(n)
            else:
                groups[spec.layers + 1].append(n)
        return groups
    sizes = [nbytes(table[n]) for n in names]
    per_shard = math.ceil(sum(sizes) / max(1, spec.shards - 1))
    groups = [[]]
    acc = 0
    for n, size in zip(names, sizes):
        if acc >= per_shard and len(groups) < spec.shards - 1:
            groups.append([])
            acc = 0
        groups[-1].append(n)
        acc += size
    cut = expert_name(f"layers.{min(1, spec.layers - 1)}", spec.experts // 2, "w1", "weight")
    for k, group in enumerate(groups):
        if cut in group and group.index(cut) > 0:
            at = group.index(cut)
            groups[k:k + 1] = [group[:at], group[at:]]
            break
    return groups


def nbytes(entry: tuple) -> int:
    return PlannedTensor("", ST_DTYPE[entry[0]], entry[1]).nbytes


def shard_name(k: int, total: int) -> str:
    return f"model-{k + 1:05d}-of-{total:05d}.safetensors"


def inventory(spec: FixtureSpec) -> list[tuple[str, str, tuple[int, ...], str]]:
    """(name, safetensors dtype, shape, shard file) of every tensor the checkpoint of `spec` holds, by shard."""
    table = tensors(spec)
    groups = shard_groups(spec, table)
    return [(n, ST_DTYPE[table[n][0]], table[n][1], shard_name(k, len(groups)))
            for k, group in enumerate(groups) for n in group]
