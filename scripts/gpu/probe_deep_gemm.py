"""Try `import deep_gemm` from one sgl-deep-gemm release, then call the C++ function
FlashInfer's deepgemm preprocess needs, as FlashInfer calls it (a missing torch symbol that the loader
left unresolved - tvm-ffi modules may be opened lazily - shows up here as a `symbol lookup error`).
usage: pip install --target DIR sgl-deep-gemm==VERSION   (one folder per release; apache-tvm-ffi as it pins)
       PYTHONPATH=DIR python3 scripts/gpu/probe_deep_gemm.py VERSION
Prints `CAND <version> | LOAD ok|FAIL | <3 transform functions present> | <deep_gemm.__version__ or the exact error>`
and `CALL <version> | ...`."""

import sys
import traceback


def exact(e):
    """The exception, then each exception it was raised from (torch.ops.load_library keeps dlopen's
    message in __cause__)."""
    parts = []
    while e is not None and len(parts) < 4:
        parts.append("".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " / "))
        e = e.__cause__ or e.__context__
    return " <- from ".join(parts)


want = sys.argv[1]
FUNCS = ("transform_weights_for_mega_moe", "transform_sf_into_required_layout", "transform_weights_for_mega_moe_sm90")
try:
    import deep_gemm  # imports torch first, whose libraries its _C.so links
    import torch
except BaseException as e:  # noqa: BLE001  (the exact error is the result)
    print(f"CAND {want} | LOAD FAIL | - | {exact(e)}", flush=True)
    sys.exit(0)
have = ",".join("Y" if hasattr(deep_gemm, f) else "-" for f in FUNCS)
print(f"CAND {want} | LOAD ok | {have} | deep_gemm {getattr(deep_gemm, '__version__', '?')} from {deep_gemm.__file__}",
      flush=True)
try:  # FlashInfer 0.7.4 (fp8_fp4_bf16_deepgemm/weights.py): transform_sf_into_required_layout(w_sf, n, k, (1, 32), E)
    sf = torch.full((2, 256, 8), 1.0, device="cuda")
    r = deep_gemm.transform_sf_into_required_layout(sf, 256, 256, (1, 32), 2)
    print(f"CALL {want} | transform_sf_into_required_layout(fp32 (2, 256, 8), 256, 256, (1, 32), 2) -> "
          f"{tuple(r.shape)} {r.dtype} stride {r.stride()}", flush=True)
except BaseException as e:  # noqa: BLE001
    print(f"CALL {want} | transform_sf_into_required_layout(fp32 (2, 256, 8), 256, 256, (1, 32), 2) -> {exact(e)}",
          flush=True)
