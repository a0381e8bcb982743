#!/bin/bash
# Device-side driver for docs/PERFORMANCE.md on a lent H200, one `run` call with carry [".fi-bundle"]
# (FlashInfer's megamoe package, see evidence/h200/H200_PROOF.md):  bash dev/h200_perf.sh [steps...]
# Steps (default: the first eight): gpu-tests decode convert-bf16 convert-bf16-shards convert-bf16-big
# convert-megamoe convert-megamoe-big memory; also convert-bf16-big-shards (12 layers, 2GB shards) convert-bf16-huge (24 layers, ~21 GB) convert-megamoe-huge (40 layers, ~11 GB) load-megamoe load-megamoe-big (64 experts);
# diagnostics: diag startup profile (py-spy, carry [".fi-bundle", ".carry-tools"]).
# Everything printed also goes to $OUT/log.txt.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
L=$OUT/log.txt
mkdir -p "$OUT"
S=/tmp/fisite
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv;
  echo "cores $(nproc)"; grep -m1 'model name' /proc/cpuinfo; free -g | head -2; df -h /tmp | tail -1;
  python3 -c 'import torch,sys,triton;print(sys.version.split()[0],"torch",torch.__version__,"cuda",torch.version.cuda,"triton",triton.__version__)';
  git log --oneline -1; } 2>&1 | tee "$L"
if [ -d .fi-bundle ]; then
  rm -rf $S && mkdir -p $S && tar xzf .fi-bundle/flashinfer-megamoe.tgz -C $S && rm -rf $S/tvm_ffi &&
  python3 -m pip install -q --no-index --no-deps --target $S .fi-bundle/apache_tvm_ffi-*.whl 2>&1 | tee -a "$L"
  export FI_SITE=$S PYTHONPATH=$PWD/.fi-bundle/stub:$S:$PWD
else
  export PYTHONPATH=$PWD
fi
r() { t=$1; shift; echo "== $* [timeout $t s] $(date -u +%T) loadavg $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$L"
      local s=$(date +%s.%N); timeout -k 5 "$t" "$@" 2>&1 | tee -a "$L"; local rc=$?
      echo "rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$s,1))") s" | tee -a "$L"; }
steps=${*:-gpu-tests decode convert-bf16 convert-bf16-shards convert-bf16-big convert-megamoe convert-megamoe-big memory}
for step in $steps; do
  case $step in
    gpu-tests) r 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/numerics/test_numerics_fp4.py tests/targets/test_gpu_convert.py ;;
    decode) r 200 python3 scripts/bench/bench_decode.py --device cuda --sweep ;;
    convert-bf16) r 120 python3 scripts/bench/bench_convert.py --target bf16 --device cuda ;;
    convert-bf16-big) r 200 python3 scripts/bench/bench_convert.py --target bf16 --device cuda --layers 12 ;;
    convert-bf16-huge) r 300 python3 scripts/bench/bench_convert.py --target bf16 --device cuda --layers 24 ;;
    convert-bf16-big-shards) r 200 python3 scripts/bench/bench_convert.py --target bf16 --device cuda --layers 12 --shard-size 2GB ;;
    convert-bf16-shards) r 150 python3 scripts/bench/bench_convert.py --target bf16 --device cuda --shard-size 1GB ;;
    convert-megamoe) r 120 python3 scripts/bench/bench_convert.py --target megamoe_sm90_mxfp4 --device cuda ;;
    convert-megamoe-big) r 200 python3 scripts/bench/bench_convert.py --target megamoe_sm90_mxfp4 --device cuda --layers 12 --shard-size 1GB ;;
    convert-megamoe-huge) r 400 python3 scripts/bench/bench_convert.py --target megamoe_sm90_mxfp4 --device cuda --layers 40 --shard-size 2GB ;;
    memory) r 150 python3 scripts/bench/bench_memory.py --device cuda ;;
    load-megamoe) r 120 python3 scripts/bench/bench_load.py --device cuda --target megamoe_sm90_mxfp4 ;;
    load-megamoe-big) r 200 python3 scripts/bench/bench_load.py --device cuda --target megamoe_sm90_mxfp4 --experts 64 ;;
    diag) r 120 python3 dev/diag_cuda_unit.py ;;
    startup) r 60 python3 -c 'import time; t=time.perf_counter(); import torch; a=time.perf_counter(); torch.zeros(1, device="cuda"); b=time.perf_counter(); import fimoe_convert.cli; c=time.perf_counter(); import flashinfer.megamoe; d=time.perf_counter(); print(f"import torch {a-t:.2f} s, CUDA context {b-a:.2f} s, import fimoe_convert.cli {c-b:.2f} s, import flashinfer.megamoe {d-c:.2f} s")' ;;
    profile)  # py-spy (carried in .carry-tools/) over one bf16 and one megamoe conversion, every thread
      python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .carry-tools/py_spy-*.whl
      python3 -c "from fimoe_convert.testing import make_checkpoint; make_checkpoint('/tmp/flash', 'flash-geometry', layers=4)"
      for t in bf16 megamoe_sm90_mxfp4; do rm -rf /tmp/fo
        r 120 /tmp/pyspy/bin/py-spy record --nonblocking -r 100 -t --idle -f raw -o "$OUT/prof-$t.txt" -- python3 -m fimoe_convert /tmp/flash /tmp/fo --target $t --device cuda --json
      done ;;
    *) echo "unknown step $step" | tee -a "$L" ;;
  esac
done
date -u | tee -a "$L"
