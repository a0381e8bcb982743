"""Read one block's and one rank's kernel-ready tensors straight to a device and rebuild the object
FlashInfer's preprocess returned for them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from ..files.output import MANIFEST_NAME, read_manifest, read_output_tensors
from ..kernels import BY_NAME
from ..numerics.structure import structure_problem, tensor_names, unflatten


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
    kernel = BY_NAME.get(m.target["name"])
    if kernel is None or kernel.kernel_name != m.target.get("kernel_name"):
        raise m.damaged(f"target {str(m.target['name'])[:80]!r} with kernel {str(m.target.get('kernel_name'))[:80]!r} "
                        "is not a kernel of this fimoe-convert (`fimoe-convert targets`)")
    bad = structure_problem(structure, kernel.structure_classes)
    if bad:
        raise m.damaged(f"block {layer!r} rank {rank}: {bad}")
    names = tensor_names(structure)
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
    m = _as_manifest(out_dir)
    if m.target.get("runtime_module") != "flashinfer.megamoe":
        raise InputError(f"{m.out_dir}: converted for {m.target['name']!r}, not for flashinfer.megamoe; "
                         "convert with --target megamoe_sm90_mxfp4")
    return load_transformed_weights(m, layer, rank, device)
