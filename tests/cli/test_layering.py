"""The layout written in fimoe_convert/__init__.py holds: imports follow LAYERS, only `files/` and `testing`
touch files, heavy libraries load lazily, and the light commands import neither torch nor FlashInfer."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fimoe_convert

PKG = Path(fimoe_convert.__file__).parent
LAZY = {"flashinfer", "triton", "deep_gemm", "huggingface_hub", "click"}
FILE_MODULES = {"files", "testing"}
# Calls that touch the file system: Path methods on any object, the others on `os`, `os.path` or `shutil`
# (`str.replace` is no file access). `resolve`, `expanduser` and `os.environ` only compute names or read the
# environment.
PATH_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob", "rglob", "unlink",
              "mkdir", "rmdir", "stat", "lstat", "is_file", "is_dir", "exists", "is_symlink", "touch", "readlink"}
OS_CALLS = {"open", "replace", "rename", "remove", "listdir", "scandir", "makedirs", "access", "fsync", "getsize",
            "isfile", "isdir", "exists", "rmtree", "copyfile", "copytree", "disk_usage", "stat", "unlink", "preadv"}
# (module file, call): file access outside FILE_MODULES, and why it is allowed.
EXEMPT = {("targets/rules.py", "exists"): "probes GPU device nodes (/dev/nvidiactl) so that `targets` need not "
                                          "import torch; reads no file",
          ("versions.py", "scandir"): "lists sys.path folders for `*.dist-info` names, a version without importing "
                                      "importlib.metadata (0.1 s of every start-up); reads no file"}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        top = rel.parts[0].removesuffix(".py")
        if top == "__init__":
            continue
        yield top, path


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PKG).parts) - 1
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("fimoe_convert."):
                    yield node.module.split(".")[1], node
                elif node.module:
                    yield "ext:" + node.module.split(".")[0], node
                continue
            if node.level > depth:  # climbs out of a sub-package to the package root
                parts = (node.module or "").split(".")
                names = [parts[0]] if node.module else [a.name for a in node.names]
                for n in names:
                    yield n, node
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield "ext:" + a.name.split(".")[0], node


@pytest.mark.parametrize("module, path", list(_modules()), ids=lambda v: str(v))
def test_imports_follow_layers(module, path):
    allowed = fimoe_convert.LAYERS[module]
    for name, node in _imports(path):
        if name.startswith("ext:"):
            ext = name[4:]
            if ext in LAZY and node.col_offset == 0 and not (ext == "click" and module == "cli"):
                pytest.fail(f"{path.name}:{node.lineno} imports {ext} at module level; import it inside the function")
            continue
        if name == module or name == "__version__" or name == "":
            continue
        assert name in allowed, f"{path.relative_to(PKG)}:{node.lineno}: {module} may not import {name}"


def _root(node) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _file_calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            yield "open", node.lineno
        elif isinstance(f, ast.Attribute) and (f.attr in PATH_CALLS or (f.attr in OS_CALLS and _root(f.value) in
                                                                        ("os", "shutil"))):
            yield f.attr, node.lineno


@pytest.mark.parametrize("module, path", [(m, p) for m, p in _modules() if m not in FILE_MODULES],
                         ids=lambda v: str(v))
def test_only_the_file_modules_touch_files(module, path):
    rel = path.relative_to(PKG).as_posix()
    found = [f"{rel}:{line} calls {name}()" for name, line in _file_calls(path) if (rel, name) not in EXEMPT]
    assert not found, f"file access outside {sorted(FILE_MODULES)}: move it into files/: {found}"


def test_the_file_access_check_can_fail(tmp_path):
    """The detector sees the calls it is meant to see (a check that cannot fail is no check)."""
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom pathlib import Path\ndef f(p):\n    open(p)\n    Path(p).read_text()\n"
                   "    os.replace(p, p)\n    p.resolve()\n    'x'.replace('a', 'b')\n    os.path.exists(p)\n")
    assert [n for n, _ in _file_calls(src)] == ["open", "read_text", "replace", "exists"]


def test_help_and_bf16_path_do_not_import_flashinfer():
    code = ("import sys; from fimoe_convert import convert, cli, inspection; "
            "inspection.list_targets(); assert 'flashinfer' not in sys.modules, 'flashinfer'; "
            "assert 'triton' not in sys.modules, 'triton'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_the_library_front_is_the_commands_functions_and_loads_nothing_heavy():
    """`from fimoe_convert import convert, verify, inspect, upload` gives the functions the CLI calls; importing the
    package, or convert() (which checks the flags and SRC's name before it imports torch), does not import torch."""
    import subprocess
    import sys

    code = ("import sys, fimoe_convert; assert 'torch' not in sys.modules; "
            "from fimoe_convert import convert; assert 'torch' not in sys.modules, 'convert() checks flags first'; "
            "from fimoe_convert import convert, verify, inspect, upload; "
            "from fimoe_convert import conversion, verification, inspection, publish; "
            "assert (convert, verify, inspect, upload) == (conversion.convert, verification.verify, "
            "inspection.inspect, publish.upload); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent)
    assert r.stdout.strip() == "ok", r.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fimoe_convert.nope  # noqa: B018
