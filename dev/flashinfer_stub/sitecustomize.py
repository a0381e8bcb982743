"""On the lent H200: import flashinfer.megamoe from the trimmed bundle in $FI_SITE (shared/tools/fi-carry-bundle.sh)
without running flashinfer/__init__.py, which imports the cutlass DSL that the bundle leaves out. Put this folder
first on PYTHONPATH; Python imports sitecustomize at start-up."""

import importlib.machinery
import os
import sys
import types

site = os.environ.get("FI_SITE")
if site and os.path.isdir(os.path.join(site, "flashinfer")):
    pkg_dir = os.path.join(site, "flashinfer")
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = [pkg_dir]
    pkg.__file__ = os.path.join(pkg_dir, "__init__.py")
    spec = importlib.machinery.ModuleSpec("flashinfer", None, is_package=True)
    spec.submodule_search_locations = [pkg_dir]
    pkg.__spec__ = spec  # find_spec("flashinfer") answers instead of raising
    sys.modules["flashinfer"] = pkg
