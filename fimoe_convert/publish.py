"""`upload` of a finished, verified OUT to the Hub.

The token comes from huggingface_hub's usual sources (the `token` argument, `HF_TOKEN`, the file
written by `hf auth login`); it is sent in the Authorization header only and never appears in a
result or a message."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import InputError, UsageError
from .files.names import MANIFEST_NAME
from .files.output.folder import file_sizes, path_kind, strays as stray_files, verify_files
from .files.output.manifest import read_manifest
from .records import Manifest, UploadFile, UploadResult
from .sizes import human

_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{8,}")


def _redact(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "<token>")
    return _TOKEN_RE.sub("hf_<token>", text)


def _glob_escape(name: str) -> str:
    """An allow_patterns entry (fnmatch) that matches exactly `name`."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


def upload_plan(out: str, progress=None) -> tuple[Path, Manifest, list[UploadFile], list[str]]:
    """(OUT, manifest, the files to send, strays) for a complete OUT whose files all match the manifest.

    Refuses (InputError naming the file) an unfinished or damaged OUT."""
    out_dir = Path(out)
    manifest = read_manifest(out_dir, require_complete=True)
    res = verify_files(out_dir, manifest, progress)
    if not res.ok:
        raise InputError(f"{res.problems[0]}; refusing to upload an OUT that does not verify "
                         f"(fimoe-convert verify {out_dir})")
    names = sorted({*manifest.files, MANIFEST_NAME})
    sizes = file_sizes(out_dir, names)
    files = [UploadFile(f, sizes[f]) for f in names]
    return out_dir, manifest, files, stray_files(out_dir, set(names))


def check_repo_id(repo_id: str, flag: str = "REPO_ID") -> None:
    """Refuse (UsageError naming `flag`) a repo id the Hub would refuse, before any work is done for it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UsageError(f"{flag} {repo_id!r}: {e}") from None
    if "/" not in repo_id:
        raise UsageError(f"{flag} {repo_id!r}: expected NAMESPACE/NAME (your user or organization, then the repo)")


BRANCH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")  # git's ref rules, a safe subset


def upload(out: str, repo_id: str, *, private: bool = False, revision: str | None = None,
           dry_run: bool = False, token: str | None = None, endpoint: str | None = None,
           commit_message: str | None = None, progress=None) -> UploadResult:
    """Publish a complete, verified OUT folder to the Hub model repo `repo_id`.

    Exactly the files the manifest lists, plus the manifest, are sent (anything else in OUT stays
    local). `create_repo(exist_ok=True)`, the branch `revision` when given, then `upload_folder`:
    with hf_xet installed a resumable multi-commit upload; without it plain LFS uploads whose
    finished objects the Hub keeps. Re-running after an interruption sends only what is missing.
    `dry_run` lists files and bytes and sends nothing. The token is never returned or printed. `progress(done
    bytes, total bytes)` while OUT is re-hashed before anything is sent."""
    from huggingface_hub import HfApi, get_token

    if path_kind(out) != "folder" and path_kind(repo_id) == "folder":
        raise UsageError(f"OUT {out!r} is not a folder but REPO_ID {repo_id!r} is: did you swap them? The command is "
                         f"`fimoe-convert upload OUT REPO_ID` (the reverse of `hf upload REPO_ID PATH`)")
    check_repo_id(repo_id)
    if revision is not None and not BRANCH.fullmatch(revision) or ".." in (revision or "") or \
            (revision or "").endswith((".lock", "/")):
        raise UsageError(f"--revision {revision!r}: not a branch name (letters, digits, '.', '_', '-' and '/' between "
                         "parts; no '..', no leading '/' or '-'), e.g. main or convert-v1")
    out_dir, manifest, files, strays = upload_plan(out, progress)
    total = sum(f.bytes for f in files)
    if dry_run and not token and os.environ.get("HF_OIDC_RESOURCE"):
        found = True  # the OIDC token exchange is a network call: left to the real upload
    else:
        token = token or get_token()
        found = token is not None
    branch = revision or "main"
    summary = UploadResult(repo_id=repo_id, revision=branch, files=len(files), bytes=total, human=human(total),
                           dry_run=dry_run, private=private, list=files, not_uploaded=strays, token_found=found)
    if dry_run:
        return summary
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        raise InputError("HF_HUB_OFFLINE is set: an upload needs the network; unset it for this command "
                         "(--dry-run works offline)")
    if token is None:
        raise InputError("no Hugging Face token found: set HF_TOKEN or run `hf auth login` "
                         "(a token with write access to the namespace of REPO_ID)")

    api = HfApi(endpoint=endpoint, token=token)
    step = "create_repo"
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if private:
            step = "repo_info"
            info = api.repo_info(repo_id, repo_type="model")
            if info.private is False:
                raise InputError(f"REPO_ID {repo_id}: exists and is public; --private does not change the visibility "
                                 "of an existing repo: make it private on the Hub first, or drop --private")
        if revision and revision != "main" and not revision.startswith("refs/"):
            step = "create_branch"
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        step = "upload_folder"
        commit = api.upload_folder(
            repo_id=repo_id, folder_path=str(out_dir), repo_type="model", revision=revision,
            allow_patterns=[_glob_escape(f.file) for f in files],
            commit_message=commit_message or f"Upload {manifest.target.name} conversion (fimoe-convert)")
    except InputError:
        raise
    except Exception as e:  # HfHubHTTPError, transport errors, malformed answers: one line, token removed
        why = f"{type(e).__name__}: {' '.join(str(e).split())}"
        cause = e.__cause__ or e.__context__
        if cause is not None and str(cause) and str(cause) not in why:
            why += f" ({type(cause).__name__}: {' '.join(str(cause).split())})"
        raise InputError(_redact(f"upload to {repo_id}@{branch} failed at {step}: {why}; run the same command "
                                 "again to resume (what reached the Hub is not sent again)", token)) from e
    summary.commit = getattr(commit, "oid", None)
    summary.url = f"{api.endpoint}/{repo_id}" + (f"/tree/{revision}" if revision else "")
    return summary
