# Sourced by the GPU scripts: makes `flashinfer.megamoe` importable from a FlashInfer bundle in the folder $1 (a trimmed
# package, flashinfer-megamoe.tgz, and an apache_tvm_ffi wheel) where flashinfer is not installed; its __init__ needs
# packages the bundle leaves out, so the package is entered through a stub (FI/stub/sitecustomize.py).
FI=${1:-.fi}
if ! python3 -c 'import flashinfer.megamoe' 2>/dev/null && [ -f "$FI/flashinfer-megamoe.tgz" ]; then
  rm -rf "$FI/site" "$FI/stub" && mkdir -p "$FI/site" "$FI/stub"
  tar xzf "$FI/flashinfer-megamoe.tgz" -C "$FI/site" && rm -rf "$FI/site/tvm_ffi"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$FI/site" "$FI"/apache_tvm_ffi-*.whl || return 1
  # the version check reads installed distributions' names: the bundle is flashinfer-python 0.7.4's package
  mkdir -p "$FI/site/flashinfer_python-0.7.4.dist-info"
  printf 'Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.7.4\n' > "$FI/site/flashinfer_python-0.7.4.dist-info/METADATA"
  cat > "$FI/stub/sitecustomize.py" <<'EOF'
import importlib.machinery, os, sys, types
_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "site", "flashinfer")
_pkg = types.ModuleType("flashinfer")
_pkg.__path__ = [_dir]
_pkg.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None, is_package=True)
_pkg.__spec__.submodule_search_locations = [_dir]
sys.modules["flashinfer"] = _pkg
EOF
  export PYTHONPATH=$PWD/$FI/stub:$PWD/$FI/site${PYTHONPATH:+:$PYTHONPATH}
fi
