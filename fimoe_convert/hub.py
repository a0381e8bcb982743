"""The model card written into OUT (README.md): what the output is, how to load it, what it was made from.
`upload.py` publishes OUT."""

from __future__ import annotations

from pathlib import Path

from .files.names import MANIFEST_NAME

LIBRARY_NAME = "fimoe-convert"


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
