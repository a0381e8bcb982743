"""vLLM's own config, model classes and load_weights on one output folder, every parameter compared with the file:
    python vllm_load.py OUT [--layout tp1|tp2|ep2] [--selftest]
tp2 / ep2 start one process per rank (world size 2, process groups on gloo); ep2 is TP 2 with
enable_expert_parallel, as `vllm serve --tensor-parallel-size 2 --enable-expert-parallel`. Each rank builds the main
model (DeepseekV4ForCausalLM) and the MTP draft model (DeepSeekV4MTP, speculative method "mtp") the way vLLM's
loader does (initialize_model), runs each one's load_weights over every tensor of OUT, and compares every parameter
with its slice of the file. --selftest then loads again with each corruption of _values.CORRUPTIONS and requires
the check to fail.

Without a GPU, vLLM is told it runs on an H200 (capability 9.0) and its CUDA extension modules are replaced by
stubs that raise if called, so only Python-level code runs; the CUDA stream/event objects the model's
constructor keeps are replaced by inert fakes (printed)."""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402

CUDA = torch.cuda.is_available()
if not CUDA:
    import _cuda_stub  # noqa: E402

    # libcuda-linked extensions: import-time op registration only
    _cuda_stub.install(["vllm._C_stable_libtorch", "vllm.vllm_flash_attn"])
    import vllm.platforms as platforms  # noqa: E402
    from vllm.platforms.cuda import NonNvmlCudaPlatform  # noqa: E402
    from vllm.platforms.interface import DeviceCapability  # noqa: E402

    class SimulatedH200(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(9, 0)

        @classmethod
        def get_device_name(cls, device_id=0):
            return "NVIDIA H200 (simulated)"

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return 141 << 30  # bytes

        @classmethod
        def get_device_communicator_cls(cls) -> str:  # NCCL needs a GPU; the base class uses the gloo group
            return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    platforms._current_platform = SimulatedH200()
    import vllm._custom_ops as ops  # noqa: E402

    # capability queries that import-time code asks the CUDA extension; answered as on Hopper
    for _n in ("cutlass_scaled_mm_supports_block_fp8", "cutlass_scaled_mm_supports_fp8",
               "cutlass_scaled_mm_supports_fp4", "cutlass_group_gemm_supported"):
        setattr(ops, _n, lambda cap: True)


def fake_cuda() -> list:
    """Minimal stand-ins for the CUDA runtime objects the model's constructor makes (after all imports)."""
    if CUDA:
        return []
    import vllm.platforms as platforms

    class FakeStream:  # the constructor only keeps streams for later kernel overlap
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a):
            pass

    class FakeEvent(FakeStream):
        def record(self, *a):
            pass

    patches = {"torch.cuda.Stream": FakeStream, "torch.cuda.Event": FakeEvent,
               "torch.cuda.current_device": lambda: 0, "torch.cuda.current_stream": lambda *a: FakeStream()}
    for qual, obj in patches.items():
        setattr(torch.cuda, qual.rsplit(".", 1)[1], obj)
    platforms.current_platform.device_type = "cpu"  # layers allocate on current_platform.device_type
    patches["current_platform.device_type"] = "cpu"
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    sai.has_deep_gemm = lambda: True  # DeepGEMM (CUDA-only) ships with vLLM's GPU wheels; only checked here
    patches["sparse_attn_indexer.has_deep_gemm"] = "True"
    for ns in ("_C", "_moe_C"):  # ops the extension would register; layers keep a handle in __init__
        _cuda_stub.stub_op_namespace(getattr(torch.ops, ns))
        patches[f"torch.ops.{ns}.<unregistered op>"] = "stub that raises if called"
    return list(patches)


LAYOUTS = {"tp1": (1, False), "tp2": (2, False), "ep2": (2, True)}  # name -> (world size, expert parallel)
MTP_SHARED = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight"}
# file dtype -> parameter dtype the engine converts to, value for value (checked to round-trip exactly)
CASTS = {(torch.int64, torch.int32): (r"\.ffn\.gate\.tid2eid$", "int32 parameter, deepseek_v4/nvidia/model.py:285")}


def source_of_main(name: str, n_experts: int, pad_shared: int):
    """vLLM parameter name -> Source in the file (names as vLLM's weights mapper and load_weights map them,
    deepseek_v4/nvidia/model.py)."""
    from _values import Source
    top = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
           "model.norm.weight": "norm.weight"}
    if name in top:
        return Source([[top[name]]])
    if name.startswith("model.hc_head_"):
        return Source([[name.removeprefix("model.")]])
    if not name.startswith("model.layers."):
        return f"no rule for {name}"
    return _layer_source(name.removeprefix("model."), n_experts, pad_shared)


def _scale(leaf: str) -> str:
    return {"weight_scale_inv": "scale", "weight_scale": "scale"}.get(leaf, leaf)


def _layer_source(rest: str, n_experts: int, pad_shared: int, prefix: str = ""):
    """rest = 'layers.N.<module path>.<leaf>' in vLLM's names; prefix replaces 'layers.N.' (the MTP block)."""
    from _values import Source, pad_to_shape
    parts = rest.split(".")
    base = prefix or ".".join(parts[:2]) + "."
    path, leaf = ".".join(parts[2:-1]), parts[-1]
    fused = {"attn.fused_wqa_wkv": ["attn.wq_a", "attn.wkv"],
             "ffn.shared_experts.gate_up_proj": ["ffn.shared_experts.w1", "ffn.shared_experts.w3"],
             "attn.compressor.fused_wkv_wgate": ["attn.compressor.wkv", "attn.compressor.wgate"],
             "attn.indexer.compressor.fused_wkv_wgate": ["attn.indexer.compressor.wkv",
                                                         "attn.indexer.compressor.wgate"]}
    pad = {}
    if ".shared_experts." in path and pad_shared:  # vLLM zero-pads block-FP8 shared experts (model.py:1171)
        pad = {"pad_dim": 1 if path.endswith("down_proj") else 0, "pad_to": pad_shared[leaf != "weight"]}
    if path in fused:
        return Source([[f"{base}{p}.{_scale(leaf)}" for p in fused[path]]], **pad)
    if path == "ffn.shared_experts.down_proj":
        return Source([[f"{base}ffn.shared_experts.w2.{_scale(leaf)}"]], **pad)
    if path.startswith("ffn.experts"):  # FusedMoE: w13 = w1 rows then w3 rows, stacked over experts
        w, _, kind = leaf.partition("_")
        ws = {"w13": ["w1", "w3"], "w2": ["w2"]}[w]
        suf = "weight" if kind == "weight" else "scale"
        return Source([[f"{base}ffn.experts.{e}.{x}.{suf}" for x in ws] for e in range(n_experts)], stack=True)
    if path == "attn" and leaf == "attn_sink":  # padded heads set to -inf (weight_utils.py:1568)
        return Source([[f"{base}attn.attn_sink"]], transform=pad_to_shape(float("-inf")))
    if path == "ffn.gate" and leaf == "e_score_correction_bias":
        return Source([[f"{base}ffn.gate.bias"]])
    return Source([[f"{base}{path}.{_scale(leaf)}" if path else f"{base}{leaf}"]])


def source_of_mtp(name: str, n_layers: int, n_experts: int, pad_shared: int):
    """DeepSeekV4MTP parameter -> Source: model.layers.{L+k}.mtp_block.* <- mtp.k.*, its e_proj/h_proj/norms and
    hc_head beside it (mtp.py _rewrite_spec_layer_name); embed_tokens and lm_head are the main model's."""
    from _values import Source
    if name in MTP_SHARED or name.endswith("shared_head.head.weight"):
        return Source([[MTP_SHARED.get(name, "head.weight")]])
    parts = name.split(".")
    if parts[:2] != ["model", "layers"]:
        return f"no rule for {name}"
    k = int(parts[2]) - n_layers
    rest = ".".join(parts[3:])
    if rest.startswith("mtp_block."):
        return _layer_source("layers.X." + rest.removeprefix("mtp_block."), n_experts, pad_shared, f"mtp.{k}.")
    rest = rest.replace("shared_head.norm.", "norm.")
    leaf = rest.rsplit(".", 1)
    return Source([[f"mtp.{k}.{leaf[0]}.{_scale(leaf[1])}" if len(leaf) == 2 else f"mtp.{k}.{rest}"]])


def config(out: str, layout: str):
    from vllm.engine.arg_utils import EngineArgs
    world, ep = LAYOUTS[layout]
    args = EngineArgs(model=out, skip_tokenizer_init=True, enforce_eager=True, load_format="safetensors",
                      max_model_len=1024, max_num_batched_tokens=1024, tensor_parallel_size=world,
                      enable_expert_parallel=ep, distributed_executor_backend="mp" if world > 1 else None,
                      speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    return args.create_engine_config()


def rank_main(out: str, layout: str, rank: int, init: str, selftest: bool) -> int:
    import _load_check as lc
    import vllm
    from _values import CORRUPTIONS, other_ranks_expert
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.attention import is_deferred_attention_layer
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader
    from vllm.utils.torch_utils import set_default_torch_dtype

    world, ep = LAYOUTS[layout]
    print(f"vllm {vllm.__version__} torch {torch.__version__} cuda={CUDA} output={Path(out).name} "
          f"layout={layout} rank={rank}/{world}")
    cfg = config(out, layout)
    qc = cfg.quant_config
    print(f"quant config: {type(qc).__module__}.{type(qc).__name__}" if qc else "quant config: None")
    if qc is not None:
        with set_current_vllm_config(cfg):
            print(f"expert_dtype resolved: {qc.expert_dtype!r}; linear scales e8m0: {qc.is_scale_e8m0}; "
                  f"weight_block_size: {qc.weight_block_size}; ignored_layers: {len(qc.ignored_layers or [])}")
    hf = cfg.model_config.hf_config
    block = getattr(qc, "weight_block_size", None) if qc else None
    # (elements, blocks) the shared experts' intermediate axis is zero-padded to; model.py:1073
    pad_shared = (world * block[0], world) if block else None
    results, status = [], 0
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"file://{init}")
        initialize_model_parallel(world, 1)
        print(f"CUDA patches (no GPU): {fake_cuda() or 'none'}")
        from vllm.distributed import get_ep_group, get_tensor_model_parallel_rank
        ep_world = get_ep_group().world_size if ep else 1
        ep_rank = get_ep_group().rank_in_group if ep else 0
        tp_rank = get_tensor_model_parallel_rank()
        # with EP the experts are whole on each rank (a block of experts); other layers are TP-sliced
        base = {"casts": CASTS, "rank": tp_rank, "world": world, "ep_rank": ep_rank, "ep_world": ep_world}
        def elsewhere(n):  # with EP, the other rank loads the other block of experts
            return other_ranks_expert(n, ep_rank, ep_world, hf.n_routed_experts)
        main_chk = dict(base, foreign=lambda n: n.startswith("mtp.") or elsewhere(n),
                        source_of=lambda n: source_of_main(n, hf.n_routed_experts, pad_shared))
        draft_cfg = cfg.speculative_config.draft_model_config
        mtp_chk = dict(base, foreign=lambda n: not n.startswith("mtp.") or elsewhere(n),
                       source_of=lambda n: source_of_mtp(n, hf.num_hidden_layers, hf.n_routed_experts, pad_shared))
        models = {}
        for label, kw, chk in (("main", {}, main_chk), ("mtp", {"model_config": draft_cfg}, mtp_chk)):
            try:
                with set_default_torch_dtype(cfg.model_config.dtype), torch.device("cpu"):  # as vLLM's loader
                    model = initialize_model(vllm_config=cfg, **kw)
            except Exception as exc:  # report where the engine's own code stops
                print(f"STOP building the {label} model: {lc.where(exc)}")
                status = 1
                continue
            models[label] = model
            r = lc.load_and_report(model, out, default_weight_loader, f" ({type(model).__name__})", chk,
                                   label=label, after=share_from_main(models) if label == "mtp" else None)
            results.append((label, r))
            status = max(status, r["status"])
        if selftest and "main" in models and "mtp" in models:
            status = max(status, lc.selftest(models, {"main": main_chk, "mtp": mtp_chk}, out, default_weight_loader,
                                             CORRUPTIONS, after={"mtp": share_from_main(models)}))
        for label, r in results:  # last: it rewrites the parameters
            print(f"[{label}] process_weights_after_loading, module by module (CPU):")
            r["post"] = lc.post_process(models[label], cfg.model_config.dtype, is_deferred_attention_layer)
            r["status"] = max(r["status"], int(r["post"] == "FAIL"))
            status = max(status, r["status"])
    for label, r in results:
        print(lc.result_line("vllm", out, label, layout, rank, r))
    return status


def share_from_main(models: dict):
    """After the draft's load, what vLLM's proposer does for an MTP draft (v1/spec_decode/llm_base_proposer.py,
    _maybe_share_embeddings and _maybe_share_lm_head, "Detected MTP model"): the target's embed_tokens and
    lm_head replace the draft's, shared_head.head included. (Importing the proposer needs Triton kernels.)"""
    def after(draft):
        main = models["main"]
        del draft.model.embed_tokens
        draft.model.embed_tokens = main.model.embed_tokens
        if hasattr(draft, "lm_head"):
            del draft.lm_head
        draft.lm_head = main.lm_head
        for layer in draft.model.layers.values():
            if hasattr(getattr(layer, "shared_head", None), "head"):
                del layer.shared_head.head
                layer.shared_head.head = main.lm_head
        print("  MTP draft: embed_tokens and lm_head (shared_head.head) are the main model's, as vLLM's proposer sets")
    return after


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="tp1")
    ap.add_argument("--rank", type=int, default=None, help="(internal) this process's rank")
    ap.add_argument("--init", default=None, help="(internal) the rendezvous file of the ranks")
    ap.add_argument("--selftest", action="store_true", help="also load with each corruption; each must fail")
    a = ap.parse_args()
    world = LAYOUTS[a.layout][0]
    if a.rank is not None:
        return rank_main(a.out, a.layout, a.rank, a.init, a.selftest)
    with tempfile.TemporaryDirectory(prefix="vllm-load-") as tmp:  # private rendezvous: runs never collide
        init = os.path.join(tmp, "init")
        if world == 1:
            return rank_main(a.out, a.layout, 0, init, a.selftest)
        cmd = [sys.executable, __file__, a.out, "--layout", a.layout, "--init", init] + ["--selftest"] * a.selftest
        logs = [open(os.path.join(tmp, f"rank{r}.log"), "w+") for r in range(world)]  # noqa: SIM115
        procs = [subprocess.Popen(cmd + ["--rank", str(r)], stdout=logs[r], stderr=subprocess.STDOUT)
                 for r in range(world)]
        codes = [p.wait() for p in procs]
        for r, log in enumerate(logs):
            log.seek(0)
            print(f"----- rank {r} (exit {codes[r]})\n{log.read()}", end="")
        return max(codes)


if __name__ == "__main__":
    sys.exit(main())
