"""SGLang's own server args, model config, quant config and DeepSeek V4 model build and load_weights on one output
folder: `python sglang_load.py OUT` (SGLANG_DSV4_FP4_EXPERTS=0: FP8/BF16 experts). Without a GPU it goes as far
as SGLang's code runs and prints the exact file:line where it stops."""
import os
import sys
from pathlib import Path

os.environ.setdefault("SGLANG_DSV4_FP4_EXPERTS", "0")
sys.path.insert(0, str(Path(__file__).parent))
import _load_check as lc  # noqa: E402
import torch  # noqa: E402


def main(out: str) -> int:
    print(f"output={Path(out).name} torch {torch.__version__} cuda={torch.cuda.is_available()} "
          f"SGLANG_DSV4_FP4_EXPERTS={os.environ['SGLANG_DSV4_FP4_EXPERTS']}")
    try:
        import sglang
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.server_args import ServerArgs
        print(f"sglang {sglang.__version__}")
        args = ServerArgs(model_path=out, skip_tokenizer_init=True, load_format="safetensors")
        mc = ModelConfig.from_server_args(args)
        print(f"architecture: {mc.hf_config.architectures}; quantization: {mc.quantization}")
    except Exception as exc:  # report where the engine's own code stops
        print(f"STOP at server args / model config: {lc.where(exc)}")
        return 1
    try:
        from sglang.srt.model_loader.loader import _get_quantization_config
        qc = _get_quantization_config(mc, args.get_load_config() if hasattr(args, "get_load_config") else None)
        print(f"quant config: {type(qc).__module__}.{type(qc).__name__}" if qc else "quant config: None")
    except Exception as exc:
        print(f"STOP at quant config: {lc.where(exc)}")
        return 1
    try:
        from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM
        with torch.device("cpu"):
            model = DeepseekV4ForCausalLM(config=mc.hf_config, quant_config=qc)
    except Exception as exc:
        print(f"STOP building the model: {lc.where(exc)}")
        return 1
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    return lc.load_and_report(model, out, default_weight_loader, "")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
