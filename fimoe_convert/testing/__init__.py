"""Checkpoints for tests, the demo and benchmarks: `fixtures` writes real-format tiny (and sparse full-size)
DeepSeek V4 checkpoints without any model library; `transformers_model` writes a tiny model that transformers
itself made, in the release format, and computes its logits (the real client of the dense outputs)."""

from .fixtures import PRESETS, FixtureSpec, folder_bytes, fresh_folder, make_checkpoint, seed_hub_cache

__all__ = ["PRESETS", "FixtureSpec", "folder_bytes", "fresh_folder", "make_checkpoint", "seed_hub_cache"]
