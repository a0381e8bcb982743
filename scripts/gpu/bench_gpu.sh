#!/bin/bash
# The GPU benchmarks and checks of docs/PERFORMANCE.md and docs/GPU_CHECKS.md, on one CUDA GPU, from the repo root:
#   bash scripts/gpu/bench_gpu.sh [STEP...]       (fimoe-convert installed; flashinfer-python >= 0.7.4 for megamoe)
# Default steps: gpu-tests decode convert-bf16 convert-bf16-shards convert-bf16-big convert-megamoe
#   convert-megamoe-big memory.
# Also: convert-bf16-big-shards (12 layers, 2GB shards) convert-bf16-huge (24 layers, ~21 GB)
#   convert-megamoe-huge (40 layers, ~11 GB) load-megamoe load-megamoe-big (64 experts);
#   at V4 expert geometry (one JSON line each in $OUT/bench.jsonl): flash-bf16 flash-fp8 flash-megamoe (256 experts,
#   >= 20 GB out), small-bf16 small-fp8 small-megamoe (~6 GB out), pro-megamoe pro-fp8 (one V4-Pro layer, 384 experts),
#   flash-moe-ep-fp8 (needs nvidia-cutlass-dsl);
#   proofs on SM90: prove-megamoe, prove-moe-ep (MEGA_NO_DIST=1), moe-ep-roundtrip (bit-identical to FlashInfer);
#   diagnostics: diag startup.
# Everything printed also goes to $OUT/log.txt (OUT defaults to ./gpu-out). Work folders go under $WORK (/tmp).
set -o pipefail
# Multicast over NVLink stays off: single-GPU runs do not need it.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu-out}; WORK=${WORK:-/tmp}
L=$OUT/log.txt; J=$OUT/bench.jsonl
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv;
  echo "cores $(nproc)"; grep -m1 'model name' /proc/cpuinfo; free -g | head -2; df -h "$WORK" | tail -1;
  python3 -c 'import torch,sys,triton;print(sys.version.split()[0],"torch",torch.__version__,"cuda",torch.version.cuda,"triton",triton.__version__)';
  git log --oneline -1 2>/dev/null; } 2>&1 | tee "$L"
r() { t=$1; shift; echo "== $* [timeout $t s] $(date -u +%T) loadavg $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$L"
      local s=$(date +%s.%N); timeout -k 5 "$t" "$@" 2>&1 | tee -a "$L"; local rc=$?
      echo "rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$s,1))") s" | tee -a "$L"; }
C="python3 scripts/bench/bench_convert.py --device cuda"
G="$C --floors direct --json $J --work $WORK/fb"
tiny() { python3 -c "from fimoe_convert.testing import make_checkpoint; make_checkpoint('$WORK/k', 'tiny', layers=2, hash_layers=1, mtp=1, extreme_scales=False)"; }
steps=${*:-gpu-tests decode convert-bf16 convert-bf16-shards convert-bf16-big convert-megamoe convert-megamoe-big memory}
for step in $steps; do
  case $step in
    gpu-tests) r 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/numerics/test_numerics_fp4.py tests/targets/test_gpu_convert.py ;;
    decode) r 200 python3 scripts/bench/bench_decode.py --device cuda --sweep ;;
    convert-bf16) r 120 $C --target bf16 ;;
    convert-bf16-big) r 200 $C --target bf16 --layers 12 ;;
    convert-bf16-huge) r 300 $C --target bf16 --layers 24 ;;
    convert-bf16-big-shards) r 200 $C --target bf16 --layers 12 --shard-size 2GB ;;
    convert-bf16-shards) r 150 $C --target bf16 --shard-size 1GB ;;
    convert-megamoe) r 120 $C --target megamoe_sm90_mxfp4 ;;
    convert-megamoe-big) r 200 $C --target megamoe_sm90_mxfp4 --layers 12 --shard-size 1GB ;;
    convert-megamoe-huge) r 400 $C --target megamoe_sm90_mxfp4 --layers 40 --shard-size 2GB ;;
    memory) r 150 python3 scripts/bench/bench_memory.py --device cuda ;;
    load-megamoe) r 120 python3 scripts/bench/bench_load.py --device cuda --target megamoe_sm90_mxfp4 ;;
    load-megamoe-big) r 200 python3 scripts/bench/bench_load.py --device cuda --target megamoe_sm90_mxfp4 --experts 64 ;;
    flash-bf16) r 200 $G --target bf16 --experts 256 --layers 2 ;;
    flash-fp8) r 200 $G --target fp8_block --experts 256 --layers 3 ;;
    flash-megamoe) r 260 $G --target megamoe_sm90_mxfp4 --experts 256 --layers 6 --shard-size 2GB ;;
    small-bf16) r 100 $G --target bf16 --layers 7 ;;
    small-fp8) r 100 $G --target fp8_block --layers 12 ;;
    small-megamoe) r 120 $G --target megamoe_sm90_mxfp4 --layers 24 --shard-size 2GB ;;
    pro-megamoe) r 200 $G --target megamoe_sm90_mxfp4 --preset pro-geometry --experts 384 --layers 1 --mtp 0 --shard-size 2GB ;;
    pro-fp8) r 220 $G --target fp8_block --preset pro-geometry --experts 384 --layers 1 --mtp 0 ;;
    flash-moe-ep-fp8) r 400 $G --target sm90_fp8_fp8_bf16_pull_cutedsl --experts 256 --layers 3 --shard-size 2GB --max-memory 24GiB ;;
    prove-megamoe) r 330 python3 scripts/gpu/prove_megamoe_sm90.py --json "$OUT/prove.json" ;;
    prove-moe-ep) r 240 env MEGA_NO_DIST=1 python3 scripts/gpu/prove_moe_ep_sm90.py --json "$OUT/moe_ep.json" ;;
    moe-ep-roundtrip) tiny && r 120 python3 tests/helpers/moe_ep_roundtrip.py sm90_fp8_fp8_bf16_pull_cutedsl "$WORK/k" "$WORK/o_fp8" fp8_scale_mode=blockwise ;;
    diag) r 120 python3 scripts/gpu/diag_cuda_unit.py ;;
    startup) r 60 python3 -c 'import time; t=time.perf_counter(); import torch; a=time.perf_counter(); torch.zeros(1, device="cuda"); b=time.perf_counter(); import fimoe_convert.cli; c=time.perf_counter(); import flashinfer.megamoe; d=time.perf_counter(); print(f"import torch {a-t:.2f} s, CUDA context {b-a:.2f} s, import fimoe_convert.cli {c-b:.2f} s, import flashinfer.megamoe {d-c:.2f} s")' ;;
    *) echo "unknown step $step" | tee -a "$L" ;;
  esac
done
date -u | tee -a "$L"
