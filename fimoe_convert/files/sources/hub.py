"""Reading from the Hugging Face Hub: SRC resolved (a local folder as is, a repo id from the cache or downloaded),
`hf download --local-dir` records read, and a checkpoint described without downloading its weights.

For `inspect` and `--dry-run` of a repo id whose weights are not in the cache (at V4 size a download takes hours
before anything is said), config.json and the index are fetched into the cache (small files), and each shard's
header is read from the Hub with two ranged reads (its length, then its JSON) by http_range's `read_head`, then
validated exactly as a local header is. Hand-written beside huggingface_hub's `parse_safetensors_file_metadata`,
which returns parsed tensors without the header's bytes or the file's size: the strict checks a local header gets
(offsets within the file) need both."""

from __future__ import annotations

import difflib
import os
import queue
import re
import struct
import threading
from pathlib import Path

from ...errors import InputError, UsageError, redact
from ..names import INDEX_NAME, MANIFEST_NAME
from ..safetensors.header import MAX_HEADER_BYTES, Header, parse_header
from .http_range import read_head

# What a Hub download fetches: weights, configs, tokenizer files; not code or docs folders.
HUB_PATTERNS = ["*.safetensors", "*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "tokenizer*"]
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
METADATA_MAX_BYTES = 4096  # a `hf download --local-dir` metadata file is three short lines
FIRST_BYTES = 1 << 20  # the first request asks for this much: most headers (V4's are about 100-300 KB) fit
HEADER_THREADS = 8  # shard headers read from the Hub at once (V4-Pro has about 64 shards)
WAIT_STEP_S = 0.5  # the main thread wakes this often while headers are read: a signal is handled at once


# What `hf download --local-dir` leaves beside each file: commit, etag (an LFS file's sha256), download time.
LOCAL_DIR_METADATA = ".cache/huggingface/download/{rel}.metadata"


def local_dir_sha256(root: Path, rel: str) -> str | None:
    """The sha256 huggingface_hub recorded when it downloaded `rel` into the folder `root` (`--local-dir`), if the
    file has not changed since (huggingface_hub's own rule: mtime at most 1 s past the recorded time); else None.
    Read here without huggingface_hub's reader, which takes a lock file and deletes bad metadata: SRC is only read."""
    meta = root / LOCAL_DIR_METADATA.format(rel=rel)
    try:
        with open(meta, "rb") as f:
            lines = f.read(METADATA_MAX_BYTES).decode("utf-8").splitlines()
        etag, stamp = lines[1].strip(), float(lines[2])
        fresh = (root / rel).stat().st_mtime - 1 <= stamp
    except (OSError, IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return etag if fresh and SHA256_RE.match(etag) else None


def download(spec: str, revision: str | None) -> dict:
    """Fetch the files a conversion of the Hub repo `spec` reads into the Hugging Face cache (resumable)."""
    if not _is_repo_id(spec):
        raise UsageError(f"SRC {spec!r}: not a Hub repo id (org/name); only a Hub repo is downloaded")
    root = resolve_source_root(spec, revision, offline=False)[0]
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {"repo_id": spec, "revision": root.name, "path": str(root), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files)}


HUB_PROBE_TIMEOUT_S = 5.0  # seconds for the first request to the Hub (a HEAD of config.json)
_REACHED: set[tuple[str, str, str | None]] = set()  # (endpoint, repo, revision) that answered reach_hub in this process


def _is_repo_id(spec: str) -> bool:
    """org/name, unless `org` is a folder here: then SRC is a path (a typo in demo-out/src is not a Hub request)."""
    return (bool(_REPO_ID_RE.match(spec)) and not spec.startswith((".", "/"))
            and not Path(spec.split("/", 1)[0]).expanduser().is_dir())


def _no_such_folder(spec: str) -> str:
    """SRC names no folder and no Hub repo: say so, with the nearest folder above it that exists and the entries of
    it that are closest to the missing part."""
    path = Path(spec).expanduser()
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        path, parent = parent, parent.parent
    try:
        names = sorted(p.name for p in parent.iterdir() if p.is_dir())
    except OSError:
        names = []
    close = difflib.get_close_matches(path.name, names, n=2, cutoff=0.6)
    shown = "" if str(parent) == "." else f"{parent}/"
    hint = (f"did you mean {' or '.join(repr(shown + c) for c in close)}?" if close else
            f"{shown or 'this folder'} has {', '.join(names[:8]) + (', ...' if len(names) > 8 else '')}" if names
            else f"{shown or 'this folder'} has no folders")
    repo = (f"; with the folder {spec.split('/', 1)[0]!r} here, SRC is a path, not a Hub repo id"
            if _REPO_ID_RE.match(spec) and not spec.startswith((".", "/")) else "")
    return f"SRC {spec!r}: no such folder ({path.name!r} is not in {shown or 'this folder'}{repo}); {hint}"


is_repo_id = _is_repo_id


def check_source(spec: str, revision: str | None, offline: bool) -> None:
    """SRC's checks that need neither torch nor a download (the CLI runs them before importing the converters):
    a folder, or a Hub repo id that the Hub has (one short request)."""
    path = Path(spec).expanduser()
    if path.is_dir() or path.exists() or not _is_repo_id(spec):
        if not path.is_dir():
            resolve_source_root(spec, revision, offline)  # raises its UsageError
        return
    if not (offline or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}):
        reach_hub(spec, revision)


def resolve_source_root(spec: str, revision: str | None, offline: bool,
                        weights: bool = True) -> tuple[Path, Path, str | None, str | None]:
    """(root, allowed_root, repo_id, revision): a local folder as is; a Hub repo id downloaded (or found in the
    cache when offline) with huggingface_hub. `weights=False` (and online): only the small files that describe the
    checkpoint (config, index, manifest) into the revision's snapshot folder, beside any shards already there."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if revision:
            raise UsageError(f"--revision {revision}: SRC {spec!r} is a local folder; --revision applies to Hub "
                             "repos only")
        root = path.resolve()
        return root, root, None, None
    if path.exists():
        raise UsageError(f"SRC {spec!r} is a file; expected a checkpoint folder or a Hub repo id (org/name)")
    if not _is_repo_id(spec):
        if _REPO_ID_RE.match(spec) or "/" in spec:
            raise UsageError(_no_such_folder(spec))
        raise UsageError(f"SRC {spec!r}: no such folder, and not a Hub repo id (org/name)")
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = offline or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    if not offline:
        reach_hub(spec, revision)
    try:
        if not weights and not offline:
            snap = describing_files(spec, revision)
        else:  # the cache location is read now, not at huggingface_hub's import, so a changed HF_HUB_CACHE counts
            snap = Path(huggingface_hub.snapshot_download(spec, revision=revision, allow_patterns=HUB_PATTERNS,
                                                          local_files_only=offline,
                                                          cache_dir=os.environ.get("HF_HUB_CACHE")))
    except LocalEntryNotFoundError:
        hint = "run once without --offline/HF_HUB_OFFLINE=1 to fetch it" if offline else "check the network"
        raise InputError(f"SRC {spec!r} (revision {revision or 'main'}): not in the local Hugging Face cache; "
                         f"{hint}") from None
    except HfHubHTTPError as e:
        raise InputError(f"SRC {spec!r}: the Hub refused the download ({e.__class__.__name__}); "
                         "check the repo id, --revision and your token (HF_TOKEN)") from None
    except ValueError as e:  # huggingface_hub refuses a listed name that leaves the repo ('..', absolute)
        raise InputError(outside_repo(spec, e)) from None
    except OSError as e:  # the cache folder, or a transfer error huggingface_hub raises as an OSError
        raise InputError(f"SRC {spec!r}: cannot reach the Hub ({e.__class__.__name__}: {e}); check the network, or "
                         "pass --offline to use the local cache") from None
    # A cache snapshot is snapshots/<commit>/ whose files link into ../../blobs of the same repo.
    commit = snap.name if re.fullmatch(r"[0-9a-f]{40}", snap.name) else revision
    allowed = snap.parent.parent.resolve() if snap.parent.name == "snapshots" else snap.resolve()
    return snap, allowed, spec, commit


def remote_header(repo_id: str, filename: str, revision: str, token=None) -> Header:
    """The validated header of the safetensors file `filename` of `repo_id` at `revision`, read from the Hub."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=revision)
    where = f"{repo_id}/{filename}@{revision}"
    data, size = read_head(url, 0, FIRST_BYTES - 1, token, where)
    if len(data) < 8:
        raise InputError(f"{where}: {size} bytes, too short for a safetensors header; the file on the Hub is not a "
                         "safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data) and n <= MAX_HEADER_BYTES and 8 + n <= size:
        data += read_head(url, len(data), 8 + n - 1, token, where)[0]
    header = parse_header(data[:8], lambda k: data[8:8 + k], size, where)
    return Header(Path(filename), header.file_size, header.data_start, header.tensors, header.metadata)


def reach_hub(repo_id: str, revision: str | None) -> None:
    """One request, no retries, a few seconds at most: a repo the Hub does not have and a Hub that cannot be
    reached are told apart in one line (huggingface_hub's downloads retry for about 30 s before they give up)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if (constants.ENDPOINT, repo_id, revision) in _REACHED:  # the CLI's early check: not asked again by the library
        return
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision), timeout=HUB_PROBE_TIMEOUT_S)
        _REACHED.add((constants.ENDPOINT, repo_id, revision))
    except HfHubHTTPError as e:  # the Hub answered; its X-Error-Code says what it has not (not every version maps it)
        response = getattr(e, "response", None)
        code = response.headers.get("X-Error-Code", "") if response is not None else ""
        status = response.status_code if response is not None else None
        if isinstance(e, RevisionNotFoundError) or code == "RevisionNotFound":
            raise InputError(f"--revision {revision}: SRC {repo_id!r} has no such branch, tag or commit") from None
        if isinstance(e, RepositoryNotFoundError) or code == "RepositoryNotFound" or (
                status in (401, 404) and code != "EntryNotFound"):
            raise InputError(f"SRC {repo_id!r}: no such repo on the Hub (or it is private or gated: log in with "
                             "`hf auth login` or set HF_TOKEN); check the repo id") from None
        # else the download that follows reports what the Hub refuses
    except Exception as e:  # noqa: BLE001 - the HTTP client's transport errors (no network, refused, timed out)
        raise InputError(f"SRC {repo_id!r}: cannot reach the Hub at {constants.ENDPOINT} (no network? "
                         f"{e.__class__.__name__}); pass --offline to use the local cache, or run `fimoe-convert "
                         "download SRC` where there is network") from None


def outside_repo(spec: str, e: ValueError) -> str:
    """The line for a Hub file list that names a path outside the repo."""
    return (f"SRC {spec!r}: the Hub's file list names a path outside the repo ({' '.join(str(e).split())[:200]}); "
            "nothing was written for it: the repo is damaged, convert another revision or ask its owner")


def describing_files(repo_id: str, revision: str | None) -> Path:
    """The revision's snapshot folder, holding the files that describe the checkpoint (config.json; the index and
    a manifest where the repo has them), downloaded into the cache: kilobytes, where the weights are hundreds of
    GB. Shards an earlier download left in that folder are used as they are."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE")
    config = Path(huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache))
    commit = config.parent.name  # pinned: the other files and the headers come from the same commit
    for name in (INDEX_NAME, MANIFEST_NAME):
        try:
            huggingface_hub.hf_hub_download(repo_id, name, revision=commit, cache_dir=cache)
        except EntryNotFoundError:
            pass
    return config.parent


def remote_headers(repo_id: str, revision: str, names: list[str]) -> tuple[dict[str, Header], list[str]]:
    """({shard: header} read from the Hub, problems), on a few threads: one round trip per shard, each small."""
    def one(rel: str):
        try:
            return remote_header(repo_id, rel, revision), None
        except InputError as e:
            return None, str(e)
        except OSError as e:  # the cache folder, huggingface_hub's own HTTP errors
            return None, redact(f"{repo_id}/{rel}@{revision}: reading its header from the Hub failed "
                                f"({e.__class__.__name__}: {' '.join(str(e).split())[:200]}); check the network and "
                                "token")

    results = on_daemon_threads(one, list(dict.fromkeys(names)), HEADER_THREADS, "fimoe-remote-header")
    return {r: h for r, (h, _) in results.items() if h is not None}, [p for _, p in results.values() if p]


def on_daemon_threads(fn, items: list, threads: int, name: str) -> dict:
    """{item: fn(item)} computed on daemon threads, which a Ctrl-C or SIGTERM does not wait for (a pool's
    threads are joined at exit, and a stuck request would hold the process); the main thread wakes every
    WAIT_STEP_S, so its signal handler runs at once."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()
    for item in items:
        todo.put(item)

    def work():
        while True:
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((item, fn(item), None))
            except BaseException as e:  # noqa: BLE001 - raised again in the main thread, which would wait forever
                done.put((item, None, e))

    for _ in range(min(threads, len(items))):
        threading.Thread(target=work, daemon=True, name=name).start()
    results: dict = {}
    while len(results) < len(items):
        try:
            item, value, error = done.get(timeout=WAIT_STEP_S)
        except queue.Empty:
            continue
        if error is not None:
            raise error
        results[item] = value
    return {item: results[item] for item in items}
