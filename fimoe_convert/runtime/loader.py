"""Read one block's and one rank's kernel-ready tensors straight to a device and rebuild the object
FlashInfer's preprocess returned for them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from ..files.output import MANIFEST_NAME, read_manifest, read_output_tensors
from ..numerics.structure import tensor_names, unflatten


@dataclass(frozen=True)
class Manifest:
    out_dir: Path
    data: dict

    @property
    def target(self) -> dict:
        return self.data["target"]

    @property
    def ep_size(self) -> int:
        return self.data["ep"]["world_size"]

    def block(self, layer: str, rank: int) -> dict:
        layers = self.data.get("layers", {})
        if layer not in layers:
            known = ", ".join(list(layers)[:6])
            raise InputError(f"{self.out_dir}: no MoE block {layer!r} in this output; blocks are {known}, ...")
        ranks = layers[layer]
        if str(rank) not in ranks:
            raise InputError(f"{self.out_dir}: rank {rank} not in this output, which was sharded for "
                             f"--ep-size {self.ep_size} (ranks 0..{self.ep_size - 1})")
        rec = ranks[str(rank)]
        if not isinstance(rec, dict) or not isinstance(rec.get("structure"), dict):
            raise self.damaged(f"layers[{layer!r}][{str(rank)!r}] has no structure object")
        return rec

    def damaged(self, what: str) -> InputError:
        return InputError(f"{self.out_dir / MANIFEST_NAME}: {what}; the manifest is damaged: convert into "
                          f"{self.out_dir} again with --overwrite")


def load_manifest(out_dir: str | Path) -> Manifest:
    """The manifest of a complete output (refuses an incomplete or unknown-schema one)."""
    return Manifest(Path(out_dir), read_manifest(Path(out_dir), require_complete=True))


def _as_manifest(m: Manifest | str | Path) -> Manifest:
    return m if isinstance(m, Manifest) else load_manifest(m)


def load_transformed_weights(out_dir: str | Path | Manifest, layer: str, rank: int = 0, device: str = "cpu"):
    """The object the target's FlashInfer preprocess returns for block `layer` ("layers.3", "mtp.0")
    and EP rank `rank`, read from the output (only that block's and rank's bytes) onto `device`."""
    m = _as_manifest(out_dir)
    if m.target.get("kernel_name") is None:
        raise InputError(f"{m.out_dir}: target {m.target['name']!r} has no kernel-ready weights to load; "
                         "convert with a FlashInfer target (fimoe-convert targets)")
    structure = m.block(layer, rank)["structure"]
    try:
        names = tensor_names(structure)
    except (KeyError, TypeError, AttributeError, RecursionError) as e:
        raise m.damaged(f"the structure of {layer!r} rank {rank} is not one fimoe-convert writes "
                        f"({e.__class__.__name__}: {e})") from None
    tensors = read_output_tensors(m.out_dir, names, device=device)
    try:
        return unflatten(structure, tensors)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError, ImportError) as e:
        raise m.damaged(f"the structure of {layer!r} rank {rank} cannot be rebuilt "
                        f"({e.__class__.__name__}: {e})") from None


def load_megamoe_weights(out_dir: str | Path | Manifest, layer: str, rank: int = 0, device: str = "cpu"
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(l1, l2, l1_global_scales, l2_global_scales) for `flashinfer.megamoe.mxfp4_mega_moe`."""
    m = _as_manifest(out_dir)
    if m.target.get("runtime_module") != "flashinfer.megamoe":
        raise InputError(f"{m.out_dir}: converted for {m.target['name']!r}, not for flashinfer.megamoe; "
                         "convert with --target megamoe_sm90_mxfp4")
    return load_transformed_weights(m, layer, rank, device)
