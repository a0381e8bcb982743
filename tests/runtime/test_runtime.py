"""The runtime shim (fimoe_convert.runtime): backend spec, compatibility and vLLM config-time checks
with their exact texts, the process-wide FlashInfer moe_ep runtime handle, and MegaConfig built from
a converted output, bit-identical to FlashInfer's own preprocess of the same experts.

The outputs are converted in a subprocess, and the MegaConfig check for the SM107 kernel runs in one
(this file run as a script), so the pytest process never imports a FlashInfer kernel tree (the SM100
and SM90 trees cannot share a process with each other)."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fimoe_convert.errors import InputError
from fimoe_convert.runtime import (
    FI_MOE_EP_BACKENDS,
    FiMoeEpBackendSpec,
    IncompatibleTargetError,
    backend_spec,
    check_compatible,
    ensure_runtime,
    finalize_runtime,
    kernel_config,
    load_manifest,
    mega_config,
    runtime_requirements,
    shim,
    validate_fi_moe_ep_config,
)

pytest.importorskip("flashinfer")

MEGAMOE = "megamoe_sm90_mxfp4"
SM107 = "sm107_mxfp8_mxfp4_bf16_cutedsl"
BF16 = "bf16"

CONVERT = """
import sys
from fimoe_convert import convert
from fimoe_convert.testing import make_checkpoint
root = sys.argv[1]
src = make_checkpoint(root + "/src", "tiny", extreme_scales=False)
for target in sys.argv[2:]:
    convert(str(src), f"{root}/{target}", target, ep_size=2)
"""


@pytest.fixture(scope="module")
def outs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runtime")
    r = subprocess.run([sys.executable, "-c", CONVERT, str(root), MEGAMOE, SM107, BF16],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return {t: root / t for t in ("src", MEGAMOE, SM107, BF16)}


@pytest.fixture
def manifests(outs) -> dict[str, dict]:
    """Private copies of each output's manifest data (a test may edit them)."""
    return {t: copy.deepcopy(load_manifest(outs[t]).to_json()) for t in (MEGAMOE, SM107, BF16)}


@pytest.fixture(autouse=True)
def no_runtime_left():
    yield
    finalize_runtime()


# backend_spec ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, megakernel, needs_nvshmem, requirements", [
    (MEGAMOE, "megamoe_sm90_mxfp4", False, {"torch_dist"}),
    (SM107, "sm107_mxfp8_mxfp4_bf16_cutedsl", True, {"torch_dist", "nvshmem"}),
])
def test_backend_spec(outs, target, megakernel, needs_nvshmem, requirements):
    want = FiMoeEpBackendSpec(megakernel=megakernel, needs_nvshmem=needs_nvshmem)
    for form in (outs[target], str(outs[target]), load_manifest(outs[target]), load_manifest(outs[target]).to_json()):
        assert backend_spec(form) == want
    assert runtime_requirements(outs[target]) == frozenset(requirements)
    with pytest.raises(dataclasses.FrozenInstanceError):
        want.megakernel = "x"


def test_backend_spec_refuses_bf16_output(outs):
    with pytest.raises(IncompatibleTargetError, match=r"^--target bf16: this output keeps BF16 experts for the "
                       r"engine's own MoE kernels and has no FlashInfer megakernel; convert with a FlashInfer target"):
        backend_spec(outs[BF16])


# check_compatible -----------------------------------------------------------------------------------

@pytest.mark.parametrize("target, capability, ep_world_size", [
    (MEGAMOE, (9, 0), 2),
    (SM107, (10, 7), 2),
    (SM107, None, None),  # no CUDA here and nothing given: capability not checked
    (BF16, (8, 0), 7),  # BF16 experts: any device, any EP size
    (BF16, (12, 0), None),
])
def test_compatible(manifests, target, capability, ep_world_size):
    check_compatible(manifests[target], capability=capability, ep_world_size=ep_world_size)


INSTALLED = shim.installed_flashinfer_version()


@pytest.mark.parametrize("target, kwargs, recorded, installed, match", [
    (MEGAMOE, {"capability": (10, 0)}, None, None,
     r"^compute capability 10\.0: this output was converted with --target megamoe_sm90_mxfp4, which runs on 9\.0; "
     r"for 10\.0 convert with --target sm100_mxfp8_mxfp4_bf16_cutedsl \(or --target sm100_fp8_fp4_bf16_deepgemm\); "
     r"`fimoe-convert targets` lists all$"),
    (SM107, {"capability": (9, 0)}, None, None,
     r"^compute capability 9\.0: this output was converted with --target sm107_mxfp8_mxfp4_bf16_cutedsl, which runs "
     r"on 10\.7; for 9\.0 convert with --target megamoe_sm90_mxfp4 \(or --target sm90_fp8_mxfp4_bf16_pull_cutedsl\)"),
    (SM107, {"capability": (12, 0)}, None, None,
     r"which runs on 10\.7; for 12\.0 convert with --target sm120_mxfp4_mxfp8_bf16_cake; `fimoe-convert targets`"),
    (MEGAMOE, {"capability": (8, 0)}, None, None,
     r"^compute capability 8\.0: .*runs on 9\.0; no FlashInfer megakernel target runs on 8\.0; convert with "
     r"--target bf16 for the engine's own MoE kernels$"),
    (SM107, {"ep_world_size": 4}, None, None,
     r"^EP world size 4: this output was sharded for --ep-size 2 \(ranks 0\.\.1\); re-convert with --ep-size 4$"),
    (MEGAMOE, {"ep_world_size": 1}, None, None, r"^EP world size 1: .*re-convert with --ep-size 1$"),
    (SM107, {}, "0.9.2", None,
     r"^flashinfer-python " + (INSTALLED or "").replace(".", r"\.") + r" is installed: this output \(written with "
     r"flashinfer-python 0\.9\.2\) needs flashinfer-python >= 0\.9\.0 to load --target sm107_mxfp8_mxfp4_bf16_cutedsl; "
     r"pip install 'flashinfer-python>=0\.9\.0', or convert with --target bf16 to serve without FlashInfer$"),
    (MEGAMOE, {}, None, "0.7.3",
     r"^flashinfer-python 0\.7\.3 is installed: this output \(written with flashinfer-python 0\.7\.4\) needs "
     r"flashinfer-python >= 0\.7\.4 to load --target megamoe_sm90_mxfp4"),
    (SM107, {}, "0.6.1", "0.7.3", r"needs flashinfer-python >= 0\.7\.4"),  # never below the first moe_ep release
    (SM107, {}, None, "missing",
     r"^flashinfer-python not installed: this output .* needs flashinfer-python >= 0\.7\.4"),
    (SM107, {"capability": (9, 0), "ep_world_size": 8}, "1.0.0", None,
     r"^3 problems:\n  - compute capability 9\.0: .*\n  - EP world size 8: .*\n  - flashinfer-python .* >= 1\.0\.0"),
])
def test_incompatible(manifests, monkeypatch, target, kwargs, recorded, installed, match):
    m = manifests[target]
    if recorded:
        m["tool"]["flashinfer"] = recorded
    if installed:
        monkeypatch.setattr(shim, "installed_flashinfer_version", lambda: None if installed == "missing" else installed)
    with pytest.raises(IncompatibleTargetError, match=match) as e:
        check_compatible(m, **kwargs)
    assert isinstance(e.value, ValueError) and isinstance(e.value, InputError)
    assert len(e.value.problems) == (3 if match.startswith("^3 problems") else 1)


def test_capability_defaults_to_the_cuda_device(manifests, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_compatible(manifests[MEGAMOE])
    with pytest.raises(IncompatibleTargetError, match=r"^compute capability 9\.0: .*sm107_mxfp8_mxfp4_bf16_cutedsl, "
                       r"which runs on 10\.7"):
        check_compatible(manifests[SM107])
    check_compatible(manifests[SM107], capability=(10, 7))  # a given capability wins


def test_vllm_backends_and_suggestions_come_from_the_kernel_table():
    """vLLM's two FlashInfer megakernel backends run these kernels, with these NVSHMEM needs, on 10.0 and
    10.3 only (FORMATS.md, section 2); the suggestions for a capability are kernels that run on it."""
    assert FI_MOE_EP_BACKENDS == {  # noqa: SIM300 - the value under test on the left
        "flashinfer_moe_ep_mega_deep_gemm": FiMoeEpBackendSpec("sm100_fp8_fp4_bf16_deepgemm", False),
        "flashinfer_moe_ep_mega_cutedsl": FiMoeEpBackendSpec("sm100_nvfp4_nvfp4_bf16_cutedsl", True)}
    assert shim._vllm_capabilities() == [(10, 0), (10, 3)]
    from fimoe_convert.kernels import suggested

    assert [k.name for k in suggested("9.0")] == ["megamoe_sm90_mxfp4", "sm90_fp8_mxfp4_bf16_pull_cutedsl"]
    assert [k.name for k in suggested("10.7")] == ["sm107_mxfp8_mxfp4_bf16_cutedsl", "sm107_mxfp4_mxfp4_bf16_cutedsl"]


# validate_fi_moe_ep_config --------------------------------------------------------------------------

DG, CD = "flashinfer_moe_ep_mega_deep_gemm", "flashinfer_moe_ep_mega_cutedsl"


@pytest.mark.parametrize("backend, capability, eplb, error, match", [
    (DG, (10, 0), False, None, None),
    (DG, (10, 3), False, None, None),
    (CD, (10, 0), False, None, None),
    (CD, (10, 3), False, None, None),
    (CD, (9, 0), False, IncompatibleTargetError,
     r"^--moe-backend flashinfer_moe_ep_mega_cutedsl: runs on compute capability 10\.0 or 10\.3 \(B200/GB200, "
     r"B300/GB300\), this device is 9\.0; use a non-megakernel MoE backend, e.g\. --moe-backend flashinfer_cutlass; "
     r"on 9\.0, fimoe-convert --target megamoe_sm90_mxfp4 serves through flashinfer\.megamoe$"),
    (DG, (10, 7), False, IncompatibleTargetError,
     r"^--moe-backend flashinfer_moe_ep_mega_deep_gemm: runs on compute capability 10\.0 or 10\.3 .*this device is "
     r"10\.7; use a non-megakernel MoE backend, e.g\. --moe-backend flashinfer_cutlass$"),
    (DG, (12, 0), False, IncompatibleTargetError, r"this device is 12\.0"),
    (DG, (10, 0), True, NotImplementedError,
     r"^--moe-backend flashinfer_moe_ep_mega_deep_gemm: does not support EPLB \(--enable-eplb\), because the "
     r"FlashInfer megakernel does not apply the logical-to-physical expert map; turn EPLB off, or use a "
     r"non-megakernel MoE backend, e.g\. --moe-backend flashinfer_cutlass$"),
    (CD, (9, 0), True, NotImplementedError,
     r"^2 problems:\n  - --moe-backend flashinfer_moe_ep_mega_cutedsl: runs on .*\n  - --moe-backend "
     r"flashinfer_moe_ep_mega_cutedsl: does not support EPLB"),
    ("flashinfer_moe_ep_cutedsl", (10, 0), False, ValueError,
     r"^--moe-backend flashinfer_moe_ep_cutedsl: not a FlashInfer moe_ep megakernel backend; known: "
     r"flashinfer_moe_ep_mega_cutedsl, flashinfer_moe_ep_mega_deep_gemm$"),
    ("FlashInfer_MoE_EP_Mega_CuteDSL", (10, 0), True, ValueError, r"^--moe-backend FlashInfer_MoE_EP_Mega_CuteDSL: "),
    ("deep_gemm_mega_moe", (10, 0), False, ValueError, r"^--moe-backend deep_gemm_mega_moe: not a FlashInfer"),
])
def test_validate_fi_moe_ep_config(backend, capability, eplb, error, match):
    if error is None:
        validate_fi_moe_ep_config(backend, capability=capability, enable_eplb=eplb)
        return
    with pytest.raises(error, match=match) as got:
        validate_fi_moe_ep_config(backend, capability=capability, enable_eplb=eplb)
    if error is NotImplementedError:  # vLLM's helper raises NotImplementedError for EPLB; ours is a ValueError too
        assert isinstance(got.value, IncompatibleTargetError) and isinstance(got.value, ValueError)


# ensure_runtime / finalize_runtime ------------------------------------------------------------------

def test_runtime_real_flashinfer_bootstrap_at_world_size_one(manifests, monkeypatch):
    """FlashInfer's own bootstrap, unfaked: {torch_dist} at world size 1 is a gloo group, no GPU needed."""
    import torch.distributed as dist
    from flashinfer.moe_ep import BootstrapConfig
    from flashinfer.moe_ep.core import runtime as fi_rt

    for var in ("RANK", "WORLD_SIZE", "MEGA_NO_DIST"):
        monkeypatch.delenv(var, raising=False)
    m = manifests[MEGAMOE]
    m["ep"]["world_size"] = 1  # as converted with --ep-size 1
    calls = {"bootstrap": [], "finalize": 0}
    real_boot, real_fin = fi_rt.bootstrap_moe_ep_runtime, fi_rt.finalize_moe_ep_runtime

    def spy_boot(bootstrap, requirements):
        calls["bootstrap"].append(set(requirements))
        return real_boot(bootstrap, requirements)

    def spy_fin(handle):
        calls["finalize"] += 1
        return real_fin(handle)

    monkeypatch.setattr(fi_rt, "bootstrap_moe_ep_runtime", spy_boot)
    monkeypatch.setattr(fi_rt, "finalize_moe_ep_runtime", spy_fin)
    assert not dist.is_initialized()
    bs = BootstrapConfig(world_size=1, rank=0)
    h = ensure_runtime(bs, m)
    assert isinstance(h, fi_rt.MoEEpRuntimeHandle) and h.requirements == frozenset({"torch_dist"})
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert ensure_runtime(BootstrapConfig(world_size=1, rank=0), m) is h
    assert calls["bootstrap"] == [{"torch_dist"}]
    finalize_runtime()
    assert h.closed and not dist.is_initialized() and calls["finalize"] == 1
    finalize_runtime()
    assert calls["finalize"] == 1


@pytest.fixture
def fake_bootstrap(monkeypatch):
    """FlashInfer's bootstrap/finalize replaced where a GPU process group and NVSHMEM are unavoidable."""
    from flashinfer.moe_ep.core import runtime as fi_rt

    log = {"bootstrap": [], "finalize": []}

    def boot(bootstrap, requirements):
        h = fi_rt.MoEEpRuntimeHandle(requirements=frozenset(requirements))
        log["bootstrap"].append((bootstrap.world_size, bootstrap.rank, frozenset(requirements), h))
        return h

    monkeypatch.setattr(fi_rt, "bootstrap_moe_ep_runtime", boot)
    monkeypatch.setattr(fi_rt, "finalize_moe_ep_runtime", lambda h: log["finalize"].append(h))
    return log


def test_runtime_idempotent_with_nvshmem(outs, fake_bootstrap):
    from flashinfer.moe_ep import BootstrapConfig

    bs = BootstrapConfig(world_size=2, rank=1)
    h = ensure_runtime(bs, outs[SM107])
    assert ensure_runtime(BootstrapConfig(world_size=2, rank=1), load_manifest(outs[SM107])) is h
    assert shim.runtime_handle() is h
    assert [(w, r, q) for w, r, q, _ in fake_bootstrap["bootstrap"]] == [(2, 1, frozenset({"torch_dist", "nvshmem"}))]
    with pytest.raises(RuntimeError, match=r"^ensure_runtime: this process's FlashInfer moe_ep runtime was "
                       r"bootstrapped with \['nvshmem', 'torch_dist'\] for --target sm107_mxfp8_mxfp4_bf16_cutedsl; "
                       r"--target megamoe_sm90_mxfp4 needs \['torch_dist'\]; call finalize_runtime\(\) first"):
        ensure_runtime(bs, outs[MEGAMOE])
    with pytest.raises(RuntimeError, match=r"bootstrapped for EP rank 1 of 2, not rank 0 of 2; call finalize_runtime"):
        ensure_runtime(BootstrapConfig(world_size=2, rank=0), outs[SM107])
    assert len(fake_bootstrap["bootstrap"]) == 1
    finalize_runtime()
    finalize_runtime()
    assert fake_bootstrap["finalize"] == [h] and shim.runtime_handle() is None
    h2 = ensure_runtime(bs, outs[MEGAMOE])  # a fresh bootstrap after finalize, with the new requirements
    assert h2 is not h and fake_bootstrap["bootstrap"][-1][2] == frozenset({"torch_dist"})


def test_runtime_checks_before_bootstrapping(outs, fake_bootstrap):
    from flashinfer.moe_ep import BootstrapConfig

    with pytest.raises(IncompatibleTargetError, match=r"^EP world size 4: this output was sharded for --ep-size 2"):
        ensure_runtime(BootstrapConfig(world_size=4, rank=0), outs[SM107])
    with pytest.raises(IncompatibleTargetError, match=r"^--target bf16: .*has no FlashInfer megakernel"):
        ensure_runtime(BootstrapConfig(world_size=2, rank=0), outs[BF16])
    assert fake_bootstrap["bootstrap"] == [] and shim.runtime_handle() is None


# mega_config ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_mega_config_bit_identical_to_flashinfer_preprocess(outs):
    r = subprocess.run([sys.executable, __file__, "check-mega-config", str(outs[SM107]), str(outs["src"])],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    blocks = len(load_manifest(outs[SM107]).layers)
    assert r.stdout.strip().splitlines()[-1] == f"OK {2 * blocks}"


@pytest.mark.parametrize("target, call, match", [
    (MEGAMOE, lambda out: mega_config(out, "layers.0", 0, "cpu"),
     r"^--target megamoe_sm90_mxfp4: this output is for flashinfer\.megamoe, which takes no MegaConfig; load each "
     r"block with fimoe_convert\.runtime\.load_megamoe_weights\(out_dir, layer, rank, device\) and call "
     r"flashinfer\.megamoe\.mxfp4_mega_moe$"),
    (BF16, lambda out: mega_config(out, "layers.0", 0, "cpu"), r"^--target bf16: .*has no FlashInfer megakernel"),
    (SM107, lambda out: kernel_config(out, fast_mat=False),
     r"^fast_mat=False: not a field of Sm107_Mxfp8_Mxfp4_Bf16_Cutedsl_MegaMoeConfig; fields: .*fast_math"),
    (SM107, lambda out: kernel_config(out, intermediate_size=64, kernel_name="x"),
     r"^2 problems:\n  - intermediate_size=64: this output was converted for intermediate_size \d+ \(from the "
     r"checkpoint's config\.json\); leave it out\n  - kernel_name='x': not a field"),
])
def test_mega_config_refusals(outs, target, call, match):
    with pytest.raises(IncompatibleTargetError, match=match):
        call(outs[target])


def test_kernel_config_from_manifest(outs, manifests):
    import flashinfer.moe_ep as me

    model = manifests[SM107]["model"]
    cfg = kernel_config(outs[SM107], fast_math=False, top_k=model["num_experts_per_tok"])
    assert type(cfg) is me.Sm107_Mxfp8_Mxfp4_Bf16_Cutedsl_MegaMoeConfig
    assert (cfg.intermediate_size, cfg.top_k, cfg.fast_math) == (model["moe_intermediate_size"],
                                                                 model["num_experts_per_tok"], False)
    m = manifests[SM107]
    m["target"]["parameters"] = {"activation": "swiglu"}  # conversion parameters reach the config
    assert kernel_config(m).activation == "swiglu"
    with pytest.raises(IncompatibleTargetError, match=r"^activation='situ': the weights were converted with --param "
                       r"activation=swiglu; re-convert with --param activation=situ to change it$"):
        kernel_config(m, activation="situ")


@pytest.mark.parametrize("layer, rank, match", [
    ("layers.99", 0, r"no MoE block 'layers\.99' in this output"),
    ("layers.0", 2, r"rank 2 not in this output, which was sharded for --ep-size 2 \(ranks 0\.\.1\)"),
])
def test_mega_config_bad_block_or_rank(outs, layer, rank, match):
    with pytest.raises(InputError, match=match):
        mega_config(outs[SM107], layer, rank, "cpu")


# incomplete outputs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(complete=False), r"fimoe-manifest\.json: the conversion did not finish \(complete is not "
     r"true\); run the same fimoe-convert command with --resume$"),
    (lambda d: d.pop("complete"), r"the conversion did not finish"),
    (lambda d: d.update(schema="fimoe-manifest/9"), r"schema is 'fimoe-manifest/9', expected 'fimoe-manifest/1'"),
])
def test_incomplete_output_refused(outs, tmp_path, edit, match):
    out = tmp_path / "out"
    shutil.copytree(outs[SM107], out)
    path = out / "fimoe-manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    for call in (load_manifest, backend_spec, check_compatible, lambda o: mega_config(o, "layers.0", 0, "cpu")):
        with pytest.raises(InputError, match=match):
            call(out)


# Subprocess: MegaConfig for every block and rank vs FlashInfer's preprocess -------------------------

def _check_mega_config(out: str, src: str) -> None:
    import flashinfer.moe_ep as me
    from flashinfer.moe_ep.core.kernel import registry
    from safetensors import safe_open

    from fimoe_convert.numerics.structure import same_object
    from fimoe_convert.runtime import load_transformed_weights

    m = load_manifest(out)
    model = m.model
    h, i = model.hidden_size, model.moe_intermediate_size
    index = json.loads((Path(src) / "model.safetensors.index.json").read_text())["weight_map"]

    def stack(block, lo, hi, leg, kind):
        ts = []
        for j in range(lo, hi):
            name = f"{block}.ffn.experts.{j}.{leg}.{kind}"
            with safe_open(str(Path(src) / index[name]), "pt") as f:
                ts.append(f.get_tensor(name).view(torch.uint8))
        return torch.stack(ts)

    n = 0
    for block, ranks in m.layers.items():
        for rank, rec in ranks.items():
            lo, hi = rec.experts
            cfg = mega_config(out, block, int(rank), device="cpu")
            assert type(cfg) is me.MegaConfig and cfg.preprocess_weights is False
            assert type(cfg.megakernel) is me.Sm107_Mxfp8_Mxfp4_Bf16_Cutedsl_MegaMoeConfig
            assert (cfg.megakernel.intermediate_size, cfg.megakernel.top_k) == (i, model.num_experts_per_tok)
            e8m0 = torch.float8_e8m0fnu
            pack = me.MoEWeightPack(
                torch.cat([stack(block, lo, hi, "w1", "weight"), stack(block, lo, hi, "w3", "weight")], 1),
                stack(block, lo, hi, "w2", "weight"),
                torch.cat([stack(block, lo, hi, "w1", "scale"), stack(block, lo, hi, "w3", "scale")], 1).view(e8m0),
                stack(block, lo, hi, "w2", "scale").view(e8m0))
            want = me.preprocess_sm107_mxfp4_mega_weights(pack, intermediate_size=i, hidden_size=h)
            if not same_object(cfg.transformed_weights, want):
                raise SystemExit(f"MISMATCH {block} rank {rank}: weights differ from FlashInfer's preprocess")
            if not same_object(cfg.transformed_weights, load_transformed_weights(out, block, int(rank), "cpu")):
                raise SystemExit(f"MISMATCH {block} rank {rank}: differs from load_transformed_weights")
            # The check MoEEpMegaLayer makes on preprocess_weights=False (runs on CPU for this kernel).
            backend = registry.create_mega_kernel(cfg.megakernel)
            bs = me.BootstrapConfig(world_size=m.ep_size, rank=int(rank))
            backend.bind_ep_bootstrap(bs)
            fleet = me.FleetParams(num_experts=model.n_routed_experts, max_tokens_per_rank=128, token_hidden_size=h)
            backend.validate_transformed_weights(cfg.transformed_weights, bs, fleet)
            n += 1
    print(f"OK {n}")


if __name__ == "__main__" and sys.argv[1:2] == ["check-mega-config"]:
    _check_mega_config(*sys.argv[2:4])


def test_same_object_compares_a_size_one_last_dimension_with_any_stride():
    """DeepGEMM's int32 scale views have a last dimension of 1 with another stride (seen on the H200)."""
    from fimoe_convert.numerics.structure import same_object

    base = torch.arange(8, dtype=torch.int32)
    other = base.clone()
    other[2] = 99
    a = base.as_strided((4, 1), (1, 4))  # contiguous by torch's rule (size-1 dims ignored), stride(-1) 4
    assert a.is_contiguous() and a.stride(-1) != 1
    assert same_object(a, base.clone().as_strided((4, 1), (1, 4)))
    assert not same_object(a, other.as_strided((4, 1), (1, 4)))
