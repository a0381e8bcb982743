#!/bin/bash
# Build the two git-ignored carry folders that get flashinfer.moe_ep and the cutlass DSL onto the lent
# H200 within its 64 MiB-per-call limit (evidence/h200/H200_MOE_EP.md):
#   .carry1/cu13.tar.xz    nvidia-cutlass-dsl-libs-cu13 4.8.1 cp312 unpacked and re-packed with xz -9
#                          (the wheel is 92 MB; its two .so files are 237 MB raw, 63.6 MB as .tar.xz)
#   .carry2/               flashinfer 0.7.4 python tree without data/, the cake_*_backend CUDA-source
#                          folders and all of experimental/ but the two megamoe_ep16 packages (xz);
#                          the data/ headers and csrc the fused_moe_90 JIT build reads (xz); flashinfer's
#                          dist-info; the cutlass-dsl, -libs-base, -libs-core and apache-tvm-ffi cp312 wheels;
#                          the package stub (sitecustomize.py).
# usage: dev/build_moe_ep_carry.sh [WHEEL_DIR]  (run in the repo root; WHEEL_DIR holds the four
#   nvidia_cutlass_dsl*-4.8.1 cp312 wheels, default /tmp/cutl; the python3 here must have
#   flashinfer-python 0.7.4 installed; .fi-bundle/ from ../shared/tools/fi-carry-bundle.sh supplies the
#   tvm-ffi wheel; the stub is dev/flashinfer_stub/sitecustomize.py)
set -euo pipefail
whl=${1:-/tmp/cutl}
source "$(dirname "$0")/pack_flashinfer.sh"
site=$(flashinfer_site)
mkdir -p .carry1 .carry2/stub
if [ ! -s .carry1/cu13.tar.xz ]; then
  t=$(mktemp -d); python3 -m zipfile -e "$whl"/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-*.whl "$t"
  tar cf - -C "$t" . | xz -9 -T2 > .carry1/cu13.tar.xz; rm -rf "$t"
fi
cp "$whl"/nvidia_cutlass_dsl-4.8.1-py3-none-any.whl "$whl"/nvidia_cutlass_dsl_libs_base-4.8.1-cp312-*.whl \
   "$whl"/nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl .fi-bundle/apache_tvm_ffi-*.whl .carry2/
cp dev/flashinfer_stub/sitecustomize.py .carry2/stub/
pack_flashinfer .carry2
(cd "$site" && tar cf - --exclude=__pycache__ flashinfer/data/include flashinfer/data/cutlass flashinfer/data/cccl \
   flashinfer/data/spdlog flashinfer/data/csrc/nv_internal flashinfer/data/csrc/fused_moe/cutlass_backend \
   flashinfer/data/csrc/*.h flashinfer/data/csrc/*.cuh) | xz -6 -T2 > .carry2/fi-data.tar.xz
du -b .carry1/* .carry2/* .carry2/stub/*
du -sb .carry1 .carry2
