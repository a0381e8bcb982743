"""`verify ORG/NAME`: a conversion published on the Hub checked against its own manifest without downloading its
shards: the Hub's LFS sha256 and size of each file against the manifest's, the small files fetched and hashed, the
index against every shard's header (read by range)."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import InputError
from ...records import SCHEMA, Manifest, VerifyResult
from ..hashing import sha256_file
from ..jsonfile import read_json
from ..names import INDEX_NAME, MANIFEST_NAME
from ..paths import plain_relative
from .hub import describing_files, remote_headers

SMALL_FILE_BYTES = 64 * 2**20  # a file the Hub keeps outside LFS is at most 10 MB; larger ones are not fetched


def published(repo_id: str, revision: str | None = None) -> tuple[str, Manifest, dict[str, dict]]:
    """(the commit, its manifest, {path: {"size", "sha256" (the LFS oid, or None)}} of the repo's files)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

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
    files = {}
    for entry in HfApi().list_repo_tree(repo_id, revision=commit, recursive=True):
        if isinstance(entry, RepoFile):
            files[entry.path] = {"size": entry.size, "sha256": entry.lfs.sha256 if entry.lfs else None}
    return commit, manifest, files


def verify_published(repo_id: str, revision: str | None = None,
                     progress=None) -> tuple[VerifyResult, Manifest, tuple | None]:
    """(verify's record, with repo_id and revision; the manifest; what the shard headers say as
    folder.output_tensor_facts does, None when they were not reached) for `repo_id` on the Hub; the shards' bytes are
    never downloaded: their LFS sha256 is the Hub's."""
    import huggingface_hub

    commit, manifest, hub_files = published(repo_id, revision)
    where = f"{repo_id}@{commit}"
    problems: list[str] = []
    if manifest.complete is not True:
        problems.append(f"{where}/{MANIFEST_NAME}: complete is not true; the conversion it records did not finish")
    shards = sorted(rel for rel in manifest.files if rel.endswith(".safetensors"))
    if not shards or INDEX_NAME not in manifest.files:
        problems.append(f"{where}/{MANIFEST_NAME}: lists no index or no shards; a complete conversion lists both")
    total = sum(rec.size for rec in manifest.files.values())
    done = 0
    for rel, rec in sorted(manifest.files.items()):
        have = hub_files.get(rel) if plain_relative(rel) else None
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
                            "the published file is not the one the manifest records")
        done += rec.size
        if progress:
            progress(done, total)
    facts = None
    if not problems:
        found, facts = _index_against_headers(repo_id, commit, shards)
        problems += found
    return VerifyResult(len(manifest.files), total, problems, repo_id=repo_id, revision=commit), manifest, facts


def _index_against_headers(repo_id: str, commit: str, shards: list[str]) -> tuple[list[str], tuple | None]:
    """(problems of the published index against the headers of the published shards, each read by range; what the
    headers say)."""
    from ..output.folder import read_out_index

    snapshot = describing_files(repo_id, commit)
    weight_map, index_total = read_out_index(snapshot / INDEX_NAME)
    headers, problems = remote_headers(repo_id, commit, shards)
    if problems:
        return problems, None
    held = {name: rel for rel in shards for name in headers[rel].tensors}
    total = sum(info.nbytes for rel in shards for info in headers[rel].tensors.values())
    where = f"{repo_id}@{commit}/{INDEX_NAME}"
    if weight_map != held:
        diff = sorted(set(weight_map.items()) ^ set(held.items()))
        problems.append(f"{where}: weight_map disagrees with the shard headers, e.g. {diff[:2]}")
    if index_total != total:
        problems.append(f"{where}: metadata.total_size is {index_total}, the shards hold {total} tensor bytes")
    return problems, _facts(headers)



def _facts(headers: dict) -> tuple[dict[str, int], dict[str, str], dict[str, tuple[str, int]]]:
    from ...dtypes import DTYPES

    nbytes, dtypes, shards = {}, {}, {}
    for rel, header in headers.items():
        total = sum(info.nbytes for info in header.tensors.values())
        for n, info in header.tensors.items():
            nbytes[n], dtypes[n], shards[n] = info.nbytes, DTYPES[info.dtype][1], (rel, total)
    return nbytes, dtypes, shards

