# With FI_SITE set, `flashinfer` is a bare package over $FI_SITE/flashinfer: its __init__.py (which imports
# the cutlass DSL, not carried to the lent H200) never runs; `import flashinfer.moe_ep` loads the subpackage.
import importlib.machinery
import os
import sys
import types

_site = os.environ.get("FI_SITE")
if _site and "flashinfer" not in sys.modules:
    _path = os.path.join(_site, "flashinfer")
    _pkg = types.ModuleType("flashinfer")
    _pkg.__path__ = [_path]
    _pkg.__file__ = os.path.join(_path, "__init__.py")
    _pkg.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None, is_package=True)
    _pkg.__spec__.submodule_search_locations = [_path]
    sys.modules["flashinfer"] = _pkg
