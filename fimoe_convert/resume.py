"""`--resume`: what an earlier, interrupted run into OUT left that this run can keep.

A finished shard is kept when the earlier run had the same options and read the same source files, and the
shard's size and sha256 still match its record; everything else is redone. An input is the same file when its
size, mtime, ctime and inode are those recorded before the earlier run wrote anything, or else when its sha256 is the
one recorded; any other input refuses the resume (a kept shard would hold the old bytes)."""

from __future__ import annotations

from pathlib import Path

from .distributed import Group
from .errors import InputError, UsageError
from .files.hashing import CORES_PER_INPUT_HASH, ParallelHashes, hash_threads
from .files.output.folder import matching_records
from .files.output.manifest import (
    FileRecord,
    Manifest,
    Options,
    SourceRecord,
    has_manifest,
    read_manifest,
    read_rank_status,
)
from .files.sources.local import SAME_FILE, Source, identity_change
from .plan import Plan

CHANGED = ("the shards kept would mix old and new source bytes: run with --overwrite in place of --resume to "
           "convert again from the current source")


def previous_run(out_dir: Path, options: dict, source: Source, group: Group) -> tuple[Manifest | None, dict]:
    """(the earlier run's manifest or None when OUT has none, {input: sha256 or None} recorded for the inputs
    that are still the files it read). Refuses a manifest made with other options (exit 2) or from other or
    changed source files (exit 1, naming the file); rank 0 compares the inputs, for every rank."""
    if not has_manifest(out_dir):
        return None, {}
    old = read_manifest(out_dir, purpose="resume")
    if old.options != Options(**options):
        was = old.options.to_json()
        changed = sorted(k for k in set(options) | set(was) if options.get(k) != was.get(k))
        raise UsageError(f"--resume: {out_dir} was converted with other options ({', '.join(changed)} differ: "
                         f"{[was.get(k) for k in changed]} there, "
                         f"{[options.get(k) for k in changed]} now); use the same options or --overwrite")
    carried, problem = {}, None
    if group.rank == 0:
        try:
            carried = same_inputs(out_dir, old, source)
        except InputError as e:
            problem = str(e)
    problems = [p for p in group.gather(problem) if p]
    if problems:
        raise InputError(problems[0])
    return old, carried


def same_inputs(out_dir: Path, old: Manifest, source: Source) -> dict[str, str | None]:
    """{input: sha256 or None} for SRC's inputs when each is the file the earlier run recorded (same size, mtime,
    ctime and inode; else, where a sha256 was recorded, the same bytes); an InputError naming the first that is not."""
    recorded = old.source.files
    now = source.input_files()
    added, gone = sorted(set(now) - set(recorded)), sorted(set(recorded) - set(now))
    if added or gone:
        what = (f"now has {added[0]!r}, which {out_dir} was not converted from" if added else
                f"no longer has {gone[0]!r}, which {out_dir} was converted from")
        raise InputError(f"--resume: SRC {source.root} {what}; {CHANGED}")
    carried: dict[str, str | None] = {}
    to_hash = []
    for rel in now:
        rec, cur = recorded[rel], source.identities[rel]
        if all(rec.identity().get(k) == cur[k] for k in SAME_FILE):
            carried[rel] = rec.sha256
        elif rec.sha256 is None or rec.size != cur["size"]:
            raise InputError(f"--resume: {source.root / rel}: changed since {out_dir} was started "
                             f"({identity_change(rec.identity(), cur)})" + ("" if rec.sha256 else
                                                                 " and no sha256 was recorded to compare its bytes")
                             + f"; {CHANGED}")
        else:
            to_hash.append(rel)
    threads = hash_threads(CORES_PER_INPUT_HASH)
    hashes = ParallelHashes(to_hash, source.hash_input, threads, source.file_size).result()
    for rel in to_hash:
        check_sha(source.root / rel, hashes[rel], recorded[rel].sha256, out_dir)
        carried[rel] = hashes[rel]
    return carried


def check_sha(path: Path, sha: str, recorded: str | None, out_dir: Path) -> None:
    """Refuse an input whose sha256 differs from the one recorded for OUT (no record: nothing to compare)."""
    if recorded is not None and sha != recorded:
        raise InputError(f"--resume: {path}: sha256 {sha[:16]}... differs from the {recorded[:16]}... recorded when "
                         f"{out_dir} was started; {CHANGED}")


def kept_shards(out_dir: Path, old: Manifest | None, plan: Plan, owner: list[int], group: Group,
                progress=None) -> dict[str, FileRecord]:
    """{shard file: record} of the finished shards that still match their records; each rank re-hashes the
    shards it owns (in parallel; `progress(done bytes, total bytes)`)."""
    if old is None:
        return {}
    written = old.written()
    written.update(read_rank_status(out_dir))
    candidates = {s.filename: written[s.filename] for i, s in enumerate(plan.shards)
                  if owner[i] == group.rank and written.get(s.filename)}
    matching = matching_records(out_dir, candidates, progress)
    mine = {f: rec for f, rec in candidates.items() if f in matching}
    kept: dict[str, FileRecord] = {}
    for part in group.gather(mine):
        kept.update(part)
    return kept


def check_source_hashes(out_dir: Path, old: Manifest | None, source_record: SourceRecord) -> None:
    """Refuse to finish when an input's sha256 differs from the one the earlier run recorded."""
    old_files = old.source.files if old else {}
    changed = [rel for rel, rec in source_record.files.items()
               if rel in old_files and old_files[rel].sha256 not in (None, rec.sha256)]
    if changed:
        raise InputError(f"--resume: the sha256 of {', '.join(changed)} differs from when {out_dir} was started; "
                         "run again with --overwrite")
