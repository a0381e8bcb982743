"""Read one block's and one rank's kernel-ready tensors straight to a device and rebuild the object
FlashInfer's preprocess returned for them."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from ..files.output.folder import output_tensor_facts, read_output_tensors
from ..files.output.manifest import read_manifest
from ..kernels import BY_NAME
from ..numerics.structure import structure_problem, tensor_names, unflatten
from ..records import Manifest


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
    structure = m.layer_record(layer, rank).structure
    kernel = BY_NAME.get(m.target.name)
    if kernel is None or kernel.kernel_name != m.target.kernel_name:
        raise m.damaged(f"target {str(m.target.name)[:80]!r} with kernel {str(m.target.kernel_name)[:80]!r} "
                        "is not a kernel of this fimoe-convert (`fimoe-convert targets`)")
    bad = structure_problem(structure, kernel.structure_classes)
    if bad is None:  # as verify checks it: against the shard headers, before a byte of a tensor is read
        names = list(dict.fromkeys(tensor_names(structure)))  # each tensor read once, however often it is named
        facts = output_tensor_facts(m.out_dir, names)
        unlisted = sorted({rel for rel, _ in facts[2].values()} - set(m.files))
        bad = (f"the index places its tensors in {unlisted[0]!r}, which the manifest does not list (verify refuses "
               "it too)" if unlisted else structure_problem(structure, kernel.structure_classes, *facts))
    if bad:
        raise m.damaged(f"block {layer!r} rank {rank}: {bad}")
    tensors = read_output_tensors(m.out_dir, names, device=device)
    try:
        return unflatten(structure, tensors, structure_classes(kernel))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise m.damaged(f"the structure of {layer!r} rank {rank} cannot be rebuilt "
                        f"({e.__class__.__name__}: {e})") from None


def structure_classes(kernel) -> dict[str, type]:
    """The dataclasses the kernel table declares for `kernel`, imported by those exact names (from the table in
    code, never from a file); refused when the installed FlashInfer's class has other fields."""
    import dataclasses
    import importlib

    found = {}
    for name, fields in kernel.structure_classes.items():
        module, qualname = name.split(":")
        try:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError) as e:
            raise InputError(f"{name}: the installed FlashInfer lacks this class ({e}); install the flashinfer-python "
                             "version the output was converted with (fimoe-manifest.json, tool.flashinfer)") from None
        have = {f.name for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else set()
        if have != set(fields):
            raise InputError(f"{name}: the installed FlashInfer's class has the fields {sorted(have)}, the output was "
                             f"written for {sorted(fields)}; install the flashinfer-python version it was converted "
                             "with (fimoe-manifest.json, tool.flashinfer)")
        found[name] = cls
    return found


def load_megamoe_weights(out_dir: str | Path | Manifest, layer: str, rank: int = 0, device: str = "cpu"
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(l1, l2, l1_global_scales, l2_global_scales) for `flashinfer.megamoe.mxfp4_mega_moe`."""
    m = as_manifest(out_dir)
    if m.target.runtime_module != "flashinfer.megamoe":
        raise InputError(f"{m.out_dir}: converted for {m.target.name!r}, not for flashinfer.megamoe; "
                         "convert with --target megamoe_sm90_mxfp4")
    return load_transformed_weights(m, layer, rank, device)
