"""`--resume`: what an earlier, interrupted run into OUT left that this run can keep.

A finished shard is kept when the earlier run had the same options and the same source files, and the shard's
size and sha256 still match its record; everything else is redone."""

from __future__ import annotations

from pathlib import Path

from .distributed import Group
from .errors import InputError, UsageError
from .files.output import has_manifest, matching_records, read_manifest, read_rank_status
from .files.source import Source
from .plan import Plan


def previous_run(out_dir: Path, options: dict, source: Source) -> dict | None:
    """The earlier run's manifest, or None when OUT has none; refuses one made with other options or from
    other source files."""
    if not has_manifest(out_dir):
        return None
    old = read_manifest(out_dir)
    if old.get("options") != options:
        changed = sorted(k for k in set(options) | set(old.get("options", {}))
                         if options.get(k) != old.get("options", {}).get(k))
        raise UsageError(f"--resume: {out_dir} was converted with other options ({', '.join(changed)} differ: "
                         f"{[old.get('options', {}).get(k) for k in changed]} there, "
                         f"{[options.get(k) for k in changed]} now); use the same options or --overwrite")
    old_sizes = {k: v["size"] for k, v in old.get("source", {}).get("files", {}).items()}
    new_sizes = {rel: source.file_record(rel, compute_hash=False).size for rel in source.input_files()}
    if old_sizes != new_sizes:
        raise UsageError(f"--resume: the source files differ from those {out_dir} was converted from; "
                         "use --overwrite to start again")
    return old


def kept_shards(out_dir: Path, old: dict | None, plan: Plan, owner: list[int], group: Group,
                progress=None) -> dict[str, dict]:
    """{shard file: record} of the finished shards that still match their records; each rank re-hashes the
    shards it owns (in parallel; `progress(done bytes, total bytes)`)."""
    if old is None:
        return {}
    written = {f: old.get("files", {}).get(f) for f, st in old.get("status", {}).items() if st == "written"}
    written.update(read_rank_status(out_dir))
    candidates = {s.filename: written[s.filename] for i, s in enumerate(plan.shards)
                  if owner[i] == group.rank and written.get(s.filename)}
    matching = matching_records(out_dir, candidates, progress)
    mine = {f: rec for f, rec in candidates.items() if f in matching}
    kept: dict[str, dict] = {}
    for part in group.gather(mine):
        kept.update(part)
    return kept


def check_source_hashes(out_dir: Path, old: dict | None, source_record: dict) -> None:
    """Refuse to finish when an input's sha256 differs from the one the earlier run recorded."""
    old_files = (old or {}).get("source", {}).get("files", {})
    changed = [rel for rel, rec in source_record["files"].items()
               if old_files.get(rel, {}).get("sha256") not in (None, rec["sha256"])]
    if changed:
        raise InputError(f"--resume: the sha256 of {', '.join(changed)} differs from when {out_dir} was started; "
                         "run again with --overwrite")
