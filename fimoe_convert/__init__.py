"""fimoe-convert: offline conversion of DeepSeek V4 routed experts for FlashInfer and BF16 engines.

Layering (enforced by tests/test_layering.py): each module may import only the package
modules listed for it. Only `source`, `safetensors_io` and `manifest` open files (plus
`testing`, which writes fixtures through `safetensors_io`, and `hub`, which hands a finished
folder to huggingface_hub). FlashInfer, deep_gemm and triton are imported lazily inside the
functions that need them, so `--help`, `inspect` and the BF16 path work without them.
"""

__version__ = "0.1.0"

LAYERS: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "dtypes": frozenset(),
    "units": frozenset({"errors"}),
    "numerics": frozenset({"errors", "dtypes"}),
    "checkpoint": frozenset({"errors", "units"}),
    "safetensors_io": frozenset({"errors", "dtypes"}),
    "manifest": frozenset({"errors", "safetensors_io"}),
    "source": frozenset({"errors", "safetensors_io", "checkpoint"}),
    "plan": frozenset({"errors", "checkpoint", "units", "dtypes"}),
    "targets": frozenset({"errors", "checkpoint", "numerics", "plan", "dtypes"}),
    "runtime": frozenset({"errors", "manifest", "numerics", "dtypes"}),
    "hub": frozenset({"errors", "manifest", "units"}),
    "testing": frozenset({"errors", "safetensors_io", "checkpoint", "numerics", "dtypes"}),
    "convert": frozenset(
        {"errors", "units", "dtypes", "checkpoint", "source", "plan", "targets", "manifest", "safetensors_io", "numerics", "hub"}
    ),
    "demo": frozenset({"errors", "units", "convert", "testing", "manifest"}),
    "cli": frozenset({"errors", "units", "convert", "source", "targets", "manifest", "hub", "demo", "checkpoint"}),
    "__main__": frozenset({"cli"}),
}
