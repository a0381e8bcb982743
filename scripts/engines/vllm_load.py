"""vLLM's own config and DeepSeek V4 quant-config selection on one output folder: `python vllm_load.py OUT`.

Without a GPU, vLLM is told it runs on an H200 (capability 9.0) and its CUDA extension modules are replaced by
stubs that raise if called, so only Python-level code runs. Then builds the CUDA model class on the CPU and
prints the exact line where it stops; load_weights is not reached on a CPU yet."""

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
    return build(cfg)


def build(cfg) -> int:
    """Build DeepseekV4ForCausalLM (the CUDA model class) on the CPU; print the exact point where it stops."""
    import tempfile
    import traceback

    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp()}")
        initialize_model_parallel(1, 1)
        from vllm.models.deepseek_v4.nvidia.model import DeepseekV4ForCausalLM

        try:
            with torch.device("cpu"):
                model = DeepseekV4ForCausalLM(vllm_config=cfg, prefix="")
        except Exception as exc:  # report where the engine's own code stops
            frame = traceback.extract_tb(exc.__traceback__)[-2]
            print(f"STOP building the model: {Path(frame.filename).name}:{frame.lineno} `{frame.line}` "
                  f"-> {type(exc).__name__}: {exc}")
            return 1
    print(f"built: {sum(1 for _ in model.named_parameters())} parameters; load_weights not run by this script")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
