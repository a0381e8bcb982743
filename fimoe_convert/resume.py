"""`--resume`: what an earlier, interrupted run into OUT left that this run can keep; and what a run records of its
inputs so that it can be resumed (the first manifest, every input's identity and sha256).

A finished shard is kept when the earlier run had the same options and read the same source files, and the
shard's size and sha256 still match its record; everything else is redone. An input is the same file when its
size, mtime, ctime and inode are those recorded before the earlier run wrote anything, or else when its sha256 is the
one recorded; any other input refuses the resume (a kept shard would hold the old bytes)."""

from __future__ import annotations

import threading
from pathlib import Path

from . import versions
from .distributed import Group
from .errors import InputError, UsageError
from .files.hashing import CORES_PER_INPUT_HASH, ParallelHashes, hash_threads
from .files.output.folder import matching_records
from .files.output.manifest import LiveManifest, has_manifest, read_manifest, read_rank_status
from .files.sources.local import SAME_FILE, Source, identity_change
from .files.sources.stream import StreamedSource
from .plan import Plan
from .records import FileRecord, Manifest, Options, SourceRecord, Status

CHANGED = ("the shards kept would mix old and new source bytes: run with --overwrite in place of --resume to "
           "convert again from the current source")


def previous_run(out_dir: Path, options: Options, source: Source, group: Group) -> tuple[Manifest | None, dict]:
    """(the earlier run's manifest or None when OUT has none, {input: sha256 or None} recorded for the inputs
    that are still the files it read). Refuses a manifest made with other options (exit 2) or from other or
    changed source files (exit 1, naming the file); rank 0 compares the inputs, for every rank."""
    if not has_manifest(out_dir):
        return None, {}
    old = read_manifest(out_dir, purpose="resume")
    if old.options != options:
        was, now = old.options.to_json(), options.to_json()
        changed = sorted(k for k in now if now[k] != was[k])
        raise UsageError(f"--resume: {out_dir} was converted with other options ({', '.join(changed)} differ: "
                         f"{[was[k] for k in changed]} there, "
                         f"{[now[k] for k in changed]} now); use the same options or --overwrite")
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
        if all(getattr(rec, k) == getattr(cur, k) for k in SAME_FILE):
            carried[rel] = rec.sha256
        elif rec.sha256 is None or rec.size != cur.size:
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


def first_manifest(source: Source, converter, options: Options, plan: Plan, kept: dict, carried: dict) -> Manifest:
    """The manifest before any shard: `source.files` holds every input's identity (size, mtime_ns, inode, dev) and
    its sha256 where known without reading it (`carried`: recorded by the run a --resume continues)."""
    files = {rel: FileRecord(**{**vars(source.identities[rel]),
                                "sha256": carried.get(rel) or source.known_sha256(rel)})
             for rel in source.input_files()}
    return Manifest(tool=versions.tool(), options=options, model=source.model.geometry(),
                    source=SourceRecord(spec=recorded_spec(source), repo_id=source.repo_id, revision=source.revision,
                                        files=files),
                    target=converter.record(), ep=converter.ep_record(),
                    layers=converter.layers_record(list(plan.units.values())), files=dict(kept),
                    status={s.filename: Status.WRITTEN if s.filename in kept else Status.PENDING for s in plan.shards},
                    complete=False)


def source_record(source: Source, hashes: dict[str, str]) -> SourceRecord:
    """The complete manifest's `source`: size and sha256 of every input (no identity: the same files copied
    elsewhere give the same manifest)."""
    files = {rel: FileRecord(source.identities[rel].size, hashes[rel]) for rel in source.input_files()}
    return SourceRecord(spec=recorded_spec(source), repo_id=source.repo_id, revision=source.revision, files=files)


def local_inputs(source: Source) -> list[str]:
    """The inputs hashed from disk: all of them, but a streamed source's shards (hashed as they stream)."""
    files = source.input_files()
    return [f for f in files if f not in source.remote] if isinstance(source, StreamedSource) else files


def hash_inputs(source: Source, files: list[str], threads: int, manifest: LiveManifest | None = None
                ) -> ParallelHashes:
    """The sha256 of SRC's `files`, on `threads` threads beside the conversion, each added to `manifest` as it
    finishes (so that a --resume can compare the bytes of an input whose identity changed)."""
    left = len(files)
    lock = threading.Lock()

    def record(rel: str, sha: str) -> None:
        nonlocal left
        if manifest is not None:
            record_sha(source, manifest, rel, sha)
            with lock:
                left -= 1
                if left == 0:  # the last one: every hash is on disk while the shards are still being written
                    manifest.flush()

    return ParallelHashes(files, source.hash_input, threads, source.file_size, on_result=record)


def record_sha(source: Source, manifest: LiveManifest, rel: str, sha: str) -> None:
    """Add an input's sha256 to the live manifest; one recorded before (by the run a --resume continues) stays."""

    def add(m: Manifest) -> None:
        rec = m.source.files[rel]
        check_sha(source.root / rel, sha, rec.sha256, manifest.out_dir)
        rec.sha256 = sha

    manifest.update(add, defer=True)


def recorded_spec(source: Source) -> str:
    """SRC as the manifest names it, with no path of the converting machine: a Hub repo as id@commit, a folder by
    its name (`verify --deep` then takes it relative to where it runs, or --src)."""
    if source.repo_id:
        return f"{source.repo_id}@{source.revision}" if source.revision else source.repo_id
    return source.root.name
