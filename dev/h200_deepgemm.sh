#!/bin/bash
# Issue 20 on the lent H200, in one `run` call that carries the folder built by
# dev/build_deepgemm_carry.sh (default name .dgcarry):
#   run(command="bash .dgcarry/dev/h200_deepgemm.sh", carry=[".dgcarry"])
# 1. every sgl-deep-gemm release in its own folder and process: `import deep_gemm` (version, the three
#    transform functions, or the exact error);
# 2. with the newest that loads and has them: dev/deepgemm_check.py (FlashInfer's deepgemm
#    preprocess on CUDA; `python3 -m fimoe_convert ... --target sm100_fp8_fp4_bf16_deepgemm --device cuda`;
#    our stored output against FlashInfer's load-time path, bit for bit).
# The log goes to $OUT/log.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C=${DG_CARRY:-$PWD/.dgcarry}
W=/tmp/dg
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

main() {
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  echo "cores $(nproc)"
  python3 -c 'import torch,sys;print(sys.version.split()[0],"torch",torch.__version__,"cuda",torch.version.cuda,"cc",torch.cuda.get_device_capability())'
  echo "nvcc: $(command -v nvcc) $(nvcc --version 2>/dev/null | tail -1); CUDA_HOME=${CUDA_HOME:-unset}; $(ls -d /usr/local/cuda* 2>/dev/null | tr '\n' ' ')"
  python3 -m pip list 2>/dev/null | grep -iE '^(nvidia-cuda-nvrtc|nvidia-cublas|nvidia-cuda-runtime|apache-tvm|deep)' | tr -s ' ' | tr '\n' ';'; echo
  rm -rf $W; mkdir -p $W/c $W/wt $W/fi
  local t0=$(date +%s)
  tar xJf $C/wt.tar.xz -C $W/wt && tar xJf $C/fi-moe-ep.tar.xz -C $W/fi && tar xJf $C/fi-distinfo.tar.xz -C $W/fi || return 1
  for tv in 0.1.11 0.1.15.post2; do
    python3 -m pip install -q --no-index --no-deps --no-compile --target $W/tvm-$tv $C/tvm/apache_tvm_ffi-$tv-*.whl || echo "tvm-ffi $tv: install failed"
  done
  for V in $(cat $C/versions.txt); do
    mkdir -p $W/c/$V
    if [ -f $C/full/$V.whl ]; then python3 -m zipfile -e $C/full/$V.whl $W/c/$V; else tar xJf $C/cand/$V.tar.xz -C $W/c/$V; fi
  done
  echo "unpacked in $(( $(date +%s) - t0 )) s"
  # CUDA libraries deep_gemm's _C.so needs (readelf: libcudart/libnvrtc/libcublas(Lt).so.13), for a retry
  NVLIBS=$(python3 -c "import glob,site;print(':'.join(sorted({p.rsplit('/',1)[0] for s in site.getsitepackages() for p in glob.glob(s+'/nvidia/**/lib*.so.13*',recursive=True)})))")
  NVLIBS=$NVLIBS:/usr/local/cuda/lib64

  echo "== 1. import deep_gemm, one process per release (tvm-ffi 0.1.11 beside it, as sgl-deep-gemm <= 0.2.2 pins)"
  probe() {  # every line the probe prints, ld.so's 'symbol lookup error' too; a retry if a library is not found
    local V=$1
    PYTHONPATH=$W/c/$V:$W/tvm-0.1.11 timeout 90 python3 -X faulthandler $C/dev/dg_probe.py $V > $W/probe.$V 2>&1; echo "rc $?" >> $W/probe.$V
    if grep -q "cannot open shared object" $W/probe.$V; then
      mv $W/probe.$V $W/probe1.$V
      PYTHONPATH=$W/c/$V:$W/tvm-0.1.11 LD_LIBRARY_PATH=$NVLIBS:${LD_LIBRARY_PATH:-} timeout 90 python3 -X faulthandler $C/dev/dg_probe.py $V > $W/probe.$V 2>&1
      echo "rc $? (retried with LD_LIBRARY_PATH=$NVLIBS; first: $(grep ^CAND $W/probe1.$V))" >> $W/probe.$V
    fi
  }
  for V in $(cat $C/versions.txt); do probe $V & done
  wait
  for V in $(cat $C/versions.txt); do
    grep -E "^(CAND|CALL) |symbol lookup error|^rc " $W/probe.$V | grep -q "^CAND" || echo "CAND $V | LOAD FAIL | - | the probe printed no CAND line"
    grep -E "^(CAND|CALL) |symbol lookup error|^rc " $W/probe.$V | sed "s/^rc /     $V probe rc /; s/^[^CR ].*symbol lookup/     $V &/"
    grep -A4 "^Fatal Python error" $W/probe.$V | grep -E "Fatal Python|File " | head -3 | sed "s/^ */     $V faulthandler: /"
  done | tee $OUT/candidates.txt
  # usable: loads, has the three functions, and calling into its _C returned (an error is fine) without killing the process
  PICK=$(for V in $(cat $C/versions.txt); do grep -q '| LOAD ok | Y,Y,Y |' $W/probe.$V && grep -q "^CALL " $W/probe.$V && echo $V; done | head -1)
  echo "newest release that loads, has the three functions and whose _C answers a call: ${PICK:-none}"
  export FI_SITE=$W/fi
  TVM=$W/tvm-0.1.11
  PP="$W/wt:$C/stub:$W/fi"
  if ! PYTHONPATH=$PP:$TVM python3 -c 'import flashinfer.moe_ep' 2>$W/fi.err; then
    echo "flashinfer.moe_ep with tvm-ffi 0.1.11: $(tail -1 $W/fi.err); using 0.1.15.post2"; TVM=$W/tvm-0.1.15.post2
  fi
  (cd /tmp && PYTHONPATH=$PP:$TVM python3 -c 'import flashinfer.moe_ep, tvm_ffi, fimoe_convert, importlib.metadata as m; print("imports ok: flashinfer.moe_ep", flashinfer.moe_ep.__file__, "| flashinfer-python", m.version("flashinfer-python"), "| tvm_ffi", tvm_ffi.__file__, "| fimoe_convert", fimoe_convert.__file__)')
  [ -n "$PICK" ] || echo "no candidate is usable: the conversion below shows the error our code gives (deep_gemm from 0.1.5.post1)"
  check() {  # deepgemm_check.py with deep_gemm from release $1
    local V=$1
    if [ ! -d $W/c/$V/deep_gemm/include ]; then  # not carried (64 MiB per call): DeepGEMM's JIT headers of 0.1.5.post1
      ln -s $W/c/0.1.5.post1/deep_gemm/include $W/c/$V/deep_gemm/include
      echo "(deep_gemm/include of $V not carried: using 0.1.5.post1's JIT headers)"
    fi
    echo "== 2. deepgemm_check.py with deep_gemm $V [timeout 150 s] $(date -u +%T)"
    rm -rf $W/run; mkdir -p $W/run
    local lp=${LD_LIBRARY_PATH:-}
    [ -f $W/probe1.$V ] && { lp=$NVLIBS:$lp; echo "(with LD_LIBRARY_PATH=$lp, as its probe needed)"; }
    LD_LIBRARY_PATH=$lp PYTHONPATH=$W/wt:$C/stub:$W/fi:$W/c/$V:$TVM timeout -k 5 150 python3 $C/dev/deepgemm_check.py $W/run
    local rc=$?; echo "deepgemm_check with $V rc=$rc"; return $rc
  }
  check ${PICK:-0.1.5.post1} || { [ "${PICK:-0.1.5.post1}" != 0.1.5.post1 ] && check 0.1.5.post1; }
  [ -f $W/run/o_bypass/fimoe-manifest.json ] && cp $W/run/o_bypass/fimoe-manifest.json $OUT/manifest_bypass.json
  [ -f $W/run/o_plain/fimoe-manifest.json ] && cp $W/run/o_plain/fimoe-manifest.json $OUT/manifest_plain.json
  ls ~/.deep_gemm 2>/dev/null | head -5
  date -u
}
main 2>&1 | tee $OUT/log
