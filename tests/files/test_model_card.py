"""The model card convert() writes into OUT/README.md, read back through huggingface_hub's ModelCard;
same input and options give the same sha256 for every file in OUT (what makes pre-baked image
layers cache); and convert --dry-run's plan ends with a labeled ETA estimate."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re

import pytest
import torch
from click.testing import CliRunner
from huggingface_hub import ModelCard
from reference import HUB_COMMIT as COMMIT, HUB_REPO as REPO

from fimoe_convert import convert, verify
from fimoe_convert.cli import main
from fimoe_convert.files.output.manifest import MANIFEST_NAME, Manifest
from fimoe_convert.hub import model_card
from fimoe_convert.kernels import get_kernel
from fimoe_convert.targets import TargetOptions, target_record
from fimoe_convert.testing import PRESETS

TOKEN = "hf_CardTokenMustNotLeak0123456789abcdef"
TINY = PRESETS["tiny"]
BF16_CMD = "fimoe-convert ./DeepSeek-V4-Tiny OUT --shard-size 3MB"


def digests(folder) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def load_card(out) -> ModelCard:
    return ModelCard.load(out / "README.md")


def python_block(text: str, out, device: str = "cpu") -> str:
    """The card's load snippet, made to run here: the local OUT instead of a download, CPU instead of CUDA."""
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert 'snapshot_download("REPO_ID")' in code
    return code.replace('snapshot_download("REPO_ID")', repr(str(out))).replace('device="cuda"', f'device="{device}"')


def manifest(out) -> dict:
    return json.loads((out / MANIFEST_NAME).read_text())


@pytest.fixture(scope="module")
def bf16_out(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("card") / "bf16"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", TOKEN)  # a token in the environment never reaches OUT
        convert(str(tiny_ckpt), str(out), "bf16", shard_size="3MB", command=BF16_CMD)
    return out


@pytest.fixture(scope="module")
def mm_out(tiny_ckpt, tmp_path_factory):
    pytest.importorskip("flashinfer.megamoe")
    out = tmp_path_factory.mktemp("card") / "mm"
    convert(str(tiny_ckpt), str(out), "megamoe_sm90_mxfp4", ep_size=2)
    return out


def test_bf16_card(bf16_out, tiny_ckpt):
    card = load_card(bf16_out)
    d = card.data.to_dict()
    m = manifest(bf16_out)
    assert "base_model" not in d  # a local folder is no Hub base model
    assert d["library_name"] == "transformers" and d["pipeline_tag"] == "text-generation"
    assert {"deepseek_v4", "fimoe-convert", "moe", "bf16"} <= set(d["tags"]) and "flashinfer" not in d["tags"]
    meta = d["fimoe_convert"]
    assert meta["source"] == {"folder": tiny_ckpt.name} and m["source"]["spec"] == tiny_ckpt.name
    assert str(tiny_ckpt.parent) not in card.content  # no local path of the converting machine is published
    assert "AutoModelForCausalLM.from_pretrained(OUT)" in card.content and "vllm serve OUT" in card.content
    assert meta["target"] == "bf16" and meta["kernel_name"] is None and meta["vllm_moe_backend"] is None
    assert meta["compute_capabilities"] == [] and meta["runtime_needs"] == [] and meta["needs_nvshmem"] is False
    assert meta["ep_size"] == 1 and meta["command"] == BF16_CMD
    fi = None
    try:
        fi = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        pass
    assert meta["versions"] == {"fimoe-convert": m["tool"]["version"], "torch": torch.__version__.split("+")[0],
                                "flashinfer": fi, "safetensors": importlib.metadata.version("safetensors")}
    assert f"```\n{BF16_CMD}\n```" in card.text
    assert "| compute capabilities | any |" in card.text and "| runtime needs | none beyond the engine |" in card.text
    assert "revision local folder" in card.text
    # The load snippet runs as written (against the local OUT).
    scope: dict = {}
    exec(python_block(card.text, bf16_out), scope)
    assert scope["w1"].dtype == torch.bfloat16 and tuple(scope["w1"].shape) == (TINY.inter, TINY.hidden)
    # The card is listed in the manifest, so verify covers it.
    assert "README.md" in m["files"] and verify(str(bf16_out)).problems == []


def test_megamoe_card(mm_out, tiny_ckpt):
    card = load_card(mm_out)
    d = card.data.to_dict()
    assert d["library_name"] == "flashinfer" and "base_model" not in d
    assert {"flashinfer", "sm90", "megamoe_sm90_mxfp4", "moe"} <= set(d["tags"])
    meta = d["fimoe_convert"]
    assert meta["target"] == meta["kernel_name"] == "megamoe_sm90_mxfp4"
    assert meta["compute_capabilities"] == ["9.0"] and meta["needs_nvshmem"] is False and meta["ep_size"] == 2
    assert meta["runtime_needs"] == ["torch.distributed (process group)", "torch symmetric memory (MegaMoESymmBuffer)"]
    # convert() called as a library: the card gives the equivalent command.
    assert meta["command"] == "fimoe-convert SRC OUT --target megamoe_sm90_mxfp4 --ep-size 2"  # no local path
    assert "| compute capabilities | 9.0 |" in card.text and "| NVSHMEM | not needed |" in card.text
    assert "load_megamoe_weights" in card.text and "mxfp4_mega_moe" in card.text
    scope: dict = {}
    exec(python_block(card.text, mm_out), scope)
    from fimoe_convert.runtime import load_megamoe_weights

    want = load_megamoe_weights(mm_out, "layers.0", rank=0)
    for name, w in zip(("l1", "l2", "l1_scales", "l2_scales"), want):
        assert torch.equal(scope[name], w)


def test_hub_source_card_names_repo_and_revision(hub_cache, tmp_path):
    out = tmp_path / "out"
    convert(REPO, str(out), "bf16", offline=True)
    card = load_card(out)
    d = card.data.to_dict()
    assert d["base_model"] == REPO
    assert d["fimoe_convert"]["source"] == {"repo_id": REPO, "revision": COMMIT}
    assert d["fimoe_convert"]["command"] == f"fimoe-convert {REPO} OUT --target bf16 --revision {COMMIT}"
    assert f"| base model | {REPO} (revision {COMMIT}) |" in card.text
    assert card.text.lstrip().startswith(f"# {REPO} for `bf16`")


def test_moe_ep_card_says_nvshmem_and_loads_with_mega_config(mm_out):
    """A moe_ep kernel target (its preprocessing needs CUDA, so the manifest is made by hand here)."""
    m = manifest(mm_out)
    m["target"] = target_record(get_kernel("sm100_nvfp4_nvfp4_bf16_cutedsl"), TargetOptions()).to_json()
    card = ModelCard(
        model_card(
            Manifest.from_json(m, "test"), command="fimoe-convert org/x OUT --target sm100_nvfp4_nvfp4_bf16_cutedsl"
        )
    )
    meta = card.data.to_dict()["fimoe_convert"]
    assert meta["runtime_needs"] == ["torch.distributed", "NVSHMEM"] and meta["needs_nvshmem"] is True
    assert meta["compute_capabilities"] == ["10.0", "10.3"] and {"sm100", "sm103"} <= set(card.data.tags)
    assert meta["vllm_moe_backend"] == "flashinfer_moe_ep_mega_cutedsl"
    assert "| NVSHMEM | needed |" in card.text
    assert 'cfg = mega_config(out, "layers.0", rank=0, device="cuda")' in card.text


def test_cli_card_has_the_exact_command_and_no_token(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, [str(tiny_ckpt), str(out), "--shard-size", "3MB", "-q"])
    assert res.exit_code == 0, res.output
    want = "fimoe-convert SRC OUT --shard-size 3MB"  # a local SRC's path is not published
    assert load_card(out).data.to_dict()["fimoe_convert"]["command"] == want
    assert all(str(tiny_ckpt).encode() not in (out / n).read_bytes() for n in ("README.md", "config.json"))
    assert all(TOKEN.encode() not in p.read_bytes() for p in out.iterdir())


def test_token_never_reaches_out(bf16_out):
    assert all(TOKEN.encode() not in p.read_bytes() for p in bf16_out.iterdir())


# ------------------------------------------------------------------ identical digests (image layers cache)

def test_megamoe_two_conversions_give_identical_digests(mm_out, tiny_ckpt, tmp_path):
    again = tmp_path / "elsewhere" / "mm"
    convert(str(tiny_ckpt), str(again), "megamoe_sm90_mxfp4", ep_size=2)
    assert digests(again) == digests(mm_out)
    assert len(digests(again)) == len(manifest(again)["files"]) + 1  # nothing besides the manifest's files


def test_hub_cache_source_two_conversions_give_identical_digests(hub_cache, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b" / "out"
    convert(REPO, str(a), "bf16", offline=True, shard_size="3MB")
    convert(REPO, str(b), "bf16", offline=True, shard_size="3MB")
    assert digests(a) == digests(b) and len(digests(a)) >= 8


# ------------------------------------------------------------------ convert --dry-run

def test_dry_run_prints_plan_free_disk_and_a_labeled_eta(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, [str(tiny_ckpt), str(out), "--dry-run", "--shard-size", "7MB"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()  # the notice of the sample timing goes to stderr, before it
    # the largest sample, an expert's three BF16 legs of inter x hidden; the tiny source's tensor bytes
    sample_kb, read_mb = f"{3 * TINY.inter * TINY.hidden * 2 / 1e3:.2f}".replace(".", r"\."), r"7\.05"
    assert re.match(r"timing \d sample units? ", res.stderr) and lines[0] == "plan for --target bf16 on cpu: 3 shards"
    assert re.fullmatch(r"read [0-9.]+ MB, write [0-9.]+ MB, free disk [0-9.]+ [kMGT]?B", lines[4])
    assert re.fullmatch(r"ETA: about ([0-9.]+ s|[0-9.]+ min|[0-9.]+ h) \(estimate, measured here: one-time costs "
                        r"about [0-9.]+ s \(opening SRC and planning [0-9.]+ s, first calls [0-9.]+ s, the model "
                        r"card's imports [0-9.]+ s, 11 metadata files [0-9.]+ s\); 32 units convert in about "
                        rf"[0-9.]+ s on cpu \(largest sample \S+, {sample_kb} kB in [0-9.]+ ms\); reading {read_mb} "
                        r"MB at [0-9.]+ [kMGT]?B/s about [0-9.]+ s; hashing [0-9.]+ MB in and out at "
                        r"[0-9.]+ [kMGT]?B/s about [0-9.]+ s; writing [0-9.]+ [kMGT]?B at [0-9.]+ [kMGT]?B/s about "
                        r"[0-9.]+ s; they overlap on \d+ cores?, [0-9.]+ of them free now\)",
                        lines[5]), lines[5]
    assert not out.exists()


def test_fp8_block_card_snippet_loads_fp8_experts(tiny_ckpt, tmp_path):
    out = tmp_path / "fp8"
    convert(str(tiny_ckpt), str(out), "fp8_block")
    text = load_card(out).text
    assert "FP8 E4M3 routed experts" in text and "BF16 routed experts" not in text
    scope: dict = {}
    exec(python_block(text, out), scope)
    assert scope["w1"].dtype == torch.float8_e4m3fn and tuple(scope["w1"].shape) == (TINY.inter, TINY.hidden)
