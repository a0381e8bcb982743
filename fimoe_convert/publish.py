"""`upload` of a finished, verified OUT to the Hub.

The token comes from huggingface_hub's usual sources (the `token` argument, `HF_TOKEN`, the file
written by `hf auth login`); it is sent in the Authorization header only and never appears in a
result or a message."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import InputError, UsageError, redact
from .files.names import MANIFEST_NAME
from .files.output.folder import file_sizes, path_kind, strays as stray_files, verify_files
from .files.output.lock import OutLock
from .files.output.manifest import read_manifest
from .files.output.pinned import changed, pin_bytes, pin_files
from .records import Manifest, UploadFile, UploadResult
from .sizes import human

_redact = redact


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


def check_access(repo_id: str, *, token: str | None = None, endpoint: str | None = None,
                 flag: str = "REPO_ID") -> str:
    """The token to upload with, once the Hub has answered that it is valid and may write into `repo_id`'s
    namespace: an InputError naming what is missing (no token, offline, the network, a read-only token, another
    namespace) before any work is done for the upload. Returns the token (never printed)."""
    from huggingface_hub import HfApi, get_token

    if os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        raise InputError(f"{flag} {repo_id}: HF_HUB_OFFLINE is set: an upload needs the network; unset it for this "
                         "command (--dry-run works offline)")
    token = token or get_token()
    if token is None:
        raise InputError(f"{flag} {repo_id}: no Hugging Face token found: set HF_TOKEN or run `hf auth login` "
                         "(a token with write access to the namespace of the repo), or pass --token")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        me = api.whoami()
    except Exception as e:  # HfHubHTTPError (401: the token is refused), transport errors
        status = getattr(getattr(e, "response", None), "status_code", None)
        why = ("the Hub refuses the token (HTTP 401): it is expired or mistyped; make a new one at "
               "https://huggingface.co/settings/tokens" if status == 401 else
               f"cannot reach {api.endpoint} ({type(e).__name__}: {' '.join(str(e).split())[:200]}); check the "
               "network or HF_ENDPOINT")
        raise InputError(_redact(f"{flag} {repo_id}: {why}", token)) from None
    namespace = repo_id.split("/")[0]
    names = {me.get("name"), *[o.get("name") for o in me.get("orgs") or [] if isinstance(o, dict)]}
    if namespace not in names:
        raise InputError(f"{flag} {repo_id}: the token is {me.get('name')!r}'s, who is not {namespace!r} nor a member "
                         f"of it; use {me.get('name')}/NAME, or a token of a member of {namespace}")
    access = (me.get("auth") or {}).get("accessToken") or {}
    if access.get("role") == "read":
        raise InputError(f"{flag} {repo_id}: the token is read-only; make one with write access at "
                         "https://huggingface.co/settings/tokens")
    if access.get("role") == "fineGrained" and not _fine_grained_writes(access.get("fineGrained") or {}, repo_id):
        raise InputError(f"{flag} {repo_id}: the fine-grained token has no write permission (repo.write) on "
                         f"{namespace} or on {repo_id}; add it at https://huggingface.co/settings/tokens")
    return token


def _fine_grained_writes(grants: dict, repo_id: str) -> bool:
    """Whether a fine-grained token's scopes let it write `repo_id` (its namespace's repos, or the repo itself)."""
    namespace = repo_id.split("/")[0]
    for scope in grants.get("scoped") or []:
        entity = scope.get("entity") or {}
        if entity.get("name") in (namespace, repo_id) and "repo.write" in (scope.get("permissions") or []):
            return True
    return "repo.write" in (grants.get("global") or [])


def finish_command(out: str, repo_id: str, revision: str | None, create_pr: bool) -> str:
    """The command that finishes an upload that failed: it sends only what has not reached the Hub."""
    return (f"fimoe-convert upload {out} {repo_id}" + (f" --revision {revision}" if revision else "")
            + (" --create-pr" if create_pr else ""))


def upload(out: str, repo_id: str, *, private: bool = False, revision: str | None = None,
           dry_run: bool = False, token: str | None = None, endpoint: str | None = None,
           commit_message: str | None = None, commit_description: str | None = None, create_pr: bool = False,
           progress=None, lock: bool = True) -> UploadResult:
    """Publish a complete, verified OUT folder to the Hub model repo `repo_id`.

    Exactly the files the manifest lists, plus the manifest, are sent (anything else in OUT stays local), each
    opened once without following a link and sent from that open file; before the commit, the sha256 of every
    file as sent is compared with the manifest's, so the commit holds the bytes that were verified. OUT stays
    locked throughout (`lock`; convert's --upload-repo holds the lock already). `create_repo(exist_ok=True)`,
    the branch `revision` when given (created if missing, as `hf upload` does), the files (LFS or Xet; what
    reached the Hub is not sent again by a later run), then one commit, or a pull request with `create_pr`.
    `dry_run` lists files and bytes and sends nothing. The token is never returned or printed. `progress(done
    bytes, total bytes)` while OUT is re-hashed before anything is sent."""
    from huggingface_hub import CommitOperationAdd, HfApi, get_token

    if path_kind(out) != "folder" and path_kind(repo_id) == "folder":
        raise UsageError(f"OUT {out!r} is not a folder but REPO_ID {repo_id!r} is: did you swap them? The command is "
                         f"`fimoe-convert upload OUT REPO_ID` (the reverse of `hf upload REPO_ID PATH`)")
    check_repo_id(repo_id)
    if revision is not None and not BRANCH.fullmatch(revision) or ".." in (revision or "") or \
            (revision or "").endswith((".lock", "/")):
        raise UsageError(f"--revision {revision!r}: not a branch name (letters, digits, '.', '_', '-' and '/' between "
                         "parts; no '..', no leading '/' or '-'), e.g. main or convert-v1")
    branch = revision or "main"
    if dry_run:
        out_dir, manifest, files, strays = upload_plan(out, progress)
        total = sum(f.bytes for f in files)
        found = True if not token and os.environ.get("HF_OIDC_RESOURCE") else (token or get_token()) is not None
        return UploadResult(repo_id=repo_id, revision=branch, files=len(files), bytes=total, human=human(total),
                            dry_run=True, private=private, list=files, not_uploaded=strays, token_found=found)
    read_manifest(Path(out), require_complete=True)  # a folder that is no finished output: said before the network
    token = check_access(repo_id, token=token, endpoint=endpoint)
    held = OutLock(Path(out)) if lock else None
    if held is not None:
        held.acquire()  # a conversion into OUT (--overwrite, --resume) waits for the upload's end
    pinned = []
    try:
        manifest_bytes = pin_bytes(Path(out) / MANIFEST_NAME)
        out_dir, manifest, files, strays = upload_plan(out, progress)
        if pin_bytes(out_dir / MANIFEST_NAME) != manifest_bytes:
            raise InputError(f"{out_dir / MANIFEST_NAME}: changed while OUT was verified; run the upload again")
        pinned = pin_files(out_dir, manifest.files)
        ops = [CommitOperationAdd(MANIFEST_NAME, manifest_bytes)]
        ops += [CommitOperationAdd(p.name, p.data if p.data is not None else p.via) for p in pinned]
        total = sum(f.bytes for f in files)
        summary = UploadResult(repo_id=repo_id, revision=branch, files=len(files), bytes=total, human=human(total),
                               dry_run=False, private=private, list=files, not_uploaded=strays, token_found=True)
        api = HfApi(endpoint=endpoint, token=token)
        commit = _send(api, repo_id, out_dir, manifest, ops, private=private, revision=revision,
                       create_pr=create_pr, message=commit_message, description=commit_description, token=token,
                       finish=finish_command(out, repo_id, revision, create_pr))
    finally:
        for p in pinned:
            p.close()
        if held is not None:
            held.release()
    summary.commit = getattr(commit, "oid", None)
    summary.pr_url = getattr(commit, "pr_url", None)
    summary.url = f"{api.endpoint}/{repo_id}" + (f"/tree/{revision}" if revision else "")
    return summary


def _send(api, repo_id: str, out_dir: Path, manifest: Manifest, ops: list, *, private: bool, revision: str | None,
          create_pr: bool, message: str | None, description: str | None, token: str, finish: str):
    """The repo, the branch, the files' bytes, their sha256 as sent against the manifest, then the commit."""
    branch = revision or "main"
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
        step = "preupload"
        api.preupload_lfs_files(repo_id, additions=ops, repo_type="model", revision=revision, create_pr=create_pr)
        for op in ops[1:]:  # the manifest is sent from the bytes read (and parsed) above
            want = manifest.files[op.path_in_repo].sha256
            got = op.upload_info.sha256.hex()  # as hf_xet or the LFS upload hashed the bytes it sent
            if want is not None and got != want:
                raise changed(out_dir / op.path_in_repo, got, want)
        step = "create_commit"
        return api.create_commit(
            repo_id, operations=ops, repo_type="model", revision=revision, create_pr=create_pr,
            commit_message=message or f"Upload {manifest.target.name} conversion (fimoe-convert)",
            commit_description=description)
    except InputError:
        raise
    except Exception as e:  # HfHubHTTPError, transport errors, malformed answers: one line, token removed
        why = f"{type(e).__name__}: {' '.join(str(e).split())}"
        cause = e.__cause__ or e.__context__
        if cause is not None and str(cause) and str(cause) not in why:
            why += f" ({type(cause).__name__}: {' '.join(str(cause).split())})"
        raise InputError(_redact(f"upload to {repo_id}@{branch} failed at {step}: {why}; finish it with `{finish}` "
                                 "(what reached the Hub is not sent again)", token)) from e
