"""Real-format DeepSeek V4 checkpoints for tests, the demo, benchmarks and engine tests: the one generator.

The tensors are the release's for the geometry given (inventory.py), with the release dtypes: BF16 embed/head/norms/
gate/compressors, F8_E4M3 + F8_E8M0 128x128-block attention, indexer and shared experts, F32 hyper-connection, bias,
sink and ape tensors, I64 `tid2eid` in hash layers, I8 + F8_E8M0 routed experts, MTP blocks as released. "tiny" (the
demo and most tests) loads in transformers' DeepseekV4ForCausalLM; "v4-flash" and "v4-pro" (sparse) are the
releases' inventories and shards. In "balanced" fixtures the experts of one layer straddle two shards; tensors sit
in non-sorted order inside each shard. Presets and FixtureSpec options also give the variants: V4-Pro geometry,
Base (FP8 experts), 0731/DSpark (three MTP blocks), V4.1 (its config dialect, 32x32 blocks, extra tensors) and a
fixture lossy in fp8_block. Deterministic: every tensor comes from its own generator seeded by (seed, name)."""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from pathlib import Path

import torch

from ..files.names import INDEX_NAME
from ..files.output.atomic import atomic_write_bytes
from ..files.safetensors.header import PlannedTensor, build_header
from ..files.safetensors.writer import ShardWriter
from .inventory import (
    HC,
    PRESETS,
    ST_DTYPE,
    FixtureSpec,
    config_block,
    inventory,
    nbytes,
    shard_groups,
    shard_name,
    tensors,
)

__all__ = ["PRESETS", "FixtureSpec", "fixture_spec", "inventory", "make_checkpoint"]


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
    if kind == "norm":
        return (1 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16)
    if kind in ("f32", "f32scale"):
        return _f32(g, shape).abs() * 1e-3 + (1e-4 if kind == "f32scale" else 0)
    if kind == "fp8":
        return _fp8_bytes(g, shape)
    if kind == "e8m0":
        return _e8m0(g, shape)
    if kind == "fp4scale":
        return _e8m0(g, shape, *_expert_scale_range(spec, *extra))
    if kind == "fp4":  # every code 0..15 appears, -0 (code 8) included
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(torch.int8)
    if kind == "tid2eid":
        # The extreme-scale experts 0 and 1 of layer 0 (its values overflow BF16) are never routed to.
        low = 2 if spec.extreme_scales and name.startswith("layers.0.") and spec.experts > 2 + spec.top_k else 0
        return torch.randint(low, spec.experts, shape, generator=g, dtype=torch.int64)
    raise AssertionError(kind)


_ROPE_SCALING = {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                 "type": "yarn"}


def _config(spec: FixtureSpec) -> dict:
    """config.json with the release's keys (DeepSeek-V4-Flash's config.json) for the geometry of `spec`."""
    quant = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
             "weight_block_size": [config_block(spec)] * 2}
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "hc_eps": 1e-6,
        "hc_mult": HC, "hc_sinkhorn_iters": 20, "head_dim": spec.head_dim, "hidden_act": "silu",
        "hidden_size": spec.hidden, "index_head_dim": spec.index_head_dim, "index_n_heads": spec.index_heads,
        "index_topk": spec.index_topk, "initializer_range": 0.02, "max_position_embeddings": 1048576,
        "moe_intermediate_size": spec.inter, "n_routed_experts": spec.experts, "n_shared_experts": 1,
        "norm_topk_prob": True, "num_attention_heads": spec.heads, "num_experts_per_tok": spec.top_k,
        "num_hidden_layers": spec.layers, "num_hash_layers": spec.hash_layers, "num_key_value_heads": 1,
        "num_nextn_predict_layers": spec.mtp, "o_groups": spec.o_groups, "o_lora_rank": spec.o_lora,
        "q_lora_rank": spec.q_lora, "qk_rope_head_dim": spec.rope_dim, "rms_norm_eps": 1e-6,
        "rope_scaling": dict(_ROPE_SCALING), "rope_theta": 10000, "routed_scaling_factor": spec.routed_scaling,
        "scoring_func": "sqrtsoftplus", "sliding_window": 128, "swiglu_limit": 10.0, "tie_word_embeddings": False,
        "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": spec.vocab,
        "compress_rope_theta": 160000, "compress_ratios": spec.config_ratios(),
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


def fixture_spec(preset: str = "tiny", **overrides) -> FixtureSpec:
    """The spec `make_checkpoint(DIR, preset, **overrides)` writes."""
    if preset not in PRESETS:
        raise KeyError(f"preset {preset!r}: expected one of {', '.join(sorted(PRESETS))}")
    return dataclasses.replace(PRESETS[preset], **overrides)


def make_checkpoint(out_dir: str | Path, preset: str = "tiny", *, sparse: bool = False, fast: bool = False,
                    **overrides) -> Path:
    """Write a real-format DeepSeek V4 checkpoint into `out_dir`; returns the folder. `sparse`: every shard is its
    real header followed by a hole of the data's size (zeros, no disk used), for planning and dry runs at the
    released geometries (presets "v4-flash", "v4-pro") without hundreds of GB. `fast`: FP4 codes from a seeded
    random pool (benchmark fixtures of many GB, written at disk speed)."""
    spec = fixture_spec(preset, **overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = tensors(spec)
    groups = shard_groups(spec, table)
    weight_map = {}
    total = 0
    for k, group in enumerate(groups):
        fname = shard_name(k, len(groups))
        order = [group[p] for p in torch.randperm(len(group), generator=_gen(spec, fname)).tolist()]
        planned = [PlannedTensor(n, ST_DTYPE[table[n][0]], table[n][1]) for n in order]
        if sparse:
            header = build_header(planned, None)
            with open(out / fname, "wb") as f:
                f.write(header)
                f.truncate(len(header) + sum(p.nbytes for p in planned))
        else:
            with ShardWriter(out / fname, planned) as w:
                for p in planned:
                    w.write_tensor(p.name, _make(spec, p.name, *table[p.name], fast=fast))
                w.finish()
        weight_map.update({n: fname for n in group})
        total += sum(nbytes(table[n]) for n in group)
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
