"""The model card written into OUT (README.md): what the output is, how it was made, how to load it."""

from __future__ import annotations

import re
from pathlib import Path

from .files.names import MANIFEST_NAME
from .records import Manifest
from .targets.families import family

LIBRARY_NAME = "fimoe-convert"
_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{8,}")


def _fallback_command(manifest: Manifest) -> str:
    """The CLI command equivalent to a library call that did not say how it was called."""
    src, opts = manifest.source, manifest.options
    parts = ["fimoe-convert", src.repo_id or "SRC", "OUT", "--target", manifest.target.name]
    if src.revision and src.repo_id:
        parts += ["--revision", src.revision]
    if manifest.ep_size != 1:
        parts += ["--ep-size", str(manifest.ep_size)]
    if opts.arch:
        parts += ["--arch", str(opts.arch)]
    if opts.allow_lossy:
        parts.append("--allow-lossy")
    parts += [f"--param {k}={v}" for k, v in sorted(opts.params.items())]
    return " ".join(parts)


PIPELINE_TAG = "text-generation"


def model_card(manifest: Manifest, command: str | None = None, license: dict[str, str] | None = None,
               engine: str | None = None) -> str:
    """README.md text for a converted checkpoint: huggingface_hub's ModelCard, YAML header first, as the Hub expects
    of a derived model: base_model (the source repo), the source's `license` ({license, license_name,
    license_link} from its card), the library that loads it, pipeline_tag and tags.

    `engine` (--engine): the card also names the expert scale dtype and the engines that load the output; without
    it the card is as it always was. Deterministic (no dates, sorted keys) so that two conversions give the same
    bytes."""
    from huggingface_hub import ModelCard, ModelCardData

    src, target, tool, geometry = manifest.source, manifest.target, manifest.tool, manifest.model
    base, revision = src.repo_id, src.revision
    caps = list(target.capabilities)
    kind = family(target)
    needs = kind.runtime_needs(target)
    command = command or _fallback_command(manifest)
    tags = {"deepseek_v4", LIBRARY_NAME, "moe", target.name}
    if target.kernel_name:
        tags |= {"flashinfer", *[f"sm{c.replace('.', '')}" for c in caps]}
    meta = {
        "source": {"repo_id": base, "revision": revision} if base else {"folder": Path(src.spec).name},
        "target": target.name,
        "kernel_name": target.kernel_name,
        "vllm_moe_backend": target.vllm_moe_backend,
        "compute_capabilities": caps,
        "runtime_needs": needs,
        "needs_nvshmem": target.needs_nvshmem,
        "ep_size": manifest.ep_size,
        "command": command,
        "versions": {"fimoe-convert": tool.version, "torch": tool.torch, "flashinfer": tool.flashinfer,
                     "safetensors": tool.safetensors},
    }
    rows = []
    if engine is not None:
        meta["engine"] = engine
        rows = _engine_rows(target, engine)
    data = ModelCardData(base_model=base, library_name=kind.library_name(), pipeline_tag=PIPELINE_TAG,
                         tags=sorted(tags), fimoe_convert=meta, **(license or {}))
    name = base or Path(src.spec).name
    lines = [
        f"# {name} for `{target.name}`",
        "",
        f"DeepSeek V4 checkpoint whose routed experts were converted offline by {LIBRARY_NAME} "
        f"{tool.version} for `{target.name}`"
        + (f" (FlashInfer kernel `{target.kernel_name}`)" if target.kernel_name else "")
        + ". Everything else is copied byte for byte from the base model.",
        "",
        "| | |",
        "|---|---|",
        f"| base model | {base or name} (revision {revision or 'local folder, no revision'}) |",
        f"| target | `{target.name}`; weights {target.weight_format}, activations {target.activation_format} |",
        f"| compute capabilities | {', '.join(caps) or 'any'} |",
        f"| runtime needs | {', '.join(needs) or 'none beyond the engine'} |",
        f"| NVSHMEM | {'needed' if target.needs_nvshmem else 'not needed'} |",
        f"| vLLM --moe-backend | {target.vllm_moe_backend or '-'} |",
        f"| expert parallel size | {manifest.ep_size} |",
        *rows,
        f"| geometry | hidden {geometry.hidden_size}, moe_intermediate {geometry.moe_intermediate_size}, "
        f"{geometry.n_routed_experts} experts, {geometry.moe_blocks} MoE blocks |",
        f"| tools | fimoe-convert {tool.version}, torch {tool.torch}, flashinfer {tool.flashinfer or '-'}, "
        f"safetensors {tool.safetensors} |",
        "",
        "Made with:",
        "",
        "```",
        command,
        "```",
        "",
        "Serve:",
        "",
        "```",
        *kind.serve_lines(target),
        "```",
        "",
        kind.load_heading(),
        "",
        "```python",
        kind.load_snippet(target, next(iter(manifest.layers or {"layers.0": None}))),
        "```",
        "",
        f"`{MANIFEST_NAME}` lists every file with its size and sha256; `fimoe-convert verify OUT` checks them.",
        "",
    ]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def _engine_rows(target, engine: str) -> list[str]:
    """The card's rows for an --engine conversion: the expert scale dtype (fp8_block) and the engines that load it."""
    from .kernels import BY_NAME
    from .serving import ENGINES, engine_names, expert_scales, loading_engines

    kernel, params = BY_NAME[target.name], dict(target.parameters)
    scales = expert_scales(kernel, params)
    return ([f"| expert scales | {scales} |"] if scales else []) + [
        f"| loads in | {engine_names(loading_engines(kernel, params))} (converted with --engine {engine}: "
        f"{ENGINES[engine]}) |"]
