#!/bin/bash
# Device-side driver for evidence/h200/H200_MOE_EP.md (run through the `device` tool, two back-to-back calls):
#   call 1: carry [".carry1"] (cu13.tar.xz, the cutlass-DSL cu13 libs, xz)    -> bash dev/h200_moe_ep.sh stage1
#   call 2: carry [".carry2"] (flashinfer tree + cutlass-DSL/tvm-ffi wheels)  -> bash dev/h200_moe_ep.sh stage2
# Stage 1 unpacks into /tmp/S, which stays on the machine while it is warm; stage 2 adds the rest, then
# runs the moe_ep checks, one moe_ep SM90 kernel on converted weights and bench_load
# (`stage2 load`: bench_load only; `stage2 checks`: the checks only; `stage2 bench`: bench_convert at V4-Flash
# expert geometry only).
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=/tmp/S
OUT=${OUT:-/tmp/out}
L=$OUT/log.txt
mkdir -p "$OUT"
if [ "$1" = stage1 ]; then
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; df -h /tmp | tail -1;
    du -b .carry1/cu13.tar.xz; } 2>&1 | tee "$L"
  rm -rf $S /tmp/S.ok && mkdir -p $S && t0=$(date +%s) && tar xJf .carry1/cu13.tar.xz -C $S && touch /tmp/S.ok
  echo "stage1 unpack ok=$([ -f /tmp/S.ok ] && echo yes || echo no) in $(( $(date +%s) - t0 )) s; $(du -sb $S | cut -f1) bytes in $S" | tee -a "$L"
  exit 0
fi
[ -f /tmp/S.ok ] || { echo "stage1 output missing: the machine was not the same one (not warm)" | tee -a "$L"; exit 9; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; echo "cores $(nproc)";
  python3 -c 'import torch,sys;print(sys.version.split()[0],"torch",torch.__version__,"cuda",torch.version.cuda)';
  python3 -m pip list 2>/dev/null | grep -i -E '^(cuda-|nvidia-nvshmem|nvshmem|protobuf|typing.ext)'; } 2>&1 | tee "$L"
t0=$(date +%s)
tar xJf .carry2/fi-moe-ep.tar.xz -C $S && tar xJf .carry2/fi-distinfo.tar.xz -C $S && { [ ! -f .carry2/fi-data.tar.xz ] || tar xJf .carry2/fi-data.tar.xz -C $S; } && rm -rf $S/tvm_ffi &&
python3 -c "import sys,zipfile,glob; [zipfile.ZipFile(w).extractall('$S') for w in glob.glob('.carry2/nvidia_cutlass_dsl*.whl')]" &&
python3 -m pip install -q --no-index --no-deps --no-compile --target $S .carry2/apache_tvm_ffi-*.whl 2>&1 | tee -a "$L"
echo "stage2 unpack in $(( $(date +%s) - t0 )) s; $(du -sb $S | cut -f1) bytes in $S" | tee -a "$L"
export FI_SITE=$S PYTHONPATH=$PWD/.carry2/stub:$S:$S/nvidia_cutlass_dsl/dsl_packages:$PWD
python3 -c 'import cutlass, flashinfer, flashinfer.moe_ep as me, fimoe_convert; print("imports ok: cutlass", cutlass.__file__, "| flashinfer", flashinfer.__path__[0], "| fimoe_convert", fimoe_convert.__file__)' 2>&1 | tee -a "$L"
r() { t=$1; shift; echo "== $* [timeout $t s] $(date -u +%T)" | tee -a "$L"; local s=$(date +%s.%N)
      timeout -k 5 "$t" "$@" 2>&1 | tee -a "$L"; local rc=$?
      echo "rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$s,1))") s" | tee -a "$L"; }
rm -rf /tmp/k /tmp/o_*
python3 -c "from fimoe_convert.testing import make_checkpoint; make_checkpoint('/tmp/k', 'tiny', layers=2, hash_layers=1, mtp=1, extreme_scales=False)"
python3 -c 'import torch; from fimoe_convert.options import resolve_device; print("convert device auto ->", resolve_device("auto"), torch.cuda.get_device_name())' | tee -a "$L"
[ "$2" = load ] && { r 120 python3 scripts/bench/bench_load.py --device cuda --target sm90_fp8_fp8_bf16_pull_cutedsl; exit 0; }
# `stage2 bench`: the FP8 moe_ep target at V4-Flash expert geometry (issue 19, goal 3), one JSON line per run
[ "$2" = bench ] && { r 400 python3 scripts/bench/bench_convert.py --device cuda --floors direct --json $OUT/bench.jsonl \
  --work /tmp/fb --target sm90_fp8_fp8_bf16_pull_cutedsl --experts 256 --layers 3 --shard-size 2GB --max-memory 24GiB; exit 0; }
r 120 python3 tests/helpers/moe_ep_roundtrip.py sm90_fp8_fp8_bf16_pull_cutedsl /tmp/k /tmp/o_fp8 fp8_scale_mode=blockwise
[ "$2" = nvfp4 ] && r 150 python3 tests/helpers/moe_ep_roundtrip.py --arch 10.0 sm100_nvfp4_nvfp4_bf16_cutedsl /tmp/k /tmp/o_nv
[ "$2" = checks ] && exit 0
r 240 env MEGA_NO_DIST=1 python3 dev/run_moe_ep_sm90_h200.py --json $OUT/moe_ep.json
r 120 python3 scripts/bench/bench_load.py --device cuda --target sm90_fp8_fp8_bf16_pull_cutedsl
# Last: the MXFP4 check, whose FlashInfer preprocess JIT-builds the whole CUTLASS fused_moe_90 module.
B=/root/.cache/flashinfer/0.7.4/90a/cached_ops/fused_moe_90
r ${MXFP4_TIMEOUT:-240} env MAX_JOBS=16 python3 tests/helpers/moe_ep_roundtrip.py sm90_fp8_mxfp4_bf16_pull_cutedsl /tmp/k /tmp/o_mx
echo "fused_moe_90: $(find $B -name '*.o' 2>/dev/null | wc -l) objects built of $(grep -c '^build .*\.o:' $B/build.ninja 2>/dev/null) compile steps in build.ninja; $(ls $B/*.so 2>/dev/null | wc -l) .so" | tee -a "$L"
date -u | tee -a "$L"
