"""The model card written into OUT, and `upload` of a finished, verified OUT to the Hub.

The token comes from huggingface_hub's usual sources (the `token` argument, `HF_TOKEN`, the file
written by `hf auth login`); it is sent in the Authorization header only and never appears in a
result, a message or the card."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import InputError, UsageError
from .files.output import MANIFEST_NAME, file_sizes, path_kind, read_manifest, verify_files
from .files.output import strays as stray_files
from .sizes import human

LIBRARY_NAME = "fimoe-convert"
_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{8,}")


def runtime_needs(target: dict) -> list[str]:
    """What the serving process must provide for the output of `target` (manifest record)."""
    if not target.get("kernel_name"):
        return []
    if target.get("runtime_module") == "flashinfer.megamoe":
        return ["torch.distributed (process group)", "torch symmetric memory (MegaMoESymmBuffer)"]
    return ["torch.distributed"] + (["NVSHMEM"] if target.get("needs_nvshmem") else [])


def _load_snippet(manifest: dict) -> str:
    tgt = manifest["target"]
    layer = next(iter(manifest.get("layers") or {"layers.0": None}))
    fetch = ('from huggingface_hub import snapshot_download\n'
             'out = snapshot_download("REPO_ID")  # or the local OUT folder\n')
    if not tgt.get("kernel_name"):
        name = f"{layer}.ffn.experts.0.w1.weight"
        if tgt["name"] == "fp8_block":
            what = ("# FP8 E4M3 routed experts with `.scale` tile scales under their original names: serve it as\n"
                    "# a DeepSeek V4 FP8 checkpoint (E8M0 scales: SGLang, DeepSeek's inference code; F32 scales with\n"
                    "# expert_dtype fp8: vLLM), or read a tensor directly:\n")
            kind = "FP8 E4M3 [out, in]"
        else:
            what = ("# BF16 routed experts under their original names: serve it as a regular DeepSeek V4\n"
                    "# checkpoint with BF16 experts (no shim needed), or read a tensor directly:\n")
            kind = "BF16 [out, in]"
        return (fetch + what +
                "import json, os\nfrom safetensors import safe_open\n"
                'weight_map = json.load(open(os.path.join(out, "model.safetensors.index.json")))["weight_map"]\n'
                f'with safe_open(os.path.join(out, weight_map["{name}"]), "pt") as f:\n'
                f'    w1 = f.get_tensor("{name}")  # {kind}')
    if tgt.get("runtime_module") == "flashinfer.megamoe":
        return (fetch + "from fimoe_convert.runtime import load_megamoe_weights\n"
                f'l1, l2, l1_scales, l2_scales = load_megamoe_weights(out, "{layer}", rank=0, device="cuda")\n'
                "# flashinfer.megamoe.mxfp4_mega_moe(y, l1, l2, symm_buffer, num_tokens=m,\n"
                "#     l1_global_scales=l1_scales, l2_global_scales=l2_scales)")
    return (fetch + "from fimoe_convert.runtime import mega_config\n"
            f'cfg = mega_config(out, "{layer}", rank=0, device="cuda")  # MegaConfig(preprocess_weights=False, ...)')


def _fallback_command(manifest: dict) -> str:
    """The CLI command equivalent to a library call that did not say how it was called."""
    src, opts = manifest["source"], manifest.get("options", {})
    parts = ["fimoe-convert", src["spec"], "OUT", "--target", manifest["target"]["name"]]
    if src.get("revision") and src.get("repo_id"):
        parts += ["--revision", src["revision"]]
    if manifest["ep"]["world_size"] != 1:
        parts += ["--ep-size", str(manifest["ep"]["world_size"])]
    if opts.get("arch"):
        parts += ["--arch", str(opts["arch"])]
    if opts.get("allow_lossy"):
        parts.append("--allow-lossy")
    parts += [f"--param {k}={v}" for k, v in sorted((opts.get("params") or {}).items())]
    return " ".join(parts)


def model_card(manifest: dict, command: str | None = None) -> str:
    """README.md text for a converted checkpoint: huggingface_hub's ModelCard, YAML header first.

    Deterministic (no dates, sorted keys) so that two conversions give the same bytes."""
    from huggingface_hub import ModelCard, ModelCardData

    src = manifest["source"]
    tgt = manifest["target"]
    tool = manifest["tool"]
    geometry = manifest["model"]
    base = src.get("repo_id")
    revision = src.get("revision")
    caps = list(tgt.get("capabilities") or [])
    needs = runtime_needs(tgt)
    command = command or _fallback_command(manifest)
    tags = {"deepseek_v4", LIBRARY_NAME, "moe", tgt["name"]}
    if tgt["kernel_name"]:
        tags |= {"flashinfer", *[f"sm{c.replace('.', '')}" for c in caps]}
    meta = {
        "source": {"repo_id": base, "revision": revision} if base else {"path": src["spec"]},
        "target": tgt["name"],
        "kernel_name": tgt["kernel_name"],
        "vllm_moe_backend": tgt["vllm_moe_backend"],
        "compute_capabilities": caps,
        "runtime_needs": needs,
        "needs_nvshmem": bool(tgt["needs_nvshmem"]),
        "ep_size": manifest["ep"]["world_size"],
        "command": command,
        "versions": {"fimoe-convert": tool["version"], "torch": tool["torch"], "flashinfer": tool["flashinfer"],
                     "safetensors": tool["safetensors"]},
    }
    data = ModelCardData(base_model=base, library_name=LIBRARY_NAME, tags=sorted(tags), fimoe_convert=meta)
    name = base or Path(src["spec"]).name
    lines = [
        f"# {name} for `{tgt['name']}`",
        "",
        f"DeepSeek V4 checkpoint whose routed experts were converted offline by {LIBRARY_NAME} "
        f"{tool['version']} for `{tgt['name']}`"
        + (f" (FlashInfer kernel `{tgt['kernel_name']}`)" if tgt["kernel_name"] else "")
        + ". Everything else is copied byte for byte from the base model.",
        "",
        "| | |",
        "|---|---|",
        f"| base model | {base or src['spec']} (revision {revision or 'local folder, no revision'}) |",
        f"| target | `{tgt['name']}`; weights {tgt['weight_format']}, activations {tgt['activation_format']} |",
        f"| compute capabilities | {', '.join(caps) or 'any'} |",
        f"| runtime needs | {', '.join(needs) or 'none beyond the engine'} |",
        f"| NVSHMEM | {'needed' if tgt['needs_nvshmem'] else 'not needed'} |",
        f"| vLLM --moe-backend | {tgt['vllm_moe_backend'] or '-'} |",
        f"| expert parallel size | {manifest['ep']['world_size']} |",
        f"| geometry | hidden {geometry['hidden_size']}, moe_intermediate {geometry['moe_intermediate_size']}, "
        f"{geometry['n_routed_experts']} experts, {geometry['moe_blocks']} MoE blocks |",
        f"| tools | fimoe-convert {tool['version']}, torch {tool['torch']}, flashinfer {tool['flashinfer'] or '-'}, "
        f"safetensors {tool['safetensors']} |",
        "",
        "Made with:",
        "",
        "```",
        command,
        "```",
        "",
        "Load" + (" with the fimoe-convert runtime shim (no load-time transform):" if tgt["kernel_name"] else ":"),
        "",
        "```python",
        _load_snippet(manifest),
        "```",
        "",
        f"`{MANIFEST_NAME}` lists every file with its size and sha256; `fimoe-convert verify OUT` checks them.",
        "",
    ]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def _redact(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "<token>")
    return _TOKEN_RE.sub("hf_<token>", text)


def _glob_escape(name: str) -> str:
    """An allow_patterns entry (fnmatch) that matches exactly `name`."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


def upload_plan(out: str, progress=None) -> tuple[Path, dict, list[dict], list[str]]:
    """(OUT, manifest, [{file, bytes}], strays) for a complete OUT whose files all match the manifest.

    Refuses (InputError naming the file) an unfinished or damaged OUT."""
    out_dir = Path(out)
    manifest = read_manifest(out_dir, require_complete=True)
    res = verify_files(out_dir, manifest, progress)
    if not res.ok:
        raise InputError(f"{res.problems[0]}; refusing to upload an OUT that does not verify "
                         f"(fimoe-convert verify {out_dir})")
    names = sorted({*manifest["files"], MANIFEST_NAME})
    sizes = file_sizes(out_dir, names)
    files = [{"file": f, "bytes": sizes[f]} for f in names]
    return out_dir, manifest, files, stray_files(out_dir, set(names))


BRANCH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")  # git's ref rules, a safe subset


def upload(out: str, repo_id: str, *, private: bool = False, revision: str | None = None,
           dry_run: bool = False, token: str | None = None, endpoint: str | None = None,
           commit_message: str | None = None, progress=None) -> dict:
    """Publish a complete, verified OUT folder to the Hub model repo `repo_id`.

    Exactly the files the manifest lists, plus the manifest, are sent (anything else in OUT stays
    local). `create_repo(exist_ok=True)`, the branch `revision` when given, then `upload_folder`:
    with hf_xet installed a resumable multi-commit upload; without it plain LFS uploads whose
    finished objects the Hub keeps. Re-running after an interruption sends only what is missing.
    `dry_run` lists files and bytes and sends nothing. The token is never returned or printed. `progress(done
    bytes, total bytes)` while OUT is re-hashed before anything is sent."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if path_kind(out) != "folder" and path_kind(repo_id) == "folder":
        raise UsageError(f"OUT {out!r} is not a folder but REPO_ID {repo_id!r} is: did you swap them? The command is "
                         f"`fimoe-convert upload OUT REPO_ID` (the reverse of `hf upload REPO_ID PATH`)")

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UsageError(f"REPO_ID {repo_id!r}: {e}") from None
    if "/" not in repo_id:
        raise UsageError(f"REPO_ID {repo_id!r}: expected NAMESPACE/NAME (your user or organization, then the repo)")
    if revision is not None and not BRANCH.fullmatch(revision) or ".." in (revision or "") or \
            (revision or "").endswith((".lock", "/")):
        raise UsageError(f"--revision {revision!r}: not a branch name (letters, digits, '.', '_', '-' and '/' between "
                         "parts; no '..', no leading '/' or '-'), e.g. main or convert-v1")
    out_dir, manifest, files, strays = upload_plan(out, progress)
    total = sum(f["bytes"] for f in files)
    if dry_run and not token and os.environ.get("HF_OIDC_RESOURCE"):
        found = True  # the OIDC token exchange is a network call: left to the real upload
    else:
        token = token or get_token()
        found = token is not None
    branch = revision or "main"
    summary = {"repo_id": repo_id, "revision": branch, "files": len(files), "bytes": total, "human": human(total),
               "dry_run": dry_run, "private": private, "list": files, "not_uploaded": strays, "token_found": found}
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
            allow_patterns=[_glob_escape(f["file"]) for f in files],
            commit_message=commit_message or f"Upload {manifest['target']['name']} conversion (fimoe-convert)")
    except InputError:
        raise
    except Exception as e:  # HfHubHTTPError, transport errors, malformed answers: one line, token removed
        why = f"{type(e).__name__}: {' '.join(str(e).split())}"
        cause = e.__cause__ or e.__context__
        if cause is not None and str(cause) and str(cause) not in why:
            why += f" ({type(cause).__name__}: {' '.join(str(cause).split())})"
        raise InputError(_redact(f"upload to {repo_id}@{branch} failed at {step}: {why}; run the same command "
                                 "again to resume (what reached the Hub is not sent again)", token)) from e
    summary["commit"] = getattr(commit, "oid", None)
    summary["url"] = f"{api.endpoint}/{repo_id}" + (f"/tree/{revision}" if revision else "")
    return summary
