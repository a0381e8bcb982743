#!/bin/bash
# Build the git-ignored folder that one `run` call carries to the lent H200 for issue 20
# (dev/h200_deepgemm.sh runs there). The `run` tool sends the checkout the session started in
# (/work/main), not a helper's worktree, so the folder goes there, ignored through .git/info/exclude,
# and holds this worktree's fimoe_convert and scripts as well.
#   cand/V.tar.xz   each sgl-deep-gemm wheel of WHEELS/V/ unpacked, without deep_gemm/include (headers
#                   only the JIT needs), xz
#   full/V.whl      the whole wheel, for the releases predicted to load (their JIT needs the headers)
#   tvm/            apache-tvm-ffi 0.1.11 (pinned by sgl-deep-gemm <= 0.2.2) and 0.1.15.post2 (cp312)
#   fi-moe-ep.tar.xz, fi-distinfo.tar.xz   flashinfer 0.7.4's trimmed Python tree and its dist-info
#                   (dev/pack_flashinfer.sh); stub/sitecustomize.py (dev/flashinfer_stub/)
#   wt.tar.xz       this worktree's fimoe_convert; dev/ these scripts; versions.txt newest first
# usage: dev/build_deepgemm_carry.sh [DEST] [WHEELS]   (defaults /work/main/.dgcarry, /work/dg-wheels;
#   WHEELS/V/*.whl from `pip download sgl-deep-gemm==V`, WHEELS/tvm/*.whl, WHEELS/versions.txt;
#   the python3 here must have flashinfer-python 0.7.4)
set -euo pipefail
dest=${1:-/work/main/.dgcarry}
whl=${2:-/work/dg-wheels}
full="0.1.5.post1 0.1.5 0.1.4.post1"
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(git -C "$(dirname "$dest")" rev-parse --show-toplevel)
excl="$(git -C "$root" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
rel="/${dest#"$root"/}/"
grep -qxF "$rel" "$excl" 2>/dev/null || echo "$rel" >> "$excl"
rm -rf "$dest"; mkdir -p "$dest"/{cand,full,tvm,stub,dev}
cp "$whl"/versions.txt "$dest"/
for v in $(cat "$whl"/versions.txt); do
  w=$(ls "$whl/$v"/*.whl)
  if [[ " $full " == *" $v "* ]]; then cp "$w" "$dest/full/$v.whl"; continue; fi
  t=$(mktemp -d); python3 -m zipfile -e "$w" "$t"; rm -rf "$t/deep_gemm/include"
  tar cf - -C "$t" . | xz -6 -T2 > "$dest/cand/$v.tar.xz"; rm -rf "$t"
done
cp "$whl"/tvm/apache_tvm_ffi-0.1.11-*.whl "$whl"/tvm/apache_tvm_ffi-0.1.15.post2-*.whl "$dest/tvm/"
source "$here/dev/pack_flashinfer.sh"
pack_flashinfer "$dest"
cp "$here/dev/flashinfer_stub/sitecustomize.py" "$dest/stub/"
cp "$here"/dev/{h200_deepgemm.sh,dg_probe.py,deepgemm_check.py} "$dest/dev/"
(cd "$here" && tar cf - --exclude=__pycache__ fimoe_convert) | xz -6 -T2 > "$dest/wt.tar.xz"
du -b "$dest"/* "$dest"/*/* | sort -k2
du -sb "$dest"
