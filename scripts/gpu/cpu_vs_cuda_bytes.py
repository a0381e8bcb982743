"""Which output bytes depend on the device a target converts on: one tiny fixture converted with --device cpu and
--device cuda, compared tensor by tensor (elements that differ; for FP8 E4M3, the largest distance in codes).

usage: python3 scripts/gpu/cpu_vs_cuda_bytes.py TARGET [--param K=V ...]   (needs a CUDA device)"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open

from fimoe_convert.testing import make_checkpoint


def tensors(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.glob("*.safetensors")):
        with safe_open(str(p), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 - safe_open is not iterable
    return out


def main() -> None:
    target, flags = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        src = make_checkpoint(Path(tmp) / "src", "tiny", layers=2, hash_layers=1, mtp=1, extreme_scales=False)
        got = {}
        for device in ("cpu", "cuda"):
            subprocess.run([sys.executable, "-m", "fimoe_convert", str(src), f"{tmp}/{device}", "--target", target,
                            "--device", device, "--arch", "9.0", "--ep-size", "2", "-q", *flags], check=True)
            got[device] = tensors(Path(tmp) / device)
    total = differ = 0
    for name, a in got["cpu"].items():
        b = got["cuda"][name]
        total += a.numel()
        ne = (a.view(torch.uint8) != b.view(torch.uint8)) if a.element_size() == 1 else (a != b)
        if ne.any():
            differ += int(ne.sum())
            line = f"{name}: {int(ne.sum())} of {a.numel()} elements differ ({a.dtype})"
            if a.dtype == torch.float8_e4m3fn:
                codes = (a.view(torch.uint8).int() - b.view(torch.uint8).int()).abs()
                line += f", at most {int(codes.max())} code(s) apart"
            print(line)
    print(f"{target} {' '.join(flags)}: {differ} of {total} elements differ between --device cpu and cuda")


if __name__ == "__main__":
    main()
