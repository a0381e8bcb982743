"""SGLang's own start on one output folder: `python sglang_load.py OUT` (SGLANG_DSV4_FP4_EXPERTS=0: FP8/BF16
experts). Runs what SGLang's scheduler process runs before its model runner loads (server args, model config,
publish for TP 1 / EP 1, process groups on gloo with world size 1, layer runtime, MoE and GEMM config), builds
DeepseekV4ForCausalLM as SGLang's loader does, and runs its load_weights over every tensor of OUT. Without a GPU,
SGLang's own CPU device is used; it prints the exact file:line where SGLang's code stops."""
import os
import sys
from pathlib import Path

os.environ.setdefault("SGLANG_DSV4_FP4_EXPERTS", "0")
sys.path.insert(0, str(Path(__file__).parent))
import _load_check as lc  # noqa: E402
import torch  # noqa: E402

CUDA = torch.cuda.is_available()
DIST_PORT = 29533  # gloo rendezvous port of the world-size-1 group (only this process joins)


def start(out: str):
    """SGLang's scheduler start up to the model load (managers/scheduler.py run_scheduler_process, Scheduler
    __init__): publish, init_parallel_runtime, init_layer_runtime, init_moe_gemm_config."""
    import sglang
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import SpawnRanks, get_device, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    print(f"sglang {sglang.__version__}")
    # without an accelerator SGLang's own device detection raises; its CPU backend is the device that exists
    args = ServerArgs(model_path=out, skip_tokenizer_init=True, load_format="safetensors",
                      device="cuda" if CUDA else "cpu")
    mc = ModelConfig.from_server_args(args)
    print(f"architecture: {mc.hf_config.architectures}; quantization: {mc.quantization}; dtype: {mc.dtype}")
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    par = get_parallel()
    print(f"published: device {get_device().device}, tp {par.tp_size}, moe_ep {par.moe_ep_size}, "
          f"attn_tp {par.attn_tp_size}, pp {par.pp_size}")
    from sglang.srt.distributed import bootstrap
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
    from sglang.srt.runtime_context import get_model, get_parallel
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    lcfg = build_load_config(server_args=args, tp_rank=get_parallel().tp_rank,
                             remote_instance_weight_transporter_engine=None,
                             remote_instance_weight_transporter_session_id="", draft_model_idx=None,
                             weight_cache_mode=get_model().weight_cache_mode,
                             weight_cache_socket=get_model().weight_cache_socket)
    qc = _get_quantization_config(mc, lcfg)
    print(f"quant config: {type(qc).__module__}.{type(qc).__name__}" if qc else "quant config: None")
    with set_default_torch_dtype(mc.dtype), torch.device(get_device_name()):
        return _initialize_model(mc, lcfg, qc)


def get_device_name() -> str:
    from sglang.srt.runtime_context import get_device
    return get_device().device


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

    return lc.load_and_report(model, out, default_weight_loader, f" (device {get_device_name()}, dtype {mc.dtype})")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
