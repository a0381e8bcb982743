#!/bin/bash
# Device-side driver for issue 19 on a lent H200 (one `run` call, carry [".fi-bundle"], the bundle built here by
# ../shared/tools/fi-carry-bundle.sh .fi-bundle):   bash dev/h200_issue19.sh STEP...
# Steps: gpu-tests; flash-bf16 flash-fp8 flash-megamoe (V4-Flash expert geometry, 256 experts a layer, >= 20 GB out);
# small-bf16 small-fp8 small-megamoe (~6 GB out); pro-megamoe pro-fp8 (one V4-Pro layer, 384 experts).
# Every benchmark appends a JSON line to $OUT/bench.jsonl; everything printed goes to $OUT/log.txt.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; L=$OUT/log.txt; J=$OUT/bench.jsonl; S=/tmp/fisite
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; echo "cores $(nproc)";
  free -g | sed -n 2p; df -h /tmp | tail -1; git log --oneline -1 2>/dev/null;
  python3 -c 'import torch,sys,triton;print(sys.version.split()[0],"torch",torch.__version__,"triton",triton.__version__)'; } 2>&1 | tee "$L"
rm -rf $S && mkdir -p $S && tar xzf .fi-bundle/flashinfer-megamoe.tgz -C $S && rm -rf $S/tvm_ffi &&
  python3 -m pip install -q --no-index --no-deps --target $S .fi-bundle/apache_tvm_ffi-*.whl 2>&1 | tee -a "$L"
# the bundle has no dist-info: give importlib.metadata the version the package is (the targets check it)
mkdir -p $S/flashinfer_python-0.7.4.dist-info && printf 'Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.7.4\n' > $S/flashinfer_python-0.7.4.dist-info/METADATA
export FI_SITE=$S PYTHONPATH=$PWD/dev/flashinfer_stub:$S:$PWD
r() { t=$1; shift; echo "== $* [timeout $t s] $(date -u +%T)" | tee -a "$L"; local s=$(date +%s.%N)
      timeout -k 5 "$t" "$@" 2>&1 | tee -a "$L"; echo "rc=$? wall $(python3 -c "print(round($(date +%s.%N)-$s,1))") s" | tee -a "$L"; }
B="python3 scripts/bench/bench_convert.py --device cuda --floors direct --json $J --work /tmp/fb"
for step in "$@"; do
  case $step in
    gpu-tests) r 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/numerics/test_numerics_fp4.py tests/targets/test_gpu_convert.py ;;
    flash-bf16) r 200 $B --target bf16 --experts 256 --layers 2 ;;
    flash-fp8) r 200 $B --target fp8_block --experts 256 --layers 3 ;;
    flash-megamoe) r 260 $B --target megamoe_sm90_mxfp4 --experts 256 --layers 6 --shard-size 2GB ;;
    small-bf16) r 100 $B --target bf16 --layers 7 ;;
    small-fp8) r 100 $B --target fp8_block --layers 12 ;;
    small-megamoe) r 120 $B --target megamoe_sm90_mxfp4 --layers 24 --shard-size 2GB ;;
    pro-megamoe) r 200 $B --target megamoe_sm90_mxfp4 --preset pro-geometry --experts 384 --layers 1 --mtp 0 --shard-size 2GB ;;
    pro-fp8) r 220 $B --target fp8_block --preset pro-geometry --experts 384 --layers 1 --mtp 0 ;;
    *) echo "unknown step $step" | tee -a "$L" ;;
  esac
done
date -u | tee -a "$L"
