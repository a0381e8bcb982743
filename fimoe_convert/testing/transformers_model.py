"""The logits transformers computes for a checkpoint, loaded as a user would: the real client the dense outputs are
checked against (tests/engines). The checkpoints come from `fixtures.make_checkpoint` (preset "tiny", the one the
demo uses), which transformers' DeepseekV4ForCausalLM loads with no missing or unexpected key: it maps DeepSeek's
names through its conversion mapping ("deepseek_v4") and `.scale` -> `.weight_scale_inv`, and ignores `mtp.*`.
Needs transformers >= 5.20 and accelerate (the `test` extra); both are imported inside the functions."""

from __future__ import annotations

from pathlib import Path

import torch

INPUT_TOKENS = 136  # > 128, so the HCA layer (ratio 128) compresses one entry and the CSA layer 34


def input_ids(vocab: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(2, vocab, (1, INPUT_TOKENS), generator=g)


def load_logits(path: str | Path, **kw) -> tuple[torch.Tensor, dict]:
    """The logits of `input_ids()` from the checkpoint at `path`, loaded with `AutoModelForCausalLM.from_pretrained`
    as a user would, and transformers' loading info (missing and unexpected keys)."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True, **kw)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids(model.config.vocab_size)).logits
    info = {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in info.items()}
    info["quantizer"] = type(getattr(model, "hf_quantizer", None)).__name__
    return logits, info
