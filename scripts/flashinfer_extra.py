#!/usr/bin/env python3
"""python3 scripts/flashinfer_extra.py: prints the extra of fimoe-convert that installs FlashInfer for the torch here,
for the README's set-up (`pip install -e ".[$(python3 scripts/flashinfer_extra.py)]"`). A CUDA torch gets the extra
of its CUDA major (flashinfer-cu12, flashinfer-cu13: cuda-python held to that major); a CPU torch, or a CUDA major
FlashInfer has no extra for, gets `flashinfer` (FlashInfer's own choice: cuda-python 13). Needs torch only."""

import sys

BY_MAJOR = {"12": "flashinfer-cu12", "13": "flashinfer-cu13"}  # CUDA major of torch.version.cuda -> extra
DEFAULT = "flashinfer"


def extra_for(cuda: str | None) -> tuple[str, str | None]:
    """(the extra for a torch built for CUDA `cuda` (None: a CPU or ROCm build), a note for stderr or None)."""
    if cuda is None:
        return DEFAULT, None
    major = cuda.split(".")[0]
    if major in BY_MAJOR:
        return BY_MAJOR[major], None
    return DEFAULT, (f"torch here is built for CUDA {cuda}; fimoe-convert has extras for CUDA "
                     f"{' and '.join(sorted(BY_MAJOR))} only, so [{DEFAULT}] (FlashInfer's own choice, cuda-python 13)")


def main() -> int:
    import torch

    extra, note = extra_for(torch.version.cuda)
    if note:
        print(f"flashinfer_extra.py: {note}", file=sys.stderr)
    print(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
