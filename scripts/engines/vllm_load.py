"""vLLM's own config and DeepSeek V4 quant-config selection on one output folder: `python vllm_load.py OUT`.

Without a GPU, vLLM is told it runs on an H200 (capability 9.0) and its CUDA extension modules are replaced by
stubs that raise if called, so only Python-level code runs; the CUDA stream/event objects the model's
constructor keeps are replaced by inert fakes (printed). Then builds the CUDA model class on the CPU, prints the
quant method per layer kind, and runs the model's own load_weights over every tensor of OUT."""

import sys
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

    platforms._current_platform = SimulatedH200()
    import vllm._custom_ops as ops  # noqa: E402

    # capability queries that import-time code asks the CUDA extension; answered as on Hopper
    for _n in ("cutlass_scaled_mm_supports_block_fp8", "cutlass_scaled_mm_supports_fp8",
               "cutlass_scaled_mm_supports_fp4", "cutlass_group_gemm_supported"):
        setattr(ops, _n, lambda cap: True)


def main(out: str) -> int:
    import vllm
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    print(f"vllm {vllm.__version__} torch {torch.__version__} cuda={CUDA} output={Path(out).name}")
    args = EngineArgs(model=out, skip_tokenizer_init=True, enforce_eager=True, load_format="safetensors",
                      max_model_len=1024, max_num_batched_tokens=1024)
    cfg = args.create_engine_config()
    qc = cfg.quant_config
    print(f"architecture: {cfg.model_config.hf_config.architectures}")
    print(f"quant config: {type(qc).__module__}.{type(qc).__name__}" if qc else "quant config: None")
    if qc is not None:
        with set_current_vllm_config(cfg):
            print(f"expert_dtype resolved: {qc.expert_dtype!r}; linear scales e8m0: {qc.is_scale_e8m0}")
            print(f"weight_block_size: {qc.weight_block_size}; ignored_layers: {len(qc.ignored_layers or [])}")
    return build(cfg, out)


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


def build(cfg, out: str) -> int:
    """Build DeepseekV4ForCausalLM (the CUDA model class) on the CPU, then run its load_weights over OUT."""
    import tempfile

    import _load_check as lc
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(cfg):
        if not torch.distributed.is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{tempfile.mktemp()}")
            initialize_model_parallel(1, 1)
        from vllm.models.deepseek_v4.nvidia.model import DeepseekV4ForCausalLM

        print(f"CUDA patches (no GPU): {fake_cuda() or 'none'}")
        try:
            with set_default_torch_dtype(cfg.model_config.dtype), torch.device("cpu"):  # as vLLM's loader
                model = DeepseekV4ForCausalLM(vllm_config=cfg, prefix="")
        except Exception as exc:  # report where the engine's own code stops
            print(f"STOP building the model: {lc.where(exc)}")
            return 1
        return lc.load_and_report(model, out, default_weight_loader, f" (default dtype {cfg.model_config.dtype})")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
