"""Read one block's and one rank's kernel-ready tensors straight to a device and rebuild the object
FlashInfer's preprocess returned for them."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from ..files.manifest import Manifest, read_manifest
from ..files.output import read_output_tensors
from ..numerics.structure import tensor_names, unflatten


def load_manifest(out_dir: str | Path) -> Manifest:
    """The manifest of a complete output (refuses an incomplete or unknown-schema one)."""
    return read_manifest(Path(out_dir), require_complete=True)


def as_manifest(m: Manifest | dict | str | Path) -> Manifest:
    """A manifest given as itself, as its JSON (checked), or as the output folder that holds it."""
    if isinstance(m, Manifest):
        return m
    if isinstance(m, dict):
        manifest = Manifest.from_json(m, "manifest")
        manifest.out_dir = Path(".")
        return manifest
    return load_manifest(m)


def load_transformed_weights(out_dir: str | Path | Manifest, layer: str, rank: int = 0, device: str = "cpu"):
    """The object the target's FlashInfer preprocess returns for block `layer` ("layers.3", "mtp.0")
    and EP rank `rank`, read from the output (only that block's and rank's bytes) onto `device`."""
    m = as_manifest(out_dir)
    if m.target.kernel_name is None:
        raise InputError(f"{m.out_dir}: target {m.target.name!r} has no kernel-ready weights to load; "
                         "convert with a FlashInfer target (fimoe-convert targets)")
    structure = m.layer_record(layer, rank)["structure"]
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
    m = as_manifest(out_dir)
    if m.target.runtime_module != "flashinfer.megamoe":
        raise InputError(f"{m.out_dir}: converted for {m.target.name!r}, not for flashinfer.megamoe; "
                         "convert with --target megamoe_sm90_mxfp4")
    return load_transformed_weights(m, layer, rank, device)
