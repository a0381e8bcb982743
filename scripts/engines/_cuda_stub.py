"""Stub modules for CUDA-only extensions: importing works, calling any attribute raises and is recorded."""
import importlib.abc
import importlib.machinery
import sys
import types

CALLED = []
class _Stub(types.ModuleType):
    __path__ = []
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        qual = f"{self.__name__}.{attr}"
        def kernel(*a, **k):
            CALLED.append(qual)
            raise RuntimeError(f"CUDA-only {qual} called")
        kernel.__name__ = attr
        return kernel
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names, absent=()): self.names, self.absent = tuple(names), tuple(absent)
    def find_spec(self, name, path, target=None):
        if name in self.absent:  # left to the other finders: ImportError where the package is not installed
            return None
        if any(name == n or name.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec): return _Stub(spec.name)
    def exec_module(self, module): pass
def install(names, absent=()): sys.meta_path.insert(0, _Finder(names, absent))
ACCESSED = []
def stub_op_namespace(ns):
    """torch.ops namespace: ops the missing extension would register become stubs (names kept in ACCESSED)."""
    base = type(ns)
    class _Ns(base):
        def __getattr__(self, op):
            try:
                return base.__getattr__(self, op)
            except AttributeError:
                if op.startswith("__"):
                    raise
                ACCESSED.append(f"{self.name}.{op}")
                return _Stub(f"torch.ops.{self.name}").__getattr__(op)
    ns.__class__ = _Ns
