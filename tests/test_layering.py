"""The import rules written in fimoe_convert/__init__.py hold, and heavy libraries load lazily."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fimoe_convert

PKG = Path(fimoe_convert.__file__).parent
LAZY = {"flashinfer", "triton", "deep_gemm", "huggingface_hub", "click"}


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


def test_help_and_bf16_path_do_not_import_flashinfer():
    code = ("import sys; from fimoe_convert import convert, cli, targets; "
            "targets.all_targets(); assert 'flashinfer' not in sys.modules, 'flashinfer'; "
            "assert 'triton' not in sys.modules, 'triton'")
    subprocess.run([sys.executable, "-c", code], check=True)
