"""The model card written into OUT, and `upload` of a finished, verified OUT to the Hub."""

from __future__ import annotations

from pathlib import Path

from .errors import InputError
from .manifest import MANIFEST_NAME, read_manifest, verify_files
from .units import human

LIBRARY_NAME = "fimoe-convert"


def model_card(manifest: dict, command: str | None = None) -> str:
    """README.md text for a converted checkpoint (huggingface_hub's ModelCard, YAML header first)."""
    from huggingface_hub import ModelCard, ModelCardData

    src = manifest["source"]
    tgt = manifest["target"]
    tool = manifest["tool"]
    base = src.get("repo_id")
    data = ModelCardData(
        base_model=base,
        library_name=LIBRARY_NAME,
        tags=sorted({"deepseek_v4", "fimoe-convert", "moe", tgt["name"], *(["flashinfer"] if tgt["kernel_name"] else [])}),
    )
    caps = ", ".join(tgt["capabilities"]) or "any"
    runtime = ["torch.distributed"] + (["NVSHMEM"] if tgt["needs_nvshmem"] else []) if tgt["kernel_name"] else []
    if tgt["name"] == "bf16":
        load = ("# BF16 routed experts under their original names: load as a regular DeepSeek V4 checkpoint\n"
                "from safetensors import safe_open")
    elif tgt.get("runtime_module") == "flashinfer.megamoe":
        load = ("from fimoe_convert.runtime import load_megamoe_weights\n"
                "l1, l2, l1_scales, l2_scales = load_megamoe_weights(\"OUT\", \"layers.0\", rank=0, device=\"cuda\")")
    else:
        load = ("from fimoe_convert.runtime import mega_config\n"
                "cfg = mega_config(\"OUT\", \"layers.0\", rank=0, device=\"cuda\")  # MegaConfig, preprocess_weights=False")
    geometry = manifest["model"]
    lines = [
        f"# {base or Path(src['spec']).name} for `{tgt['name']}`",
        "",
        f"DeepSeek V4 checkpoint whose routed experts were converted offline by {LIBRARY_NAME} "
        f"{tool['version']} for `{tgt['name']}`"
        + (f" (FlashInfer kernel `{tgt['kernel_name']}`)" if tgt["kernel_name"] else "") + ".",
        "",
        "| | |",
        "|---|---|",
        f"| base model | {base or src['spec']} (revision {src.get('revision') or 'local folder'}) |",
        f"| target | `{tgt['name']}`; weights {tgt['weight_format']}, activations {tgt['activation_format']} |",
        f"| compute capabilities | {caps} |",
        f"| runtime needs | {', '.join(runtime) or 'none beyond the engine'} |",
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
        command or f"fimoe-convert {src['spec']} OUT --target {tgt['name']} --ep-size {manifest['ep']['world_size']}",
        "```",
        "",
        "Load:",
        "",
        "```python",
        load,
        "```",
        "",
        f"`{MANIFEST_NAME}` lists every file with its sha256; `fimoe-convert verify OUT` checks them.",
        "",
    ]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def upload(out: str, repo_id: str, *, private: bool = False, revision: str | None = None,
           dry_run: bool = False, token: str | None = None) -> dict:
    """Publish a complete, verified OUT folder to the Hub (resumable; the token is never printed)."""
    out_dir = Path(out)
    manifest = read_manifest(out_dir, require_complete=True)
    res = verify_files(out_dir, manifest)
    if not res.ok:
        raise InputError(f"{out_dir}: does not verify, refusing to upload: {res.problems[0]}")
    files = sorted([*manifest["files"], MANIFEST_NAME])
    total = sum((out_dir / f).stat().st_size for f in files)
    summary = {"repo_id": repo_id, "revision": revision or "main", "files": len(files), "bytes": total,
               "human": human(total), "dry_run": dry_run, "private": private}
    if dry_run:
        summary["list"] = [{"file": f, "bytes": (out_dir / f).stat().st_size} for f in files]
        return summary
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=str(out_dir), revision=revision,
                               allow_patterns=files, commit_message=f"Upload {manifest['target']['name']} conversion")
    summary["commit"] = getattr(commit, "oid", None)
    return summary
