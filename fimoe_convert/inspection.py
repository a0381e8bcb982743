"""`inspect SRC`: what a checkpoint holds and which targets fit it; `targets`: every target and whether it
can be converted here now."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import parse_expert_name, variant_name
from .errors import UsageError
from .files.output.manifest import has_manifest, read_manifest
from .files.sources.local import open_source, resolve_source_root
from .kernels import KERNELS
from .options import parse_arch
from .records import CheckpointInfo, Origin, OutputInfo, TargetReport, TargetRow
from .targets import TargetOptions, availability, validate


def inspect(src: str, *, revision: str | None = None, offline: bool = False, ep_size: int = 1,
            arch: str | None = None) -> CheckpointInfo | OutputInfo:
    """What the checkpoint holds (geometry, tensor classes, bytes) and which targets fit it; for a fimoe-convert
    output, what it was converted for and from (its manifest). A Hub repo's weights are not downloaded: shards
    not in the local cache are described from their headers on the Hub."""
    if type(ep_size) is not int or ep_size < 1:  # flags first, before SRC is opened (exit 2)
        raise UsageError(f"--ep-size {ep_size}: must be 1 or more (the number of expert-parallel ranks)")
    parse_arch(arch)
    root = resolve_source_root(src, revision, offline, weights=False)[0]
    if has_manifest(root):
        return describe_output(src, root)
    source = open_source(src, revision=revision, offline=offline, weights=False)
    model = source.model
    expert_bytes = sum(source.info(n).nbytes for n in source.weight_map if parse_expert_name(n))
    classes: dict[str, int] = {}
    for n in source.weight_map:
        kind = f"{'routed expert' if parse_expert_name(n) else 'other'} {source.info(n).dtype}"
        classes[kind] = classes.get(kind, 0) + 1
    opts = TargetOptions(ep_size=ep_size, arch=parse_arch(arch), device=None)
    fits = {k.name: validate(k, model, opts) or "fits" for k in KERNELS}
    return CheckpointInfo(source=source.spec, root=str(source.root), revision=source.revision,
                          variant=variant_name(model, source.config), model=model.geometry(),
                          shards=len(source.headers), tensors=len(source.weight_map), bytes=source.total_bytes,
                          routed_expert_bytes=expert_bytes, tensor_classes=dict(sorted(classes.items())),
                          files=source.input_files(), headers_from_hub=len(source.remote), targets=fits)


def describe_output(src: str, root: Path) -> OutputInfo:
    """A converted folder, from its manifest: target, kernel, EP size, source and its revision, files, bytes."""
    m = read_manifest(root)
    return OutputInfo(source=src, root=str(root), complete=m.complete is True, target=m.target, ep_size=m.ep_size,
                      model=m.model, origin=Origin(m.source.spec, m.source.repo_id, m.source.revision), tool=m.tool,
                      files=len(m.files), bytes=sum(f.size for f in m.files.values()),
                      report=m.report or TargetReport())


def list_targets() -> list[TargetRow]:
    """Every target, what it declares, and whether this machine can run its conversion now."""
    rows = []
    for k in KERNELS:
        ok, why = availability(k)
        rows.append(TargetRow(name=k.name, kernel_name=k.kernel_name, aliases=list(k.aliases),
                              vllm_moe_backend=k.vllm_moe_backend, capabilities=list(k.capabilities),
                              weight_format=k.weight_format, activation_format=k.activation_format,
                              needs_nvshmem=k.needs_nvshmem, preprocess_needs_cuda=k.preprocess_needs_cuda,
                              needs_packages=list(k.needs_packages), available_here=ok, why=why, engines=k.engines,
                              description=k.description))
    return rows
