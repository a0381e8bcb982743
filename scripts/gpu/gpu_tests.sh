#!/bin/bash
# The GPU tests that need only torch and FlashInfer's megamoe (the bundle in FI_DIR where flashinfer is not
# installed), the EP proof included, on a CUDA host, from the repo root; the log goes to $OUT (default ./gpu-out):
#   bash scripts/gpu/gpu_tests.sh [FI_DIR]
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
. "$(dirname "$0")/fi_bundle.sh" "${1:-.fi}" || exit
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the EP proof's child processes import the package from here
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
python3 -m pytest -q -p no:cacheprovider -m gpu tests/numerics/test_numerics_fp4.py tests/targets/test_gpu_convert.py \
  tests/targets/test_ep_gpu.py tests/runtime -k 'not moe_ep and not sm90_fp8 and not sm100 and not cake' 2>&1 |
  tee "$OUT/gpu-tests.log"
