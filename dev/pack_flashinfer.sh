# Sourced by dev/build_moe_ep_carry.sh and dev/build_deepgemm_carry.sh (one trim for both carries):
#   pack_flashinfer DEST   writes DEST/fi-moe-ep.tar.xz, flashinfer 0.7.4's Python tree without data/, the
#                          cake_*_backend CUDA-source folders and all of experimental/ but the two megamoe_ep16
#                          packages (what moe_ep and megamoe import fits the 64 MiB carry), and
#                          DEST/fi-distinfo.tar.xz, its dist-info. The python3 here must have flashinfer-python 0.7.4.
flashinfer_site() {
  python3 -c 'import flashinfer, os; print(os.path.dirname(os.path.dirname(flashinfer.__file__)))'
}

pack_flashinfer() {
  local dest=$1 site t
  site=$(flashinfer_site)
  t=$(mktemp -d)
  (cd "$site" && tar cf - --exclude=__pycache__ --exclude=flashinfer/data --exclude=flashinfer/experimental \
     --exclude='flashinfer/cake_*_backend' flashinfer) | tar xf - -C "$t"
  mkdir -p "$t/flashinfer/experimental"
  (cd "$site/flashinfer/experimental" &&
     cp -r __init__.py cake_w8a8_megamoe_ep16 cake_mxfp8_megamoe_ep16 "$t/flashinfer/experimental/")
  find "$t" -name __pycache__ -prune -exec rm -rf {} +
  tar cf - -C "$t" flashinfer | xz -6 -T2 > "$dest/fi-moe-ep.tar.xz"; rm -rf "$t"
  (cd "$site" && tar cJf - flashinfer_python-0.7.4.dist-info) > "$dest/fi-distinfo.tar.xz"
}
