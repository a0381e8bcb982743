"""A tiny random DeepSeek V4 made by transformers' own classes (`DeepseekV4Config`, `DeepseekV4ForCausalLM`), written
in DeepSeek's release format, and its logits as transformers computes them: the real client the outputs of the
dense targets are checked against (tests/engines/test_engines_transformers.py). Needs transformers >= 5.24 and
accelerate (the `test` extra); both are imported inside the functions.

Release format (what deepseek-ai/DeepSeek-V4-Flash ships; no `model.` prefix):
  embed.weight, head.weight, norm.weight                      BF16
  hc_head_{fn,base,scale}, layers.N.hc_{attn,ffn}_*           F32
  layers.N.attn.{wq_a,wq_b,wkv,wo_a,wo_b}, attn.indexer.wq_b,
  layers.N.ffn.shared_experts.w{1,2,3}, mtp.K.{e,h}_proj      F8_E4M3 `.weight` + F8_E8M0 `.scale` (128x128 tiles)
  layers.N.attn.compressor.*, indexer.weights_proj, norms,
  ffn.gate.weight                                             BF16
  attn_sink, compressor.ape, ffn.gate.bias                    F32; hash layers: ffn.gate.tid2eid I64
  layers.N.ffn.experts.E.w{1,2,3}.weight / .scale             I8 (two E2M1 codes, element 2i low) / F8_E8M0 [out, in/32]
  mtp.K.*: one more block (written from an extra decoder layer), e_proj/h_proj, enorm/hnorm/norm, hc_head_*
transformers maps these names back through its conversion mapping ("deepseek_v4") and its FP8 quantizer's
`.scale` -> `.weight_scale_inv`; it ignores `mtp.*`. Deterministic: seeded weights, fixed shard split. Shards are
written with the safetensors library (an independent writer from fimoe-convert's)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from ..checkpoint import natural_key
from ..dtypes import FP4_GROUP
from ..files.names import INDEX_NAME

BLOCK = 128  # FP8 tile of the dense linears (quantization_config.weight_block_size)
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX, E4M3_MAX = 6.0, 448.0  # largest magnitudes of the two formats

# Every FP8 dimension a multiple of 128, as in the release. Layers: 0 sliding, 1 CSA, 2 HCA, 3 CSA; 0 hash-routed.
GEOMETRY = dict(
    vocab_size=256, hidden_size=256, moe_intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=1, head_dim=128, q_lora_rank=128, o_groups=2, o_lora_rank=128,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, index_n_heads=2, index_head_dim=64,
    index_topk=8, sliding_window=128, hc_mult=4,
)
COMPRESS_RATIOS = [0, 4, 128, 4]
NUM_HASH_LAYERS = 1
MTP_LAYERS = 1
INPUT_TOKENS = 136  # > 128, so the HCA layer (ratio 128) compresses one entry and the CSA layers 34

# transformers' module name -> DeepSeek's, applied in order to the part after `model.layers.N.`
_LAYER_RENAMES = [
    (r"^self_attn\.compressor\.indexer\.q_b_proj\.", "attn.indexer.wq_b."),
    (r"^self_attn\.compressor\.indexer\.scorer\.weights_proj\.", "attn.indexer.weights_proj."),
    (r"^self_attn\.compressor\.indexer\.", "attn.indexer.compressor."),
    (r"^self_attn\.", "attn."),
    (r"^mlp\.", "ffn."),
    (r"^input_layernorm\.", "attn_norm."),
    (r"^post_attention_layernorm\.", "ffn_norm."),
    (r"^attn_hc\.(fn|base|scale)$", r"hc_attn_\1"),
    (r"^ffn_hc\.(fn|base|scale)$", r"hc_ffn_\1"),
    (r"\.sinks$", ".attn_sink"),
    (r"\.position_bias$", ".ape"),
    (r"\.q_a_proj\.", ".wq_a."),
    (r"\.q_b_proj\.", ".wq_b."),
    (r"\.q_a_norm\.", ".q_norm."),
    (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."),
    (r"(compressor)\.kv_proj\.", r"\1.wkv."),
    (r"(compressor)\.gate_proj\.", r"\1.wgate."),
    (r"(compressor)\.kv_norm\.", r"\1.norm."),
    (r"^attn\.kv_proj\.", "attn.wkv."),
    (r"\.gate\.e_score_correction_bias$", ".gate.bias"),
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."),
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),
    (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
]
_TOP = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
        "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
# Linears the release stores in FP8 E4M3 + E8M0 128x128; compressor wkv/wgate and indexer.weights_proj are BF16.
FP8_LINEAR = re.compile(r"\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123])\.weight$"
                        r"|^mtp\.\d+\.(e_proj|h_proj)\.weight$")
F32_TENSORS = re.compile(r"(hc_(attn|ffn|head)_(fn|base|scale)|\.attn_sink|\.ape|\.gate\.bias)$")


def release_name(hf_key: str, block: str | None = None) -> str:
    """`model.layers.3.self_attn.q_a_proj.weight` -> `layers.3.attn.wq_a.weight`; `block` renames the layer
    prefix (the MTP block is written from an extra decoder layer)."""
    if hf_key in _TOP:
        return _TOP[hf_key]
    m = re.match(r"^model\.layers\.(\d+)\.(.*)$", hf_key)
    if not m:
        raise KeyError(hf_key)
    rest = m[2]
    for pat, rep in _LAYER_RENAMES:
        rest = re.sub(pat, rep, rest)
    return f"{block or 'layers.' + m[1]}.{rest}"


def _pow2_scale_byte(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """E8M0 byte of the smallest power of two s with amax / s <= qmax."""
    e = torch.ceil(torch.log2(torch.clamp(amax / qmax, min=2.0 ** -126)))
    return (e + 127).clamp(1, 254).to(torch.uint8)


def quant_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (I8 [out, in/2] codes, element 2i in the low nibble; F8_E8M0 [out, in/32]), round to
    nearest: the source only has to be some valid release checkpoint."""
    out, inp = w.shape
    g = w.float().reshape(out, inp // FP4_GROUP, FP4_GROUP)
    sbyte = _pow2_scale_byte(g.abs().amax(-1), FP4_MAX)
    x = (g / torch.exp2(sbyte.float() - 127).unsqueeze(-1)).reshape(out, inp)
    idx = (x.abs().unsqueeze(-1) - torch.tensor(E2M1_MAGNITUDES)).abs().argmin(-1)
    codes = (idx | ((x < 0).long() << 3)).to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8), sbyte.view(torch.float8_e8m0fnu)


def quant_fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (F8_E4M3 [out, in], F8_E8M0 [ceil(out/128), ceil(in/128)])."""
    out, inp = w.shape
    ro, ri = math.ceil(out / BLOCK), math.ceil(inp / BLOCK)
    pad = torch.zeros(ro * BLOCK, ri * BLOCK)
    pad[:out, :inp] = w.float()
    t = pad.reshape(ro, BLOCK, ri, BLOCK)
    sbyte = _pow2_scale_byte(t.abs().amax((1, 3)), E4M3_MAX)
    q = (t / torch.exp2(sbyte.float() - 127)[:, None, :, None]).reshape(ro * BLOCK, ri * BLOCK)
    return q[:out, :inp].to(torch.float8_e4m3fn), sbyte.view(torch.float8_e8m0fnu)


def hf_config(**over):
    from transformers import DeepseekV4Config

    kw = dict(GEOMETRY, compress_ratios=COMPRESS_RATIOS, num_hash_layers=NUM_HASH_LAYERS,
              num_nextn_predict_layers=MTP_LAYERS)
    kw.update(over)
    return DeepseekV4Config(**kw)


def release_config() -> dict:
    """config.json the way the release writes it (legacy keys, expert_dtype at top level)."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        **GEOMETRY, "compress_ratios": COMPRESS_RATIOS, "num_hash_layers": NUM_HASH_LAYERS,
        "num_nextn_predict_layers": MTP_LAYERS, "qk_rope_head_dim": 16, "compress_rope_theta": 160000,
        "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                                               "original_max_position_embeddings": 65536},
        "max_position_embeddings": 1048576, "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5,
        "norm_topk_prob": True, "swiglu_limit": 10.0, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0,
        "eos_token_id": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "expert_dtype": "fp4",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [BLOCK, BLOCK]},
    }


def _random_state(seed: int) -> tuple[dict[str, torch.Tensor], int]:
    """transformers' model with one extra decoder layer (written as the MTP block), every float random (its init
    leaves sinks, biases and position_bias at zero), tid2eid random expert ids."""
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    n = GEOMETRY["num_hidden_layers"]
    cfg = hf_config(num_hidden_layers=n + MTP_LAYERS, compress_ratios=COMPRESS_RATIOS + [0] * MTP_LAYERS)
    g = torch.Generator().manual_seed(seed + 1)
    state = {}
    for k, v in DeepseekV4ForCausalLM(cfg).state_dict().items():
        if k.endswith("tid2eid"):
            v = torch.randint(0, cfg.n_routed_experts, v.shape, generator=g, dtype=torch.int64)
        elif v.is_floating_point():
            v = torch.randn(v.shape, generator=g) * (0.02 if v.dim() > 1 else 0.1) + float(k.endswith("norm.weight"))
        state[k] = v
    return state, n


def release_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of the release checkpoint, by DeepSeek name, with the release dtype."""
    state, n = _random_state(seed)
    inter = GEOMETRY["moe_intermediate_size"]
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        m = re.match(r"^model\.layers\.(\d+)\.", k)
        block = f"mtp.{int(m[1]) - n}" if m and int(m[1]) >= n else None
        if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            prefix = (block or f"layers.{m[1]}") + ".ffn.experts"
            for e in range(v.shape[0]):
                legs = {"w1": v[e, :inter], "w3": v[e, inter:]} if k.endswith("gate_up_proj") else {"w2": v[e]}
                for leg, w in legs.items():
                    out[f"{prefix}.{e}.{leg}.weight"], out[f"{prefix}.{e}.{leg}.scale"] = quant_fp4(w)
            continue
        name = release_name(k, block)
        if FP8_LINEAR.search(name):
            out[name], out[name.removesuffix(".weight") + ".scale"] = quant_fp8_block(v)
        elif k.endswith("tid2eid"):
            out[name] = v
        else:
            out[name] = v.float().contiguous() if F32_TENSORS.search(name) else v.to(torch.bfloat16).contiguous()
    out.update(_mtp_only(seed))
    return out


def _mtp_only(seed: int) -> dict[str, torch.Tensor]:
    """The tensors of an MTP block that no decoder layer has."""
    g = torch.Generator().manual_seed(seed + 2)
    h, hc = GEOMETRY["hidden_size"], GEOMETRY["hc_mult"]
    out = {}
    for b in range(MTP_LAYERS):
        p = f"mtp.{b}"
        for proj in ("e_proj", "h_proj"):
            out[f"{p}.{proj}.weight"], out[f"{p}.{proj}.scale"] = quant_fp8_block(torch.randn(h, h, generator=g) * 0.02)
        for norm in ("enorm", "hnorm", "norm"):
            out[f"{p}.{norm}.weight"] = (1 + 0.1 * torch.randn(h, generator=g)).to(torch.bfloat16)
        out[f"{p}.hc_head_fn"] = torch.randn(hc, hc * h, generator=g) * 0.02
        out[f"{p}.hc_head_base"] = torch.randn(hc, generator=g) * 0.1
        out[f"{p}.hc_head_scale"] = torch.randn(1, generator=g) * 0.1 + 1
    return out


def write_release_checkpoint(out_dir: str | Path, seed: int = 0, shards: int = 3) -> Path:
    """The tiny model in the release format in `out_dir` (shards, index, config.json); returns the folder."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = release_tensors(seed)
    names = sorted(tensors, key=natural_key)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i * per:(i + 1) * per]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(release_config(), indent=2) + "\n")
    (out / "generation_config.json").write_text('{"bos_token_id": 0, "eos_token_id": 1}\n')
    return out


def input_ids() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(2, GEOMETRY["vocab_size"], (1, INPUT_TOKENS), generator=g)


def load_logits(path: str | Path, **kw) -> tuple[torch.Tensor, dict]:
    """The logits of `input_ids()` from the checkpoint at `path`, loaded with `AutoModelForCausalLM.from_pretrained`
    as a user would, and transformers' loading info (missing and unexpected keys)."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True, **kw)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids()).logits
    info = {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in info.items()}
    info["quantizer"] = type(getattr(model, "hf_quantizer", None)).__name__
    return logits, info
