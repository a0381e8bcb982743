"""SGLang's own start, model classes and load_weights on one output folder, every parameter compared with the file:
    python sglang_load.py OUT [--layout tp1|tp2|ep2] [--selftest]       (SGLANG_DSV4_FP4_EXPERTS=0: FP8/BF16 experts)
Runs what SGLang's scheduler process runs before its model runner loads (server args, model config, publish, process
groups on gloo, layer runtime, MoE and GEMM config), builds DeepseekV4ForCausalLM and the MTP draft model
(DeepseekV4ForCausalLMNextN, the draft ModelConfig of speculative decoding) as SGLang's loader does, runs each one's
load_weights over every tensor of OUT and compares every parameter with its slice of the file. tp2 / ep2 start one
process per rank (tp_size 2; ep2 adds ep_size 2, as `--tp 2 --ep 2`). --selftest loads again with each corruption of
_values.CORRUPTIONS and requires the check to fail.

Without a GPU, torch.cuda answers as an H200 would, SGLang's CUDA extension packages are stubs that raise if
called, tensors asked for on cuda are made in host memory and the process groups use gloo; every such patch is
printed. SGLang's own CPU device cannot build this model (its CPU rotary embedding takes only deepseek_yarn
scaling, and the uncompressed attention layers pass none). Prints the exact file:line where SGLang's code stops."""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("SGLANG_DSV4_FP4_EXPERTS", "0")
sys.path.insert(0, str(Path(__file__).parent))
import _load_check as lc  # noqa: E402
import torch  # noqa: E402

CUDA = torch.cuda.is_available()
H200_BYTES = 141 << 30  # device memory reported by the simulated GPU, bytes
CUDA_VERSION = "12.9"  # the CUDA toolkit version reported with a CPU build of torch
STUBBED = ["sgl_kernel", "deep_gemm"]  # CUDA-only extension packages: importing works, calling raises
ABSENT = ["sgl_kernel.scalar_type"]  # imported under try/except ImportError with a pure-Python fallback


def simulate_h200() -> list:
    """torch.cuda answers as one H200 (capability 9.0) would; no kernel can run. Returns what was replaced."""
    import types

    class FakeStream:  # constructors only keep streams and events for later kernel overlap
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a):
            pass

        def record(self, *a):
            pass

    props = types.SimpleNamespace(name="NVIDIA H200 (simulated)", major=9, minor=0, total_memory=H200_BYTES,
                                  multi_processor_count=132)
    fakes = {"is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
             "set_device": lambda *a: None, "get_device_capability": lambda *a: (9, 0),
             "get_device_name": lambda *a: props.name, "get_device_properties": lambda *a: props,
             "mem_get_info": lambda *a: (H200_BYTES, H200_BYTES), "Stream": FakeStream, "Event": FakeStream,
             "current_stream": lambda *a: FakeStream(), "synchronize": lambda *a: None}
    for attr, obj in fakes.items():
        setattr(torch.cuda, attr, obj)
    extra = []
    if torch.version.cuda is None:  # a CPU build of torch: SGLang's is_cuda() also asks for the CUDA version
        torch.version.cuda = CUDA_VERSION
        extra.append(f"torch.version.cuda = {CUDA_VERSION!r}")
    _cuda_stub.install(STUBBED, ABSENT)
    HostForCuda().__enter__()  # for the whole process, as SGLang's own device context would be
    return ([f"torch.cuda.{a}" for a in fakes] + extra + [f"{m} (stub module)" for m in STUBBED]
            + ["tensors asked for on cuda are made in host memory (TorchFunctionMode)"])


def _host(dev):
    return "cpu" if dev is not None and torch.device(dev).type == "cuda" else dev


class HostForCuda(torch.overrides.TorchFunctionMode):
    """Tensors asked for on cuda (device=, .to, .cuda) are made in host memory instead; pinning is dropped."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        kwargs.pop("pin_memory", None)
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, torch.device, int)) \
                and not isinstance(args[1], bool):
            args = (args[0], _host(args[1] if not isinstance(args[1], int) else "cuda"), *args[2:])
        return func(*args, **kwargs)


FAKES = []
if not CUDA:  # before SGLang is imported: its modules read the platform at import time
    import _cuda_stub  # noqa: E402

    FAKES = simulate_h200()

def fake_bootstrap(bootstrap) -> list:
    """The distributed start on gloo: NCCL needs a GPU, and world size 1 moves no data."""
    if CUDA:
        return []
    bootstrap._resolve_backend = lambda device: "gloo"
    from sglang.srt.distributed import parallel_state as ps
    init = ps.GroupCoordinator.__init__

    def no_gpu_comms(self, *a, **k):  # NCCL, custom all-reduce, MSCCL++, symmetric memory: GPU-only
        k.update(use_pynccl=False, use_mscclpp=False, use_custom_allreduce=False,
                 use_torch_symm_mem_all_reduce=False)
        return init(self, *a, **k)
    ps.GroupCoordinator.__init__ = no_gpu_comms
    return ["bootstrap._resolve_backend -> gloo", "GroupCoordinator: no pynccl, custom all-reduce, mscclpp, symm mem"]


def start(out: str, layout: str, rank: int, port: int):
    """SGLang's scheduler start up to the model load (managers/scheduler.py run_scheduler_process, Scheduler
    __init__): publish, init_parallel_runtime, init_layer_runtime, init_moe_gemm_config."""
    import sglang
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import SpawnRanks, get_device, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    print(f"sglang {sglang.__version__}")
    world, ep = LAYOUTS[layout]
    args = ServerArgs(model_path=out, skip_tokenizer_init=True, load_format="safetensors", device="cuda",
                      tp_size=world, ep_size=world if ep else 1, speculative_algorithm="EAGLE",
                      speculative_draft_model_path=out, speculative_num_steps=1, speculative_eagle_topk=1,
                      speculative_num_draft_tokens=2)
    mc = ModelConfig.from_server_args(args)
    print(f"architecture: {mc.hf_config.architectures}; quantization: {mc.quantization}; dtype: {mc.dtype}")
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=rank, dp_rank=None, gpu_id=rank))
    par = get_parallel()
    print(f"published: device {get_device().device}, tp {par.tp_size}, moe_ep {par.moe_ep_size}, "
          f"attn_tp {par.attn_tp_size}, pp {par.pp_size}")
    from sglang.srt.distributed import bootstrap
    print(f"CUDA patches (no GPU): {FAKES + fake_bootstrap(bootstrap) if not CUDA else 'none'}")
    bootstrap.init_parallel_runtime(server_args=args, device=get_device().device, dist_port=port)
    bootstrap.init_layer_runtime(model_config=mc)
    print(f"process groups: {torch.distributed.get_backend()}, world size {torch.distributed.get_world_size()}")
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
    initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_fp4_gemm_config()
    initialize_bf16_gemm_config()
    return args, mc


def build(args, mc, draft=False):
    """DefaultModelLoader.initialize_model_for_startup: quant config, then the model class under the model dtype."""
    from sglang.srt.model_executor.model_runner_components.load_model_utils import build_load_config
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM  # SGLang's registry hides import errors
    from sglang.srt.models.deepseek_v4_nextn import DeepseekV4ForCausalLMNextN

    if not CUDA:  # the last step of load_weights JIT-compiles and runs the MHC kernels once (warm-up only)
        DeepseekV4ForCausalLM._prewarm_mhc_kernels = lambda self: None
        print("CUDA patches (no GPU): DeepseekV4ForCausalLM._prewarm_mhc_kernels -> no-op")
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.runtime_context import get_model, get_parallel

    lcfg = build_load_config(server_args=args, tp_rank=get_parallel().tp_rank,
                             remote_instance_weight_transporter_engine=None,
                             remote_instance_weight_transporter_session_id="", draft_model_idx=None,
                             weight_cache_mode=get_model().weight_cache_mode,
                             weight_cache_socket=get_model().weight_cache_socket)
    qc = _get_quantization_config(mc, lcfg)
    print(f"quant config: {type(qc).__module__}.{type(qc).__name__}" if qc else "quant config: None")
    # parameters live in host memory; SGLang's code still takes the CUDA paths it would take on a GPU
    with set_default_torch_dtype(mc.dtype), torch.device("cuda" if CUDA else "cpu"):
        model = _initialize_model(mc, lcfg, qc)
    want = DeepseekV4ForCausalLMNextN if draft else DeepseekV4ForCausalLM
    if type(model) is not want:
        raise TypeError(f"SGLang built {type(model).__module__}.{type(model).__name__}, not {want.__name__}")
    return model


def get_device_name() -> str:
    from sglang.srt.runtime_context import get_device
    return get_device().device


LAYOUTS = {"tp1": (1, False), "tp2": (2, False), "ep2": (2, True)}  # name -> (world size, expert parallel)
# (file dtype, parameter dtype) -> (parameter names it applies to, why): value-preserving conversions at load
CASTS = {
    (torch.float8_e8m0fnu, torch.float32): (r"(weight_scale_inv|_scale_inv)$", "FP8 block scales held as float32"),
    (torch.bfloat16, torch.float32): (r"compressor\.norm\.weight$", "compressor RMSNorm weight held as float32"),
    (torch.int64, torch.int32): (r"\.topk\.tid2eid$", "hash-routing table held as int32"),
}
FUSED = {"self_attn.wqkv_a": ["attn.wq_a", "attn.wkv"], "mlp.shared_experts.gate_up_proj": ["ffn.shared_experts.w1",
         "ffn.shared_experts.w3"], "self_attn.compressor.wkv_gate": ["attn.compressor.wkv", "attn.compressor.wgate"],
         "self_attn.indexer.compressor.wkv_gate": ["attn.indexer.compressor.wkv", "attn.indexer.compressor.wgate"]}
RENAMES = [("self_attn.", "attn."), ("mlp.", "ffn."), ("input_layernorm.", "attn_norm."),
           ("post_attention_layernorm.", "ffn_norm."), ("topk.tid2eid", "gate.tid2eid"),
           ("gate.e_score_correction_bias", "gate.bias"), ("gate_proj.", "w1."), ("down_proj.", "w2."),
           ("up_proj.", "w3.")]


def _leaf(leaf: str) -> str:
    return "scale" if leaf in ("weight_scale_inv", "weight_scale") else leaf


def dequant_wo_a(ck: dict, base: str):
    """wo_a of an FP8 file: SGLang dequantizes it to BF16 while loading (models/deepseek_v4.py:5701,
    _dequant_fp8_wo_a_streaming); recomputed here: E4M3 values times their 128x128 block's scale, in float32,
    rounded to BF16."""
    from _values import Source
    w, sc = f"{base}attn.wo_a.weight", f"{base}attn.wo_a.scale"
    if ck.get(w) is None or ck[w].dtype != torch.float8_e4m3fn:
        return Source([[w]])

    def fn(t, shape):
        s = ck[sc].float()
        bn, bk = t.shape[0] // s.shape[0], t.shape[1] // s.shape[1]
        return (t.float() * s.repeat_interleave(bn, 0).repeat_interleave(bk, 1)).to(torch.bfloat16)
    return Source([[w]], transform=fn, extra=[sc], whole_first=True)


def ape_overlap(t, shape):
    """An overlapping (ratio 4) compressor's ape [ratio, 2d]: SGLang moves the second half of the columns below
    the first and views the result as [ratio, 2d] again (layers/attention/dsv4/compressor.py:117, at load)."""
    return torch.cat(t.chunk(2, dim=-1), dim=0).reshape(t.shape)


def layer_source(ck: dict, path: str, leaf: str, base: str, n_experts: int, ratio: int = 0):
    """SGLang's module path and leaf inside one decoder layer -> Source (names with base = 'layers.N.')."""
    from _values import Source
    if leaf == "ape" and ratio == 4:
        return Source([[f"{base}{path.replace('self_attn.', 'attn.')}.ape"]], transform=ape_overlap)
    if path in FUSED:
        return Source([[f"{base}{p}.{_leaf(leaf)}" for p in FUSED[path]]])
    if path == "mlp.experts":  # FusedMoE: w13 = w1 rows then w3 rows, stacked over experts
        w, _, kind = leaf.partition("_")
        ws = {"w13": ["w1", "w3"], "w2": ["w2"]}[w]
        suf = "weight" if kind == "weight" else "scale"
        return Source([[f"{base}ffn.experts.{e}.{x}.{suf}" for x in ws] for e in range(n_experts)], stack=True)
    if path == "self_attn.wo_a" and leaf == "weight":
        return dequant_wo_a(ck, base)
    if path == "self_attn.attn_mqa" and leaf in ("k_scale", "v_scale"):
        return "engine-set: FP8 KV-cache scale, in no checkpoint, set to 1.0 (layers/quantization/kv_cache.py:62)"
    name = f"{path}.{leaf}" if path else leaf
    for a, b in RENAMES:
        name = name.replace(a, b)
    head, _, lf = name.rpartition(".")
    return Source([[f"{base}{head}.{_leaf(lf)}" if head else f"{base}{lf}"]])


def source_main(ck: dict, name: str, n_experts: int, ratios: list):
    from _values import Source
    top = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
           "model.norm.weight": "norm.weight"}
    if name in top:
        return Source([[top[name]]])
    if name.startswith("model.hc_head_"):
        return Source([[name.removeprefix("model.")]])
    parts = name.split(".")
    if parts[:2] != ["model", "layers"]:
        return f"no rule for {name}"
    n = int(parts[2])
    return layer_source(ck, ".".join(parts[3:-1]), parts[-1], f"layers.{n}.", n_experts, ratios[n])


def source_mtp(ck: dict, name: str, n_experts: int):
    """DeepseekV4ForCausalLMNextN: the MTP block mtp.0.* (model.decoder.*, e_proj/h_proj/norms/hc_head beside it);
    embed_tokens and lm_head are the main model's tensors (the file's mtp.0 has none)."""
    from _values import Source
    top = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight"}
    if name in top:
        return Source([[top[name]]])
    parts = name.split(".")
    if parts[:2] == ["model", "decoder"]:
        return layer_source(ck, ".".join(parts[2:-1]), parts[-1], "mtp.0.", n_experts)
    rest = ".".join(parts[1:]).replace("shared_head.norm.", "norm.")
    head, _, lf = rest.rpartition(".")
    return Source([[f"mtp.0.{head}.{_leaf(lf)}" if head else f"mtp.0.{lf}"]])


def rank_main(out: str, layout: str, rank: int, port: int, selftest: bool) -> int:
    from _values import CORRUPTIONS, load_file, other_ranks_expert
    print(f"output={Path(out).name} torch {torch.__version__} cuda={CUDA} "
          f"SGLANG_DSV4_FP4_EXPERTS={os.environ['SGLANG_DSV4_FP4_EXPERTS']} layout={layout} rank={rank}")
    try:
        args, mc = start(out, layout, rank, port)
    except Exception as exc:  # report where the engine's own code stops
        print(f"STOP at SGLang's start (server args, publish, process groups): {lc.where(exc)}")
        return 1
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    world, ep = LAYOUTS[layout]
    ck = load_file(out)
    n_exp = mc.hf_config.n_routed_experts
    base = {"casts": CASTS, "rank": par.tp_rank, "world": par.tp_size,
            "ep_rank": par.moe_ep_rank if ep else 0, "ep_world": par.moe_ep_size if ep else 1}
    def elsewhere(n):  # with EP, the other rank loads the other block of experts
        return other_ranks_expert(n, base["ep_rank"], base["ep_world"], n_exp)
    checks = {"main": dict(base, foreign=lambda n: n.startswith("mtp.") or elsewhere(n),
                           source_of=lambda n: source_main(ck, n, n_exp, mc.hf_config.compress_ratios)),
              "mtp": dict(base, foreign=lambda n: not n.startswith("mtp.") or elsewhere(n),
                          source_of=lambda n: source_mtp(ck, n, n_exp))}
    models, results, status = {}, [], 0
    for label in ("main", "mtp"):
        try:
            cfg = mc if label == "main" else ModelConfig.from_server_args(args, model_path=out, is_draft_model=True)
            model = build(args, cfg, draft=label == "mtp")
        except Exception as exc:
            print(f"STOP building the {label} model: {lc.where(exc)}")
            status = 1
            continue
        models[label] = model
        r = lc.load_and_report(model, out, default_weight_loader,
                               f" ({type(model).__name__}, device {get_device_name()}, dtype {cfg.dtype})",
                               checks[label], label=label, after=share(models) if label == "mtp" else None)
        results.append((label, r, cfg.dtype))
        status = max(status, r["status"])
    if selftest and len(models) == 2:
        status = max(status, lc.selftest(models, checks, out, default_weight_loader, CORRUPTIONS,
                                         after={"mtp": share(models)}))
    for label, r, dtype in results:  # last: it rewrites the parameters
        print(f"[{label}] quant methods' process_weights_after_loading, module by module (CPU):")
        r["post"] = lc.post_process(models[label], dtype)
        r["status"] = max(r["status"], int(r["post"] == "FAIL"))
        status = max(status, r["status"])
    for label, r, _ in results:
        print(lc.result_line("sglang", out, label, layout, rank, r))
    return status


def share(models: dict):
    """After the draft's load, what SGLang's EAGLE worker does (speculative/eagle_worker_v2.py:378): the target's
    embed_tokens and lm_head weights become the draft's (the model's own set_embed_and_head)."""
    def after(draft):
        draft.set_embed_and_head(*models["main"].get_embed_and_head())
        print("  MTP draft: embed_tokens and lm_head are the main model's (set_embed_and_head, as SGLang's worker)")
    return after


def free_port() -> int:
    with socket.socket() as s:  # the kernel's pick: two runs at once never share a port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="tp1")
    ap.add_argument("--rank", type=int, default=None, help="(internal) this process's rank")
    ap.add_argument("--port", type=int, default=None, help="(internal) the ranks' rendezvous port")
    ap.add_argument("--selftest", action="store_true", help="also load with each corruption; each must fail")
    a = ap.parse_args()
    world = LAYOUTS[a.layout][0]
    if a.rank is not None:
        return rank_main(a.out, a.layout, a.rank, a.port, a.selftest)
    port = free_port()
    if world == 1:
        return rank_main(a.out, a.layout, 0, port, a.selftest)
    cmd = [sys.executable, __file__, a.out, "--layout", a.layout, "--port", str(port)] + ["--selftest"] * a.selftest
    with tempfile.TemporaryDirectory(prefix="sglang-load-") as tmp:
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
