"""SGLang's own start on one output folder: `python sglang_load.py OUT` (SGLANG_DSV4_FP4_EXPERTS=0: FP8/BF16
experts). Runs what SGLang's scheduler process runs before its model runner loads (server args, model config,
publish for TP 1 / EP 1, process groups on gloo with world size 1, layer runtime, MoE and GEMM config), builds
DeepseekV4ForCausalLM as SGLang's loader does, and runs its load_weights over every tensor of OUT.

Without a GPU, torch.cuda answers as one H200 would, SGLang's CUDA extension packages are stubs that raise if
called, tensors asked for on cuda are made in host memory and the process groups use gloo; every such patch is
printed. SGLang's own CPU device cannot build this model (its CPU rotary embedding takes only deepseek_yarn
scaling, and the uncompressed attention layers pass none). Prints the exact file:line where SGLang's code stops."""
import os
import sys
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

DIST_PORT = 29533  # gloo rendezvous port of the world-size-1 group (only this process joins)


def fake_bootstrap(bootstrap) -> list:
    """The distributed start on gloo: NCCL needs a GPU, and world size 1 moves no data."""
    if CUDA:
        return []
    bootstrap._resolve_backend = lambda device: "gloo"
    return ["bootstrap._resolve_backend -> gloo"]


def start(out: str):
    """SGLang's scheduler start up to the model load (managers/scheduler.py run_scheduler_process, Scheduler
    __init__): publish, init_parallel_runtime, init_layer_runtime, init_moe_gemm_config."""
    import sglang
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import SpawnRanks, get_device, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    print(f"sglang {sglang.__version__}")
    args = ServerArgs(model_path=out, skip_tokenizer_init=True, load_format="safetensors", device="cuda")
    mc = ModelConfig.from_server_args(args)
    print(f"architecture: {mc.hf_config.architectures}; quantization: {mc.quantization}; dtype: {mc.dtype}")
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    par = get_parallel()
    print(f"published: device {get_device().device}, tp {par.tp_size}, moe_ep {par.moe_ep_size}, "
          f"attn_tp {par.attn_tp_size}, pp {par.pp_size}")
    from sglang.srt.distributed import bootstrap
    print(f"CUDA patches (no GPU): {FAKES + fake_bootstrap(bootstrap) if not CUDA else 'none'}")
    bootstrap.init_parallel_runtime(server_args=args, device=get_device().device, dist_port=DIST_PORT)
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


def build(args, mc):
    """DefaultModelLoader.initialize_model_for_startup: quant config, then the model class under the model dtype."""
    from sglang.srt.model_executor.model_runner_components.load_model_utils import build_load_config
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM  # SGLang's registry hides import errors

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
    if not isinstance(model, DeepseekV4ForCausalLM):
        raise TypeError(f"SGLang built {type(model).__module__}.{type(model).__name__}, not DeepseekV4ForCausalLM")
    return model


def get_device_name() -> str:
    from sglang.srt.runtime_context import get_device
    return get_device().device


def compare_experts(model, out: str) -> int:
    """Routed and shared experts' parameters after load_weights against the checkpoint's tensors, byte for byte
    (w13 = w1 rows then w3 rows; FP8 scales compared as float32 values)."""
    from safetensors import safe_open

    ck = {}
    for shard in sorted(Path(out).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            names = [n for n in f.keys() if ".ffn." in n and not n.startswith("mtp.")]  # noqa: SIM118 - no dict
            ck.update({n: f.get_tensor(n) for n in names})
    params = dict(model.named_parameters())
    same = diff = 0
    for i in range(model.config.num_hidden_layers):
        pre, src = f"model.layers.{i}.mlp.", f"layers.{i}.ffn."
        pairs = [(f"{pre}shared_experts.gate_up_proj", None, f"{src}shared_experts.w1", f"{src}shared_experts.w3"),
                 (f"{pre}shared_experts.down_proj", None, f"{src}shared_experts.w2", None)]
        for e in range(model.config.n_routed_experts):
            pairs += [(f"{pre}experts.w13", e, f"{src}experts.{e}.w1", f"{src}experts.{e}.w3"),
                      (f"{pre}experts.w2", e, f"{src}experts.{e}.w2", None)]
        for dst, e, a, b in pairs:
            for dsuf, ssuf in (("weight", ".weight"), ("weight_scale_inv", ".scale")):
                name = f"{dst}.{dsuf}" if e is None else f"{dst}_{dsuf}"
                if name not in params or a + ssuf not in ck:
                    continue
                want = torch.cat([ck[n + ssuf] for n in (a, b) if n])
                got = params[name].data if e is None else params[name].data[e]
                if ssuf == ".scale":
                    got, want = got.float(), want.float()
                ok = got.shape == want.shape and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
                same, diff = same + ok, diff + (not ok)
    print(f"values: {same} expert weight/scale tensors byte-identical to the checkpoint, {diff} differ")
    return int(diff > 0 or same == 0)


def main(out: str) -> int:
    print(f"output={Path(out).name} torch {torch.__version__} cuda={CUDA} "
          f"SGLANG_DSV4_FP4_EXPERTS={os.environ['SGLANG_DSV4_FP4_EXPERTS']}")
    try:
        args, mc = start(out)
    except Exception as exc:  # report where the engine's own code stops
        print(f"STOP at SGLang's start (server args, publish, process groups): {lc.where(exc)}")
        return 1
    try:
        model = build(args, mc)
    except Exception as exc:
        print(f"STOP building the model: {lc.where(exc)}")
        return 1
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    status = lc.load_and_report(model, out, default_weight_loader, f" (device {get_device_name()}, dtype {mc.dtype})")
    return max(status, compare_experts(model, out))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
