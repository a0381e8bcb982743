#!/bin/bash
# --stream against a plain download at V4-Flash expert geometry (2 layers of 256 experts and the MTP layer: 10.4 GB
# of shards), bf16, fp8_block and megamoe_sm90_mxfp4, 100 MB/s per connection, on a CUDA host, from the repo root:
#   bash scripts/gpu/bench_stream.sh RATE[,RATE...] [FI_DIR]      e.g. 200MB, 500MB or 1GB (one rate: ~5 minutes)
# FI_DIR (default .fi): a FlashInfer bundle for megamoe_sm90_mxfp4 where flashinfer is not installed (a trimmed
# package, flashinfer-megamoe.tgz, and an apache_tvm_ffi wheel); it is unpacked into FI_DIR/site and imported
# through a package stub (FI_DIR/stub/sitecustomize.py), as its __init__ needs packages the bundle leaves out.
# The fixture is kept in $WORK/bs between calls; the log and JSON go to $OUT (default ./gpu-out).
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RATES=${1:?usage: bench_stream.sh RATE[,RATE...] [FI_DIR]}
FI=${2:-.fi}
OUT=${OUT:-$PWD/gpu-out}; WORK=${WORK:-/tmp}
mkdir -p "$OUT"
. "$(dirname "$0")/fi_bundle.sh" "$FI" || exit
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; echo "cores $(nproc)";
  df -h "$WORK" | tail -1; python3 -c 'import sys, torch, huggingface_hub; print(sys.version.split()[0], "torch",
  torch.__version__, "huggingface_hub", huggingface_hub.__version__)'; python3 -c 'import flashinfer.megamoe' &&
  echo "flashinfer.megamoe imports"; git log --oneline -1 2>/dev/null; } 2>&1 | tee "$OUT/stream-${RATES//,/-}.log"
timeout -k 5 570 python3 scripts/bench/bench_stream.py --rate "$RATES" --conn-rate 100MB --layers 2 --experts 256 \
  --mtp 1 --work "$WORK/bs" --json "$OUT/stream-${RATES//,/-}.json" 2>&1 | tee -a "$OUT/stream-${RATES//,/-}.log"
