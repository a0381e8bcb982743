"""`verify ORG/NAME`: a conversion published on the Hub checked against its own manifest without downloading its
shards: the Hub's LFS sha256 and size of each file against the manifest's, the small files fetched and hashed, the
index against every shard's header (read by range). For `--deep`, RangedTensors reads a repo's tensors by range,
the source's and the output's: bytes that are compared, never hashed (a file's sha256 needs the whole file)."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import InputError
from ...records import SCHEMA, FileRecord, Manifest, VerifyResult
from ..hashing import sha256_file
from ..jsonfile import read_json
from ..names import INDEX_NAME, MANIFEST_NAME
from ..paths import plain_relative
from ..safetensors.header import Header, TensorInfo, as_typed
from .http_range import read_range
from .hub import describing_files, on_daemon_threads, remote_headers

SMALL_FILE_BYTES = 64 * 2**20  # a file the Hub keeps outside LFS is at most 10 MB; larger ones are not fetched


def published(repo_id: str, revision: str | None = None) -> tuple[str, Manifest, dict[str, dict]]:
    """(the commit, its manifest, {path: {"size", "sha256" (the LFS oid, or None)}} of the repo's files)."""
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        snapshot = describing_files(repo_id, revision)
    except RevisionNotFoundError:
        raise InputError(f"--revision {revision}: {repo_id!r} has no such branch, tag or commit") from None
    except (RepositoryNotFoundError, EntryNotFoundError):
        raise InputError(f"{repo_id}: no such folder here, and no such model repo (with a config.json) on the Hub "
                         "(or it is private or gated: log in with `hf auth login`); check the name") from None
    commit = snapshot.name
    if not (snapshot / MANIFEST_NAME).is_file():
        raise InputError(f"{repo_id}@{commit}: has no {MANIFEST_NAME}; it is not a fimoe-convert output, or not a "
                         "complete one (upload it with `fimoe-convert upload OUT REPO_ID`)")
    fix = "the published manifest is damaged or not fimoe-convert's: do not load this repo"
    data = read_json(snapshot / MANIFEST_NAME, "manifest", fix=fix)  # a cache link to its blob: the Hub's file
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        seen = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise InputError(f"{repo_id}@{commit}/{MANIFEST_NAME}: schema is {str(seen)[:60]!r}, expected {SCHEMA!r}; "
                         "check it with the fimoe-convert version that wrote it")
    manifest = Manifest.from_json(data, f"{repo_id}@{commit}/{MANIFEST_NAME}", fix)
    return commit, manifest, hub_files(repo_id, commit)


def hub_files(repo_id: str, commit: str) -> dict[str, dict]:
    """{path: {"size", "sha256" (the LFS oid, or None: kept in git)}} of the repo's files at `commit`."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    files = {}
    for entry in HfApi().list_repo_tree(repo_id, revision=commit, recursive=True):
        if isinstance(entry, RepoFile):
            files[entry.path] = {"size": entry.size, "sha256": entry.lfs.sha256 if entry.lfs else None}
    return files


def verify_published(repo_id: str, revision: str | None = None, progress=None,
                     before=None) -> tuple[VerifyResult, Manifest, tuple | None, dict[str, Header]]:
    """(verify's record, with repo_id and revision; the manifest; what the shard headers say as
    folder.output_tensor_facts does, None when they were not reached; the shard headers, read by range) for
    `repo_id` on the Hub; the shards' bytes are never downloaded: their LFS sha256 is the Hub's. `before(manifest)`
    runs once the manifest is read (strictly), before any file is checked: a refusal it raises comes at once."""
    commit, manifest, files = published(repo_id, revision)
    if before is not None:
        before(manifest)
    where = f"{repo_id}@{commit}"
    problems: list[str] = []
    if manifest.complete is not True:
        problems.append(f"{where}/{MANIFEST_NAME}: complete is not true; the conversion it records did not finish")
    shards = sorted(rel for rel in manifest.files if rel.endswith(".safetensors"))
    if not shards or INDEX_NAME not in manifest.files:
        problems.append(f"{where}/{MANIFEST_NAME}: lists no index or no shards; a complete conversion lists both")
    problems += files_against_hub(repo_id, commit, manifest.files, files, progress,
                                  "the published file is not the one the manifest records")
    facts, headers = None, {}
    if not problems:
        found, headers = _index_against_headers(repo_id, commit, shards)
        problems += found
        facts = _facts(headers) if not found else None
    total = sum(rec.size for rec in manifest.files.values())
    return (VerifyResult(len(manifest.files), total, problems, repo_id=repo_id, revision=commit), manifest, facts,
            headers)


def files_against_hub(repo_id: str, commit: str, records: dict[str, FileRecord], files: dict[str, dict],
                      progress=None, differs: str = "") -> list[str]:
    """Problems of `records` ({path: size and sha256}, a manifest's) against the repo's `files` (hub_files): the
    size and the Hub's LFS sha256 of each; a file kept in git (small) is fetched and hashed here. `differs`: what a
    sha256 that differs means, said after it."""
    import huggingface_hub

    where = f"{repo_id}@{commit}"
    problems: list[str] = []
    total = sum(rec.size for rec in records.values())
    done = 0
    for rel, rec in sorted(records.items()):
        have = files.get(rel) if plain_relative(rel) else None
        if have is None:
            problems.append(f"{where}: {rel!r} is listed in the manifest but not in the repo")
            continue
        if have["size"] != rec.size:
            problems.append(f"{where}/{rel}: {have['size']} bytes on the Hub, manifest says {rec.size}")
            continue
        got = have["sha256"]
        if got is None and rec.size <= SMALL_FILE_BYTES:  # kept in git: fetched (small) and hashed here
            got = sha256_file(Path(huggingface_hub.hf_hub_download(repo_id, rel, revision=commit,
                                                                   cache_dir=os.environ.get("HF_HUB_CACHE"))))
        if got is None:
            problems.append(f"{where}/{rel}: {rec.size} bytes outside LFS, no sha256 known to the Hub; not checked")
        elif got != rec.sha256:
            problems.append(f"{where}/{rel}: sha256 {got[:16]}... on the Hub, manifest says {str(rec.sha256)[:16]}...; "
                            + differs)
        done += rec.size
        if progress:
            progress(done, total)
    return problems


def _index_against_headers(repo_id: str, commit: str, shards: list[str]) -> tuple[list[str], dict[str, Header]]:
    """(problems of the published index against the headers of the published shards, each read by range; the
    headers)."""
    from ..output.folder import read_out_index

    snapshot = describing_files(repo_id, commit)
    weight_map, index_total = read_out_index(snapshot / INDEX_NAME)
    headers, problems = remote_headers(repo_id, commit, shards)
    if problems:
        return problems, {}
    held = {name: rel for rel in shards for name in headers[rel].tensors}
    total = sum(info.nbytes for rel in shards for info in headers[rel].tensors.values())
    where = f"{repo_id}@{commit}/{INDEX_NAME}"
    if weight_map != held:
        diff = sorted(set(weight_map.items()) ^ set(held.items()))
        problems.append(f"{where}: weight_map disagrees with the shard headers, e.g. {diff[:2]}")
    if index_total != total:
        problems.append(f"{where}: metadata.total_size is {index_total}, the shards hold {total} tensor bytes")
    return problems, headers



def _facts(headers: dict) -> tuple[dict[str, int], dict[str, str], dict[str, tuple[str, int]]]:
    from ...dtypes import DTYPES

    nbytes, dtypes, shards = {}, {}, {}
    for rel, header in headers.items():
        total = sum(info.nbytes for info in header.tensors.values())
        for n, info in header.tensors.items():
            nbytes[n], dtypes[n], shards[n] = info.nbytes, DTYPES[info.dtype][1], (rel, total)
    return nbytes, dtypes, shards



RANGE_THREADS = 8  # ranged requests at once: each waits a round trip far longer than it transfers (tensors of MBs)
WAIT_STEP_S = 0.5  # the main thread wakes this often while ranges are read: a signal is handled at once


class RangedTensors:
    """Tensors of a repo's safetensors files at one commit, read by ranged requests at the offsets their validated
    headers give: no file is fetched whole, so these bytes are not hashed (a file's sha256 needs all of it); they
    are compared. Tensors that lie back to back in a file are read by one request. `read_bytes` counts what was
    read."""

    def __init__(self, repo_id: str, commit: str, headers: dict[str, Header]):
        self.repo_id, self.commit, self.headers = repo_id, commit, headers
        self.where = {name: rel for rel, header in headers.items() for name in header.tensors}
        self.read_bytes = 0

    def info(self, name: str) -> TensorInfo:
        return self.headers[self.where[name]].tensors[name]

    def read_raw(self, name: str, first: int = 0, end: int | None = None):
        """Bytes [first, end) of tensor `name` (uint8, CPU; default: all of it)."""
        return self.read_parts([(name, first, end)])[0]

    def read(self, name: str, rows: tuple[int, int] | None = None):
        """Tensor `name` with its stored dtype and shape (CPU); `rows`: only rows [lo, hi) of its first dimension."""
        return self.read_typed([(name, rows)])[name]

    def read_typed(self, wanted: list[tuple[str, tuple[int, int] | None]]) -> dict:
        """{name: the tensor with its stored dtype and shape (CPU), only rows [lo, hi) of its first dimension where
        given} for each (name, rows) of `wanted`, read together."""
        parts, shapes = [], []
        for name, rows in wanted:
            info = self.info(name)
            if rows is None or not info.shape:
                parts.append((name, 0, None))
                shapes.append(info.shape)
            else:
                per_row = info.nbytes // info.shape[0]
                parts.append((name, rows[0] * per_row, rows[1] * per_row))
                shapes.append((rows[1] - rows[0], *info.shape[1:]))
        raws = self.read_parts(parts)
        return {name: as_typed(raw, self.info(name).dtype, shape)
                for (name, _), raw, shape in zip(wanted, raws, shapes, strict=True)}

    def read_parts(self, parts: list[tuple[str, int, int | None]]) -> list:
        """For each (tensor, first, end) of `parts`, its bytes [first, end) (end None: to its end) as uint8 CPU
        tensors; parts that lie back to back in one file come from one request, up to RANGE_THREADS at once."""
        import torch
        from huggingface_hub import hf_hub_url

        spans: list[list] = []  # [file, start, end, [(part index, offset in the span, bytes)]]
        placed = []
        for i, (name, first, end) in enumerate(parts):
            info = self.info(name)
            end = info.nbytes if end is None else end
            placed.append((self.where[name], info.start + first, info.start + end, i, name))
        for rel, start, end, i, name in sorted(placed):
            if spans and spans[-1][0] == rel and spans[-1][2] == start:
                spans[-1][2] = end
            else:
                spans.append([rel, start, end, []])
            spans[-1][3].append((i, start - spans[-1][1], end - start, name))

        def fetch(k: int):
            rel, start, end, _ = spans[k]
            buf = torch.empty(end - start, dtype=torch.uint8)
            view = memoryview(buf.numpy()).cast("B")
            if end > start:
                names = [name for *_, name in spans[k][3]]
                said = repr(names[0]) + (f" and {len(names) - 1} more" if len(names) > 1 else "")
                read_range(hf_hub_url(self.repo_id, rel, revision=self.commit), start, end,
                           lambda pos, n: view[pos - start:pos - start + n],
                           where=f"{self.repo_id}@{self.commit}/{rel}: tensor {said}")
            return buf

        bufs = on_daemon_threads(fetch, list(range(len(spans))), RANGE_THREADS, "fimoe-ranged-read")
        out: list = [None] * len(parts)
        for k, (_, start, end, members) in enumerate(spans):
            self.read_bytes += end - start
            for i, offset, n, _ in members:
                out[i] = bufs[k][offset:offset + n]
        return out

