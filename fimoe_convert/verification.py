"""`verify OUT [--deep]`: every file against the manifest; with `deep`, a sample of units re-derived from the
source and compared bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import InputError, UsageError
from .files.names import INDEX_NAME, MANIFEST_NAME
from .files.output.folder import output_tensor_facts, path_kind, read_out_index, read_output_tensors, verify_files
from .files.output.manifest import read_manifest
from .files.output.space import stray_single_file
from .files.sources.hub import is_repo_id
from .files.sources.local import Source, open_source
from .files.sources.published import verify_published
from .kernels import BY_NAME
from .numerics.structure_check import structure_problem
from .options import parse_arch
from .plan import piece_rows, plan_shards, planned_tensors
from .records import Damaged, Manifest, VerifyResult
from .targets import TargetOptions, get_kernel, make_target


def verify(out: str, deep: bool = False, samples: int = 8, src: str | None = None, progress=None,
           revision: str | None = None) -> VerifyResult:
    """Re-hash every output file against the manifest (in parallel; `progress(done bytes, total bytes)`) and check
    index, manifest and headers agree. With `deep`, check that the source is the one the output was converted from
    (sizes, and the sha256 of every input, hashed now), then re-derive `samples` units from it and compare them bit
    for bit. `out` may be a Hub repo id (ORG/NAME, no such folder here; `revision`): its files are checked against
    its manifest by the Hub's LFS sha256 and its shards' headers, read by range, with no download of the shards."""
    if path_kind(out) == "missing" and is_repo_id(out):
        if deep:
            raise UsageError(f"verify {out} --deep: re-deriving units of a published conversion needs its files; "
                             f"`hf download {out} --local-dir OUT`, then `fimoe-convert verify OUT --deep`")
        res, manifest, facts = verify_published(out, revision, progress)
        if not res.problems:
            res.problems.extend(structure_problems(Path(f"{out}@{res.revision}"), manifest, facts))
        return res
    if revision is not None:
        raise UsageError(f"--revision {revision}: only for a Hub repo id; {out!r} is a local folder")
    out_dir = Path(out)
    manifest = read_manifest(out_dir)
    # --deep: the source's identity first, so a wrong --src is said in seconds, before OUT is hashed
    source = _source(manifest, src, out_dir) if deep else None
    try:
        res = verify_files(out_dir, manifest, progress)
    except FileNotFoundError as e:  # a file removed between the listing and its hashing: OUT is being rewritten
        raise InputError(f"{e.filename or out_dir}: vanished while OUT was verified; a conversion into {out_dir} "
                         "(--overwrite, --resume) is running or just ran: verify again once it has ended") from None
    if not res.problems:
        res.problems.extend(structure_problems(out_dir, manifest))
    stray = stray_single_file(out_dir, manifest.files)
    if stray:
        res.problems.append(stray)
    if res.problems or source is None:
        return res
    o = manifest.options
    target_options = TargetOptions(ep_size=o.ep_size, arch=parse_arch(o.arch), device="cpu",
                                   allow_lossy=o.allow_lossy, params=dict(o.params))
    converter = make_target(get_kernel(manifest.target.name), source.model, target_options)
    units = converter.all_units(source.non_expert_tensors())
    layout = layout_problem(out_dir, planned_tensors(source.non_expert_tensors(), units), o.shard_size)
    if layout:  # the set of tensors and their shards, re-derived from SRC: a shard dropped with its records is seen
        res.problems.append(layout)
        return res
    rows = piece_rows(units)  # a unit may write only some rows of a tensor
    step = max(1, len(units) // samples)
    for unit in units[::step][:samples]:
        want = converter.run(unit, {n: source.read(n) for n in unit.inputs})
        got = read_output_tensors(out_dir, list(want))
        for name, w in want.items():
            lo, hi = rows[(unit.key, name)]
            g = got[name] if (lo, hi) == (0, got[name].shape[0]) else got[name][lo:hi]
            same = torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8))
            if g.shape != w.shape or not same:
                res.problems.append(f"{out_dir}: tensor {name!r} differs from a fresh conversion of the source; "
                                    "the output is damaged, convert again with --overwrite")
        res.deep_checked += 1
        if res.problems:
            break
    return res


def layout_problem(out_dir: Path, tensors: list, shard_size: int) -> str | None:
    """The index's {tensor: shard} against what a conversion of the source with the manifest's options writes."""
    want = {t.name: shard.filename for shard in plan_shards(tensors, shard_size) for t in shard.tensors}
    have = read_out_index(out_dir / INDEX_NAME)[0]
    if have == want:
        return None
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    moved = sorted(n for n in set(want) & set(have) if want[n] != have[n])
    said = "; ".join(f"{what} {len(names)}, e.g. {names[0]!r}" for what, names in
                     (("missing", missing), ("not of this conversion", extra), ("in another shard", moved)) if names)
    return (f"{out_dir / INDEX_NAME}: holds {len(have)} tensors, a conversion of the source with the manifest's "
            f"options gives {len(want)} ({said}); {OUT_DAMAGED_HINT}")


def structure_problems(out_dir: Path, manifest: Manifest, facts: tuple | None = None) -> list[str]:
    """Each block's stored structure checked as the runtime loader checks it (the kernel table's classes, each
    tensor's bytes in the shard headers), without FlashInfer; one problem per bad block and rank. `facts`: what the
    shard headers say (output_tensor_facts), when they were read elsewhere (a published output's)."""
    where = out_dir / MANIFEST_NAME
    target = manifest.target
    kernel = BY_NAME.get(target.name)
    if kernel is None or kernel.kernel_name != target.kernel_name:
        return [f"{where}: target {target.name[:80]!r} with kernel "
                f"{str(target.kernel_name)[:80]!r} is not a target of this fimoe-convert; "
                f"{OUT_DAMAGED_HINT}"]
    if kernel.kernel_name is None:
        return []  # dense engines' outputs: tensors by name, no structure to rebuild
    try:
        nbytes, dtypes, shards = facts or output_tensor_facts(out_dir)
    except InputError as e:
        return [str(e)]
    problems = []
    for layer, ranks in sorted(manifest.layers.items()):
        if not isinstance(ranks, dict):
            problems.append(f"{where}: block {layer[:80]!r}: a dense layout where the target's ranks belong; "
                            f"{OUT_DAMAGED_HINT}")
            continue
        for rank, rec in sorted(ranks.items()):
            bad = rec.problem if isinstance(rec, Damaged) else \
                structure_problem(rec.structure, kernel.structure_classes, nbytes, dtypes, shards)
            if bad:
                problems.append(f"{where}: block {layer[:80]!r} rank {rank[:20]}: {bad}; {OUT_DAMAGED_HINT}")
    return problems


OUT_DAMAGED_HINT = "the manifest is damaged or not fimoe-convert's: do not load it; convert again with --overwrite"


def _source(manifest: Manifest, src: str | None, out_dir: Path) -> Source:
    """The source to re-derive from, checked against what the manifest recorded of it before any unit is compared,
    so that a wrong --src is blamed, not a good output."""
    rec = manifest.source
    spec = src or rec.repo_id or rec.spec  # a Hub repo by id (and the recorded revision), a folder by name
    try:
        source = open_source(spec, revision=rec.revision, offline=True)
    except UsageError as e:
        if src is None and not Path(spec).is_absolute():
            raise UsageError(f"verify --deep: the manifest records the source as {spec!r}, a folder named relative to "
                             f"where the conversion ran (an output names no path of its machine), which is not "
                             f"found from here; pass --src PATH") from None
        raise e
    problems = []
    for rel, want in sorted(rec.files.items()):
        # Hashed (unless known): an input rewritten in place with its size kept is the source's fault, not OUT's.
        got = source.file_record(rel, compute_hash=want.sha256 is not None) if rel in source.input_files() else None
        if got is None:
            problems.append(f"{rel}: not in {spec}")
        elif got.size != want.size or (got.sha256 and want.sha256 and got.sha256 != want.sha256):
            problems.append(f"{rel}: {got.size} bytes, sha256 {(got.sha256 or 'not known')[:16]}; the output was "
                            f"converted from {want.size} bytes, sha256 {(want.sha256 or 'not recorded')[:16]}")
    if problems:
        where = "--src " + src if src else f"the source recorded in {out_dir / MANIFEST_NAME}"
        raise InputError(f"{where}: is not the checkpoint {out_dir} was converted from ({'; '.join(problems[:3])}"
                         + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
                         + "); pass the original with --src PATH")
    return source
