"""Real-format tiny DeepSeek V4 checkpoints for tests, the demo and benchmarks.

Every tensor class of a V4 checkpoint with its real dtype: BF16 embed/head/norms/gate, F8_E4M3 +
F8_E8M0 128x128-block attention and shared experts, F32 hyper-connection, bias and sink tensors,
I64 `tid2eid` in hash layers, I8 + F8_E8M0 routed experts, MTP blocks with routed experts. Experts
of one layer straddle two shards and tensors sit in non-sorted order inside each shard.
Presets and FixtureSpec options also give the variants: V4-Pro geometry, Base (FP8 experts), 0731/DSpark
(three MTP blocks), V4.1 (its config dialect, 32x32 blocks, extra tensors) and a fixture lossy in fp8_block.
Deterministic: every tensor comes from its own generator seeded by (seed, name)."""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint import EXPERT_LEGS, VARIANTS, expert_name, natural_key
from ..dtypes import FP4_GROUP
from ..files.atomic import atomic_write_bytes
from ..files.names import INDEX_NAME
from ..files.st_header import PlannedTensor, build_header
from ..files.st_writer import ShardWriter

BLOCK = 128  # FP8 block size of attention and shared-expert weights
HC = 4  # hyper-connection copies
SCALE_SPAN = 8  # scale bytes of one expert's gate+up (and of its down) lie within this many steps


@dataclass(frozen=True)
class FixtureSpec:
    hidden: int = 256
    inter: int = 128
    experts: int = 8
    top_k: int = 2
    layers: int = 3
    hash_layers: int = 1
    mtp: int = 1
    vocab: int = 128
    heads: int = 4
    head_dim: int = 64
    q_lora: int = 128
    o_lora: int = 128
    shards: int = 4
    seed: int = 0
    extreme_scales: bool = True  # layer 0 expert 0 uses scale bytes 1..9, expert 1 uses 246..254
    expert_dtype: str = "fp4"  # "fp4" | "fp8" (Base checkpoints)
    dialect: str = "v4"  # "v4" | "v4.1"
    # Variant options (the defaults give the same bytes as before they existed):
    scale_span: int = SCALE_SPAN  # FP4 scale bytes of an expert matrix span this many steps (> 14: fp8_block lossy)
    linear_scales: str = "e8m0"  # scales of FP8 attention/shared-expert weights: "e8m0" | "f32" (Base checkpoints)
    linear_block: int | None = None  # tile of FP8 attention/shared-expert weights (None: 128; V4.1: 32)
    expert_dtype_in_config: bool | None = None  # None: for FP4 only (V4), always (V4.1); True/False: always/never
    dspark: bool = False  # 0731/DSpark MTP blocks: main_proj/main_norm, markov/confidence heads, no e_proj/h_proj
    extra_tensors: bool = False  # more non-expert tensors (engram, indexer, vision tower), copied untouched


PRESETS: dict[str, FixtureSpec] = {
    "tiny": FixtureSpec(),
    # V4-Flash expert geometry with few experts and layers: 5 MoE blocks x 16 experts, ~4 GB of BF16 out.
    "flash-geometry": FixtureSpec(hidden=VARIANTS["V4-Flash"].hidden_size,
                                  inter=VARIANTS["V4-Flash"].moe_intermediate_size,
                                  experts=16, top_k=6, layers=4, hash_layers=1, mtp=1,
                                  vocab=1024, heads=8, head_dim=128, q_lora=512, o_lora=512, shards=6,
                                  extreme_scales=False),
    # The published geometries (checkpoint.VARIANTS) at full size: with make_checkpoint(..., sparse=True) only.
    "v4-flash": FixtureSpec(hidden=4096, inter=2048, experts=256, top_k=6, layers=43, hash_layers=3, mtp=1,
                            vocab=129280, heads=64, head_dim=512, q_lora=1024, o_lora=1024, shards=46,
                            extreme_scales=False),
    "v4-pro": FixtureSpec(hidden=7168, inter=3072, experts=384, top_k=6, layers=61, hash_layers=3, mtp=1,
                          vocab=129280, heads=128, head_dim=512, q_lora=1536, o_lora=1024, shards=64,
                          extreme_scales=False),
    # Variants (tests/targets/test_variants.py). V4-Flash is "tiny".
    # V4-Pro expert geometry (H=7168, I=3072) with 2 experts, 1 layer: ~130 MB in, ~330 MB of BF16 out.
    "pro-geometry": FixtureSpec(hidden=VARIANTS["V4-Pro"].hidden_size, inter=VARIANTS["V4-Pro"].moe_intermediate_size,
                                experts=2, top_k=2, layers=1, hash_layers=1, mtp=0,
                                vocab=64, heads=2, head_dim=64, q_lora=64, o_lora=64, shards=3, extreme_scales=False),
    # Base: FP8 E4M3 experts with F32 128x128 scales, F32 linear scales, no expert_dtype in config.json.
    "base": FixtureSpec(expert_dtype="fp8", linear_scales="f32"),
    # 0731/DSpark: three MTP blocks mtp.0..2 with routed experts and the DSpark extra tensors.
    "dspark": FixtureSpec(mtp=3, dspark=True),
    # V4.1: deepseek_v41, text_config, expert_dtype in quantization_config, 32x32 blocks, extra tensors.
    "v4.1": FixtureSpec(dialect="v4.1", linear_block=32, extra_tensors=True),
    # fp8_block lossy: per-32 scale bytes of an expert matrix span 20 steps (> 14), so some tiles are inexact.
    "lossy-fp8": FixtureSpec(layers=2, mtp=0, experts=4, extreme_scales=False, scale_span=20),
}


def _gen(spec: FixtureSpec, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(spec.seed * 1_000_003 + zlib.crc32(name.encode()))


def _bf16(g, shape):
    return (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)


def _f32(g, shape):
    return torch.randn(shape, generator=g, dtype=torch.float32)


def _fp8_bytes(g, shape):
    b = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    b[(b & 0x7F) == 0x7F] = 0x3C  # keep clear of E4M3 NaN codes
    return b.view(torch.float8_e4m3fn)


def _e8m0(g, shape, lo=115, hi=125):
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def _expert_scale_range(spec: FixtureSpec, block: str, expert: int, leg: str) -> tuple[int, int]:
    """Scale bytes [lo, hi] of one expert matrix: within spec.scale_span, gate and up sharing a window."""
    span = spec.scale_span
    if spec.extreme_scales and block == "layers.0" and expert in (0, 1):
        return (1, 1 + span) if expert == 0 else (254 - span, 254)
    g = torch.Generator().manual_seed(spec.seed * 7919 + zlib.crc32(f"{block}.{expert}.{leg == 'w2'}".encode()))
    base = int(torch.randint(110, 121, (1,), generator=g))
    return base, base + span


def _config_block(spec: FixtureSpec) -> int:
    """quantization_config.weight_block_size (both sides): 128 for V4, 32 for V4.1."""
    return BLOCK if spec.dialect == "v4" else 32


def _fp8(t: dict, spec: FixtureSpec, name: str, out: int, inp: int) -> None:
    """An FP8 linear: weight and its tile scales (E8M0 or F32)."""
    lb = spec.linear_block or BLOCK
    t[f"{name}.weight"] = ("fp8", (out, inp), None)
    t[f"{name}.scale"] = ("e8m0" if spec.linear_scales == "e8m0" else "f32scale",
                          (math.ceil(out / lb), math.ceil(inp / lb)), None)


def _block(t: dict, spec: FixtureSpec, prefix: str, hashed: bool, compressor: bool) -> None:
    """One transformer block's tensors (attention, router, shared and routed experts), in checkpoint order."""
    h, i, e, v = spec.hidden, spec.inter, spec.experts, spec.vocab
    eb = _config_block(spec)
    t[f"{prefix}.attn_norm.weight"] = ("bf16", (h,), None)
    t[f"{prefix}.ffn_norm.weight"] = ("bf16", (h,), None)
    for part in ("attn", "ffn"):
        t[f"{prefix}.hc_{part}_fn"] = ("f32", ((2 + HC) * HC, HC * h), None)
        t[f"{prefix}.hc_{part}_base"] = ("f32", ((2 + HC) * HC,), None)
        t[f"{prefix}.hc_{part}_scale"] = ("f32", (3,), None)
    a = f"{prefix}.attn"
    _fp8(t, spec, f"{a}.wq_a", spec.q_lora, h)
    t[f"{a}.q_norm.weight"] = ("bf16", (spec.q_lora,), None)
    _fp8(t, spec, f"{a}.wq_b", spec.heads * spec.head_dim, spec.q_lora)
    _fp8(t, spec, f"{a}.wkv", spec.head_dim, h)
    t[f"{a}.kv_norm.weight"] = ("bf16", (spec.head_dim,), None)
    _fp8(t, spec, f"{a}.wo_a", spec.o_lora, spec.heads * spec.head_dim)
    _fp8(t, spec, f"{a}.wo_b", h, spec.o_lora)
    t[f"{a}.attn_sink"] = ("f32", (spec.heads,), None)
    if compressor:
        t[f"{a}.compressor.wkv.weight"] = ("bf16", (2 * spec.head_dim, h), None)
        t[f"{a}.compressor.wgate.weight"] = ("bf16", (2 * spec.head_dim, h), None)
        t[f"{a}.compressor.ape"] = ("f32", (4, 2 * spec.head_dim), None)
        t[f"{a}.compressor.norm.weight"] = ("bf16", (spec.head_dim,), None)
    f = f"{prefix}.ffn"
    t[f"{f}.gate.weight"] = ("bf16", (e, h), None)
    if hashed:
        t[f"{f}.gate.tid2eid"] = ("tid2eid", (v, spec.top_k), None)
    else:
        t[f"{f}.gate.bias"] = ("f32", (e,), None)
    _fp8(t, spec, f"{f}.shared_experts.w1", i, h)
    _fp8(t, spec, f"{f}.shared_experts.w3", i, h)
    _fp8(t, spec, f"{f}.shared_experts.w2", h, i)
    for j in range(e):
        for leg in EXPERT_LEGS:
            out, inp = (h, i) if leg == "w2" else (i, h)
            name = f"{f}.experts.{j}.{leg}"
            if spec.expert_dtype == "fp4":
                t[f"{name}.weight"] = ("fp4", (out, inp // 2), None)
                t[f"{name}.scale"] = ("e8m0", (out, inp // FP4_GROUP), _expert_scale_range(spec, prefix, j, leg))
            else:
                t[f"{name}.weight"] = ("fp8", (out, inp), None)
                t[f"{name}.scale"] = ("f32scale", (math.ceil(out / eb), math.ceil(inp / eb)), None)


def _tensors(spec: FixtureSpec) -> dict[str, tuple]:
    """name -> (kind, shape, extra); data is made on demand by `_make`."""
    h, v = spec.hidden, spec.vocab
    t: dict[str, tuple] = {}

    def fp8(name, out, inp):
        _fp8(t, spec, name, out, inp)

    def block(prefix, hashed, compressor):
        _block(t, spec, prefix, hashed, compressor)

    t["embed.weight"] = ("bf16", (v, h), None)
    for li in range(spec.layers):
        block(f"layers.{li}", li < spec.hash_layers, compressor=li % 2 == 1)
        if spec.extra_tensors and li < 2:
            fp8(f"layers.{li}.engram.wkv", spec.head_dim, h)
            t[f"layers.{li}.engram.embed.weight"] = ("bf16", (v, spec.head_dim), None)
            t[f"layers.{li}.engram.q_weight"] = ("bf16", (spec.head_dim, h), None)
            t[f"layers.{li}.engram.k_weight"] = ("bf16", (spec.head_dim, h), None)
        if spec.extra_tensors and li % 2 == 1:
            fp8(f"layers.{li}.attn.indexer.wq_b", spec.heads * spec.head_dim, spec.q_lora)
            t[f"layers.{li}.attn.indexer.weights_proj.weight"] = ("bf16", (spec.heads, h), None)
            t[f"layers.{li}.attn.indexer.k_norm.weight"] = ("bf16", (spec.head_dim,), None)
    for k in range(spec.mtp):
        p = f"mtp.{k}"
        block(p, False, compressor=False)
        if spec.dspark:
            if k == 0:
                fp8(f"{p}.main_proj", h, 3 * h)  # three target layers' hidden states, concatenated
                t[f"{p}.main_norm.weight"] = ("bf16", (h,), None)
            if k == spec.mtp - 1:
                t[f"{p}.norm.weight"] = ("bf16", (h,), None)
                t[f"{p}.markov_head.embed.weight"] = ("bf16", (v, spec.head_dim), None)
                t[f"{p}.markov_head.head.weight"] = ("bf16", (v, spec.head_dim), None)
                t[f"{p}.confidence_head.proj.weight"] = ("bf16", (1, h + spec.head_dim), None)
                t[f"{p}.hc_head_fn"] = ("f32", (HC, HC * h), None)
                t[f"{p}.hc_head_base"] = ("f32", (HC,), None)
                t[f"{p}.hc_head_scale"] = ("f32", (1,), None)
            continue
        fp8(f"{p}.e_proj", h, h)
        fp8(f"{p}.h_proj", h, h)
        t[f"{p}.enorm.weight"] = ("bf16", (h,), None)
        t[f"{p}.hnorm.weight"] = ("bf16", (h,), None)
        t[f"{p}.norm.weight"] = ("bf16", (h,), None)
    if spec.extra_tensors:
        t["vision.patch_embed.weight"] = ("bf16", (spec.head_dim, 3 * 14 * 14), None)
        t["vision.blocks.0.attn.qkv.weight"] = ("bf16", (3 * spec.head_dim, spec.head_dim), None)
        t["vision.blocks.0.norm1.weight"] = ("bf16", (spec.head_dim,), None)
        t["aligner.proj.weight"] = ("bf16", (h, spec.head_dim), None)
    t["norm.weight"] = ("bf16", (h,), None)
    t["head.weight"] = ("bf16", (v, h), None)
    t["hc_head_fn"] = ("f32", (HC, HC * h), None)
    t["hc_head_base"] = ("f32", (HC,), None)
    t["hc_head_scale"] = ("f32", (1,), None)
    return t


_ST = {"bf16": "BF16", "f32": "F32", "fp8": "F8_E4M3", "e8m0": "F8_E8M0", "fp4": "I8", "tid2eid": "I64",
       "f32scale": "F32"}


POOL_BYTES = 64 * 2**20  # random bytes that `fast` fixtures take their FP4 codes from


def _pooled(spec: FixtureSpec, name: str, shape: tuple) -> torch.Tensor:
    """FP4 code bytes for `fast` fixtures: a window of one seeded random pool at an offset from the tensor's name
    (torch's generator makes about 100 MB/s here; a multi-GB benchmark fixture would take minutes)."""
    pool = _POOLS.get(spec.seed)
    if pool is None:
        pool = _POOLS[spec.seed] = torch.randint(0, 256, (2 * POOL_BYTES,), generator=_gen(spec, "pool"),
                                                 dtype=torch.uint8)
    n = math.prod(shape)
    if n > POOL_BYTES:
        return torch.randint(0, 256, shape, generator=_gen(spec, name), dtype=torch.uint8).view(torch.int8)
    at = zlib.crc32(name.encode()) % POOL_BYTES
    return pool[at:at + n].view(shape).view(torch.int8)


_POOLS: dict[int, torch.Tensor] = {}


def _make(spec: FixtureSpec, name: str, kind: str, shape: tuple, extra, fast: bool = False) -> torch.Tensor:
    if fast and kind == "fp4":
        return _pooled(spec, name, shape)
    g = _gen(spec, name)
    if kind == "bf16":
        return _bf16(g, shape)
    if kind in ("f32", "f32scale"):
        return _f32(g, shape).abs() * 1e-3 + (1e-4 if kind == "f32scale" else 0)
    if kind == "fp8":
        return _fp8_bytes(g, shape)
    if kind == "e8m0":
        lo, hi = extra or (115, 125)
        return _e8m0(g, shape, lo, hi)
    if kind == "fp4":  # every code 0..15 appears, -0 (code 8) included
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(torch.int8)
    if kind == "tid2eid":
        return torch.randint(0, spec.experts, shape, generator=g, dtype=torch.int64)
    raise AssertionError(kind)


def _config(spec: FixtureSpec) -> dict:
    quant = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
             "weight_block_size": [_config_block(spec)] * 2}
    text = {
        "hidden_size": spec.hidden, "moe_intermediate_size": spec.inter, "n_routed_experts": spec.experts,
        "n_shared_experts": 1, "num_experts_per_tok": spec.top_k, "num_hidden_layers": spec.layers,
        "num_hash_layers": spec.hash_layers, "num_nextn_predict_layers": spec.mtp, "vocab_size": spec.vocab,
        "num_attention_heads": spec.heads, "head_dim": spec.head_dim, "q_lora_rank": spec.q_lora,
        "o_lora_rank": spec.o_lora, "hc_mult": HC, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
    }
    if spec.dspark:
        text["dspark_target_layer_ids"] = [max(0, spec.layers - spec.mtp + k) for k in range(spec.mtp)]
    write = spec.expert_dtype_in_config
    if spec.dialect == "v4":
        cfg = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", **text,
               "quantization_config": quant}
        if write or (write is None and spec.expert_dtype == "fp4"):
            cfg["expert_dtype"] = spec.expert_dtype
        return cfg
    if write is not False:
        quant["expert_dtype"] = spec.expert_dtype
    cfg = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
           "text_config": {"model_type": "deepseek_v41_text", **text}, "quantization_config": quant}
    if spec.extra_tensors:
        cfg["vision_config"] = {"model_type": "deepseek_v41_vision", "hidden_size": spec.head_dim, "patch_size": 14}
    return cfg


def make_checkpoint(out_dir: str | Path, preset: str = "tiny", *, sparse: bool = False, fast: bool = False,
                    **overrides) -> Path:
    """Write a real-format DeepSeek V4 checkpoint into `out_dir`; returns the folder. `sparse`: every shard is its
    real header followed by a hole of the data's size (zeros, no disk used), for planning and dry runs at the
    published geometries (presets "v4-flash", "v4-pro") without hundreds of GB. `fast`: FP4 codes from a seeded
    random pool (benchmark fixtures of many GB, written at disk speed)."""
    spec = dataclasses.replace(PRESETS[preset], **overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(spec)
    names = sorted(tensors, key=natural_key)
    sizes = [PlannedTensor(n, _ST[tensors[n][0]], tensors[n][1]).nbytes for n in names]
    # Size-balanced groups, then one more cut in the middle of a layer's experts so they straddle two shards.
    per_shard = math.ceil(sum(sizes) / max(1, spec.shards - 1))
    groups: list[list[str]] = [[]]
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
    weight_map = {}
    total = 0
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        order = [group[p] for p in torch.randperm(len(group), generator=_gen(spec, fname)).tolist()]
        planned = [PlannedTensor(n, _ST[tensors[n][0]], tensors[n][1]) for n in order]
        if sparse:
            header = build_header(planned, None)
            with open(out / fname, "wb") as f:
                f.write(header)
                f.truncate(len(header) + sum(p.nbytes for p in planned))
            weight_map.update({n: fname for n in group})
            total += sum(p.nbytes for p in planned)
            continue
        with ShardWriter(out / fname, planned) as w:
            for p in planned:
                w.write_tensor(p.name, _make(spec, p.name, *tensors[p.name], fast=fast))
            w.finish()
        weight_map.update({n: fname for n in group})
        total += sum(p.nbytes for p in planned)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    atomic_write_bytes(out / INDEX_NAME, (json.dumps(index, indent=2) + "\n").encode())
    atomic_write_bytes(out / "config.json", (json.dumps(_config(spec), indent=2) + "\n").encode())
    atomic_write_bytes(out / "tokenizer.json", b'{"version": "1.0", "model": {"type": "BPE", "vocab": {}}}\n')
    atomic_write_bytes(out / "tokenizer_config.json", b'{"bos_token": "<s>", "eos_token": "</s>"}\n')
    atomic_write_bytes(out / "generation_config.json", b'{"temperature": 0.6, "top_p": 0.95}\n')
    return out


def seed_hub_cache(ckpt_dir: str | Path, cache_dir: str | Path, repo_id: str,
                   commit: str = "c0ffee" * 6 + "c0ff") -> Path:
    """Lay `ckpt_dir` out as a Hugging Face cache entry (blobs named by sha256, snapshot links, refs/main),
    so the real huggingface_hub code resolves `repo_id` offline. Returns the snapshot folder."""
    import hashlib
    import os

    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    blobs, snap = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for f in sorted(Path(ckpt_dir).iterdir()):
        data = f.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        (blobs / sha).write_bytes(data)
        link = snap / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(f"../../blobs/{sha}", link)
    return snap


def work_folder_problem(path: Path, ours: set[str]) -> str | None:
    """Why `path` may not be emptied as a work folder (`fresh_folder`), or None: only a new folder, an empty one or
    one holding nothing but the entries `ours` is taken."""
    if path.exists() and not path.is_dir():
        return f"{path}: is a file; expected a folder for the work (it is created if missing)"
    if path.is_dir() and not {p.name for p in path.iterdir()} <= ours:
        return (f"{path}: holds files other than an earlier demo's, and the folder is emptied first; choose a new or "
                "empty folder")
    return None


def fresh_folder(path: str | Path) -> Path:
    """`path` as an empty folder (what was there is deleted): for the demo and benchmarks' work folders."""
    import shutil

    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def folder_bytes(path: str | Path) -> int:
    """Bytes of the files directly in `path`."""
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())
