"""`verify OUT [--deep]`: every file against the manifest; with `deep`, a sample of units re-derived from the
source and compared bit for bit."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch

from .errors import FimoeError, InputError, UsageError
from .files.names import INDEX_NAME, MANIFEST_NAME
from .files.output.folder import output_tensor_facts, path_kind, read_out_index, read_output_tensors, verify_files
from .files.output.manifest import read_manifest
from .files.output.space import stray_single_file
from .files.paths import plain_relative
from .files.safetensors.header import as_typed
from .files.sources.hub import describing_files, is_repo_id
from .files.sources.local import Source, open_source, recorded_folder_problem
from .files.sources.published import RangedTensors, files_against_hub, hub_files, verify_published
from .kernels import BY_NAME
from .numerics.structure_check import structure_problem
from .options import parse_arch
from .plan import piece_rows, plan_shards, planned_tensors
from .records import DEMO_WORKDIR, Damaged, Manifest, VerifyResult
from .targets import TargetOptions, get_kernel, make_target


def verify(out: str, deep: bool = False, samples: int = 8, src: str | None = None, progress=None,
           revision: str | None = None) -> VerifyResult:
    """Re-hash every output file against the manifest (in parallel; `progress(done bytes, total bytes)`) and check
    index, manifest and headers agree. With `deep`, check that the source is the one the output was converted from
    (sizes, and the sha256 of every input, hashed now), then re-derive `samples` units from it and compare them bit
    for bit. `out` may be a Hub repo id (ORG/NAME, no such folder here; `revision`): its files are checked against
    its manifest by the Hub's LFS sha256 and its shards' headers, read by range, with no download of the shards."""
    if path_kind(out) == "missing" and is_repo_id(out):
        if src is not None and deep:
            raise UsageError(f"--src {src}: verify {out} --deep re-derives from the Hub source its manifest "
                             f"records; to use another copy, `hf download {out} --local-dir OUT`, then "
                             "`fimoe-convert verify OUT --deep --src SRC`")
        res, manifest, facts, headers = verify_published(out, revision, progress,
                                                         (lambda m: hub_source(out, m)) if deep else None)
        if not res.problems:
            res.problems.extend(structure_problems(Path(f"{out}@{res.revision}"), manifest, facts))
        if deep and not res.problems:  # the manifest is trusted from here on: its names, sizes and counts were checked
            _deep_published(res, manifest, headers, samples)
        return res
    if revision is not None:
        raise UsageError(f"--revision {revision}: only for a Hub repo id; {out!r} is a local folder")
    out_dir = Path(out)
    manifest = read_manifest(out_dir)
    # --deep: the source's identity first, so a wrong --src is said in seconds, before OUT is hashed
    source, found = _source(manifest, src, out_dir) if deep else (None, None)
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
    res.source_folder = found
    if res.problems or source is None:
        return res
    o = manifest.options
    target_options = TargetOptions(ep_size=o.ep_size, arch=parse_arch(o.arch), device="cpu",
                                   allow_lossy=o.allow_lossy, params=dict(o.params))
    converter = make_target(get_kernel(manifest.target.name), source.model, target_options)
    units = converter.all_units(source.non_expert_tensors())
    layout = layout_problem(out_dir / INDEX_NAME, planned_tensors(source.non_expert_tensors(), units), o.shard_size)
    if layout:  # the set of tensors and their shards, re-derived from SRC: a shard dropped with its records is seen
        res.problems.append(layout)
        return res
    rows = piece_rows(units)  # a unit may write only some rows of a tensor
    for unit in stride_sample(units, samples):
        want = converter.run(unit, {n: source.read(n) for n in unit.inputs})
        got = read_output_tensors(out_dir, list(want))
        res.problems += [f"{out_dir}: tensor {name!r} differs from a fresh conversion of the source; the output is "
                         "damaged, convert again with --overwrite" for name in differing(unit, want, got, rows)]
        res.deep_checked += 1
        if res.problems:
            break
    return res


def stride_sample(units: list, samples: int) -> list:
    """`samples` units spread evenly over `units`, from the first (--deep's sample)."""
    return units[::max(1, len(units) // samples)][:samples]


def differing(unit, want: dict, got: dict, rows: dict) -> list[str]:
    """The names of `unit`'s outputs whose stored bytes (`got`: the whole stored tensors) are not those of a fresh
    conversion (`want`: the unit's rows of each), shape included."""
    bad = []
    for name, w in want.items():
        lo, hi = rows[(unit.key, name)]
        g = got[name] if (lo, hi) == (0, got[name].shape[0]) else got[name][lo:hi]
        if g.shape != w.shape or not torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)):
            bad.append(name)
    return bad


def layout_problem(index: Path, tensors: list, shard_size: int, where: str | None = None) -> str | None:
    """The index's {tensor: shard} against what a conversion of the source with the manifest's options writes.
    `where`: how the index is named (default: its path)."""
    want = {t.name: shard.filename for shard in plan_shards(tensors, shard_size) for t in shard.tensors}
    have = read_out_index(index)[0]
    if have == want:
        return None
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    moved = sorted(n for n in set(want) & set(have) if want[n] != have[n])
    said = "; ".join(f"{what} {len(names)}, e.g. {names[0]!r}" for what, names in
                     (("missing", missing), ("not of this conversion", extra), ("in another shard", moved)) if names)
    return (f"{where or index}: holds {len(have)} tensors, a conversion of the source with the manifest's "
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


def _source(manifest: Manifest, src: str | None, out_dir: Path) -> tuple[Source, str | None]:
    """The source to re-derive from, checked against what the manifest recorded of it before any unit is compared,
    so that a wrong --src is blamed, not a good output; and, for a folder found by its recorded name, which one."""
    rec = manifest.source
    if src is None and rec.repo_id is None and not Path(rec.spec).is_absolute():
        return _found_source(manifest, out_dir)
    spec = src or rec.repo_id or rec.spec  # a Hub repo by id (and the recorded revision), or a folder
    source = open_source(spec, revision=rec.revision, offline=True)
    problems = _record_problems(source, rec.files, spec)
    if problems:
        where = "--src " + src if src else f"the source recorded in {out_dir / MANIFEST_NAME}"
        raise InputError(f"{where}: is not the checkpoint {out_dir} was converted from ({'; '.join(problems[:3])}"
                         + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
                         + "); pass the original with --src PATH")
    return source, None


def _record_problems(source: Source, files: dict, spec: str, first_only: bool = False) -> list[str]:
    """How `source`'s input files differ from the manifest's record of them (size, then sha256), one line each."""
    problems = []
    for rel, want in sorted(files.items()):
        # Hashed (unless known): an input rewritten in place with its size kept is the source's fault, not OUT's.
        got = source.file_record(rel, compute_hash=want.sha256 is not None) if rel in source.input_files() else None
        if got is None:
            problems.append(f"{rel}: not in {spec}")
        elif got.size != want.size or (got.sha256 and want.sha256 and got.sha256 != want.sha256):
            problems.append(f"{rel}: {got.size} bytes, sha256 {(got.sha256 or 'not known')[:16]}; the output was "
                            f"converted from {want.size} bytes, sha256 {(want.sha256 or 'not recorded')[:16]}")
        if problems and first_only:
            break
    return problems


def _found_source(manifest: Manifest, out_dir: Path) -> tuple[Source, str]:
    """The folder of the recorded name next to OUT, in the current directory or in the demo's folder, whichever
    first holds the files the manifest records (names and sizes first, then every sha256); else a UsageError that
    names each folder tried and why it was refused."""
    name = manifest.source.spec
    head = (f"verify --deep: the manifest records the source as {name[:120]!r}, a folder named relative to where "
            "the conversion ran (an output names no path of its machine)")
    if not plain_relative(name) or "/" in name:  # the manifest is input: its name must not walk elsewhere
        raise UsageError(f"{head}, not a folder name; pass --src PATH")
    places = [(out_dir.parent / name, "next to OUT"), (Path(name), "in the current directory"),
              (Path(DEMO_WORKDIR) / name, "in the demo's folder")]
    tried, seen = [], set()
    for folder, where in places:
        if folder.absolute() in seen:
            continue
        seen.add(folder.absolute())
        problem = recorded_folder_problem(folder, manifest.source.files)
        if problem is None:
            try:
                source = open_source(str(folder), offline=True)
            except FimoeError as e:
                problem = f"not a checkpoint that can be opened ({str(e).split(';')[0][:160]})"
            else:
                bad = _record_problems(source, manifest.source.files, str(folder), first_only=True)
                if not bad:
                    return source, f"{folder}, found {where}"
                problem = bad[0].replace("; ", ", ")
        tried.append(f"{folder}, {where}: {problem}")
    raise UsageError(f"{head}; tried {'; '.join(tried)}; pass --src PATH")


def _deep_published(res: VerifyResult, manifest: Manifest, headers: dict, samples: int) -> None:
    """`verify ORG/NAME --deep`, after the shallow checks passed: the Hub source the manifest records (its files'
    sizes and sha256 against the manifest's record of them, from the Hub's), the index re-derived from it, then a
    sample of units re-run on the CPU from source tensors read by range and compared byte for byte with the output
    tensors read by range, and the sampled blocks' copied tensors compared with the source's. Problems go to `res`."""
    out_where = f"{res.repo_id}@{res.revision}"
    rec = manifest.source
    repo_id, commit = hub_source(res.repo_id, manifest)
    src_where = f"{repo_id}@{commit}"
    try:
        listed = hub_files(repo_id, commit)
    except Exception as e:  # noqa: BLE001 - huggingface_hub's HTTP and transport errors, one line each
        raise InputError(f"{src_where}: the source {out_where}'s manifest records cannot be listed on the Hub "
                         f"({e.__class__.__name__}); check the network, and log in (`hf auth login`) if the source "
                         "is gated") from None
    damaged = (f"the source on the Hub is not the one {out_where}'s manifest records: do not load {out_where}; "
               "convert the source again and publish that")
    res.problems += files_against_hub(repo_id, commit, rec.files, listed, differs=damaged)
    if res.problems:
        return
    source = open_source(repo_id, revision=commit, weights=False)  # config, index and headers: validated
    unrecorded = sorted(set(source.headers) - set(rec.files))
    if unrecorded:  # a shard the output may hold bytes of, with no sha256 to tie it to the conversion
        res.problems.append(f"{out_where}/{MANIFEST_NAME}: records no size and sha256 of {len(unrecorded)} shards "
                            f"of {src_where}, e.g. {unrecorded[0]!r}; {OUT_DAMAGED_HINT}")
        return
    o = manifest.options
    try:  # the manifest's options as a conversion's flags are checked, before any unit is planned from them
        target_options = TargetOptions(ep_size=o.ep_size, arch=parse_arch(o.arch), device="cpu",
                                       allow_lossy=o.allow_lossy, params=dict(o.params))
        converter = make_target(get_kernel(manifest.target.name), source.model, target_options)
        refused = converter.validate()
    except UsageError as e:
        refused = [str(e)]
    if refused:
        raise InputError(f"verify {res.repo_id} --deep: the conversion {out_where}/{MANIFEST_NAME} records (target "
                         f"{manifest.target.name[:80]!r}, EP size {o.ep_size}) cannot be re-run here on the CPU: "
                         f"{'; '.join(p[:300] for p in refused[:2])}")
    tensors = source.non_expert_tensors()
    units = converter.all_units(tensors)
    planned = planned_tensors(tensors, units)
    index = describing_files(res.repo_id, res.revision) / INDEX_NAME  # fetched by the shallow check
    layout = layout_problem(index, planned, o.shard_size, f"{out_where}/{INDEX_NAME}")
    if layout:
        res.problems.append(layout)
        return
    from_source = RangedTensors(repo_id, commit, {rel: source.headers[rel] for rel in source.remote})
    from_output = RangedTensors(res.repo_id, res.revision, headers)

    def source_raw(names: list[str]) -> dict:  # a shard of the source already in the local cache is read there
        remote = [n for n in names if not source.is_local(n)]
        got = dict(zip(remote, from_source.read_parts([(n, 0, None) for n in remote]), strict=True))
        return {n: got[n] if n in got else source.read_raw(n) for n in names}

    def typed(names) -> dict:
        return {n: as_typed(raw, source.info(n).dtype, source.info(n).shape) for n, raw in source_raw(names).items()}

    res.source, res.copies_checked = src_where, 0
    rows = piece_rows(units)
    dtypes = {t.name: t.dtype for t in planned}
    chosen = hub_sample(units, samples, source.model)
    for unit in chosen:
        want = converter.run(unit, typed(list(unit.inputs)))
        got = from_output.read_typed([(n, rows[(unit.key, n)]) for n in want])
        bad = differing(unit, want, got, {(unit.key, n): (0, got[n].shape[0]) for n in want})
        bad += [n for n in want if n not in bad and from_output.info(n).dtype != dtypes[n]]  # same bytes, read as other
        res.problems += [_differs(from_output, name, f"unit {unit.key!r} re-derived from {src_where}",
                                  got[name], want[name], dtypes[name]) for name in bad]
        res.deep_checked += 1
        if res.problems:
            break
    blocks = sorted({u.block for u in chosen})
    copies = [t.name for t in planned if not t.producers]
    picked = _ends([n for n in copies if n.startswith(block + ".")] for block in blocks) if not res.problems else []
    wants = source_raw(picked)
    gots = dict(zip(picked, from_output.read_parts([(n, 0, None) for n in picked]), strict=True))
    for name in picked:
        have, info = from_output.info(name), source.info(name)
        if (have.dtype, have.shape) != (info.dtype, info.shape) or not torch.equal(gots[name], wants[name]):
            res.problems.append(_differs(from_output, name, f"the copy of {src_where}'s tensor",
                                         as_typed(gots[name], have.dtype, have.shape),
                                         as_typed(wants[name], info.dtype, info.shape), info.dtype))
            break
        res.copies_checked += 1
    res.range_bytes = from_source.read_bytes + from_output.read_bytes


COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def hub_source(out: str, manifest: Manifest) -> tuple[str, str]:
    """(repo id, commit) of the source `manifest` records: `verify ORG/NAME --deep` re-derives from a Hub source
    pinned to a commit, and refuses any other in one line."""
    rec = manifest.source
    if not (rec.repo_id and is_repo_id(rec.repo_id) and rec.revision and COMMIT_RE.fullmatch(rec.revision)):
        raise UsageError(f"verify {out} --deep: needs a Hub source pinned to a commit, and the manifest records the "
                         f"source as {rec.spec[:120]!r}; `hf download {out} --local-dir OUT`, then "
                         "`fimoe-convert verify OUT --deep --src SRC` with that source's folder")
    return rec.repo_id, rec.revision


def hub_sample(units: list, samples: int, model) -> list:
    """The units `verify ORG/NAME --deep` re-derives, in plan order: the local --deep's `samples` (stride_sample),
    and the first and last unit of each EP rank and of each kind of block (hash-routed layers, layers, MTP blocks,
    rewritten non-expert tensors): the ends of each range, where a plan that is off by one shows."""
    def kind(u) -> str:
        if u.dense:
            return "dense"
        head, _, idx = u.block.partition(".")
        return "mtp" if head == "mtp" else "hash" if idx.isdigit() and int(idx) < model.num_hash_layers else "layers"

    chosen = {id(u) for u in stride_sample(units, samples)}
    groups: dict[tuple, list] = {}
    for u in units:
        groups.setdefault(("rank", u.rank), []).append(u)
        groups.setdefault(("kind", kind(u)), []).append(u)
    for group in groups.values():
        chosen |= {id(group[0]), id(group[-1])}
    return [u for u in units if id(u) in chosen]


def _ends(groups) -> list[str]:
    """The first and last name of each group (once each)."""
    return list(dict.fromkeys(n for names in groups for n in names[:1] + names[-1:]))


def _differs(output, name: str, what: str, got, want, dtype: str) -> str:
    """The line for a published tensor whose bytes are not `want`'s: repo, file, tensor, both hashes, next step."""
    def digest(t) -> str:
        return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()[:16]

    stored = output.info(name).dtype
    return (f"{output.repo_id}@{output.commit}/{output.where[name]}: tensor {name!r} differs from {what} (its bytes' "
            f"sha256 {digest(got)}..., {stored} {tuple(got.shape)}; expected {digest(want)}..., {dtype} "
            f"{tuple(want.shape)}); the "
            "published output is not an exact conversion of its source: do not load it; convert again and publish "
            "with `fimoe-convert upload`")
