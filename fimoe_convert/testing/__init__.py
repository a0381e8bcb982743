"""Checkpoints for tests, the demo, benchmarks and engine tests: `fixtures.make_checkpoint` is the one generator
(real-format DeepSeek V4 checkpoints, the release's tensor inventory for any geometry, `inventory.py`), no model
library needed; `transformers_model` loads a checkpoint in transformers and computes its logits (the real client of
the dense outputs)."""

from .fixtures import fixture_spec, folder_bytes, fresh_folder, make_checkpoint, seed_hub_cache
from .inventory import PRESETS, FixtureSpec, inventory

__all__ = ["PRESETS", "FixtureSpec", "fixture_spec", "folder_bytes", "fresh_folder", "inventory", "make_checkpoint",
           "seed_hub_cache"]
