"""fimoe-convert: offline conversion of DeepSeek V4 routed experts for FlashInfer and BF16/FP8 engines.

The library: `from fimoe_convert import convert, verify, inspect, upload` (the CLI's commands, same keywords).

Where each job lives:

    cli.py             the commands: parse flags, call the library, print (one error handler)
    conversion.py      convert(): the list of steps of a conversion
      options.py         its flags, parsed and checked before SRC is opened; its keywords as one Request
      budget.py          the one memory budget from --max-memory: unit size, unit check, writer lanes
      resume.py          what an earlier run into OUT left (--resume); the first manifest, the inputs' hashes
      distributed.py     the ranks of a torchrun launch
      pipeline/          moving bytes: channels, the schedule of a shard and the reads of --stream (pure),
                         reader/converter threads, writer lanes
    verification.py    verify OUT or a published ORG/NAME against its manifest (--deep: re-derive from SRC)
    inspection.py      inspect SRC; list the targets
    eta.py             the --dry-run estimate, from samples of the target's own work and of the disks, measured
    console.py         what the CLI shows while it works: progress, log lines, readable reports
    hub.py             the model card
    publish.py         upload() of a finished, verified OUT to the Hub
    demo.py            the embedded default job
    kernels.py         THE kernel table: every target and its kernel's facts, as data
    serving.py         what to convert (or not) per engine and GPU, the serve commands and how each was checked,
                       as data: `recommend` and the decision table of docs/TARGETS.md (pure)
    targets/           the converters, one per family of the table (bf16, fp8_block, megamoe, moe_ep);
                       rules.py checks a target against the model and the options (pure); families.py what each
                       family says of its outputs without a converter: its own rules, report line, card text,
                       runtime needs, and the one builder of FlashInfer's kernel config (pure)
    plan.py            which tensors go into which output shard, in which units of work (pure)
    checkpoint/        what a DeepSeek V4 checkpoint is: config dialects, names, variants (pure)
    numerics/          pure tensor functions: FP4/FP8 decode, Marlin order, FlashInfer object structure
    files/             the only modules that open files, and the trust boundary, a folder per job: the
                       safetensors format (safetensors/), the output folder (output/: manifest file, lock,
                       atomic writes, space, OUT's checks and verify), SRC (sources/: local, Hub, --stream and
                       its resuming HTTP range reads); beside them the shared rules: names, paths, safe_open, the one
                       strict JSON loader, hashing, the preset loader
    configs/           the presets (--config NAME): TOML data, the repository's top-level configs/ folder
    runtime/           the shim that loads an output into FlashInfer with no load-time transform
    testing/           real-format tiny checkpoints for tests, the demo and benchmarks; a transformers model
    records.py         every record written or returned, typed once (pure): the manifest and its parts, the one
                       file record, the index and status files, the results of convert, verify, inspect, upload
                       and targets; one strict reader and one writer derived from the fields
    errors.py, sizes.py, dtypes.py, versions.py   error types, byte sizes, dtype table, installed versions

Imports go one way (tests/cli/test_layering.py enforces LAYERS below and that only `files/` and `testing` touch
files):

    cli -> conversion, verification, inspection, publish, demo -> pipeline, resume -> targets -> plan -> checkpoint
                                   |                        |          \\-> numerics
                                   +----------> files <------+
    runtime -> files, numerics, kernels, targets (families.py)     hub, cli -> targets (families.py)
    targets, runtime -> kernels (data)
    budget (memory constants) <- files, pipeline, options, targets, conversion
    records (pure; imports errors only) <- versions and every layer above
    conversion -> publish (--upload-repo publishes OUT at the end); options -> files, distributed, publish (the
    checks of --stream and --upload-repo); options, hub, inspection -> serving (what --engine implies, the
    engines that load an output)

FlashInfer, deep_gemm and triton are imported inside the functions that need them, so `--help`, `inspect`,
`targets` and the BF16 path work without them.
"""

__version__ = "0.1.0"

# The library's front: `from fimoe_convert import convert, verify, inspect, upload`. Imported on first use, so that
# `--help` and `targets` do not pay for torch.
_FRONT = {"convert": "conversion", "verify": "verification", "inspect": "inspection", "upload": "publish"}
__all__ = ["convert", "inspect", "upload", "verify"]


def __getattr__(name: str):
    if name not in _FRONT:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{_FRONT[name]}"), name)

_BASE = frozenset({"errors", "sizes", "dtypes", "versions", "records"})

LAYERS: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "sizes": frozenset({"errors"}),
    "dtypes": frozenset(),
    "records": frozenset({"errors"}),
    "versions": frozenset({"records"}),
    "kernels": frozenset({"errors"}),
    "budget": frozenset({"errors", "sizes"}),
    "checkpoint": _BASE,
    "numerics": _BASE,
    "plan": _BASE | {"checkpoint"},
    "files": _BASE | {"budget", "checkpoint"},
    "targets": _BASE | {"budget", "kernels", "checkpoint", "numerics", "plan"},
    "pipeline": _BASE | {"budget", "files", "plan"},
    "distributed": _BASE,
    "options": _BASE | {"budget", "distributed", "files", "kernels", "publish", "serving", "targets"},
    "resume": _BASE | {"distributed", "files", "pipeline", "plan"},
    "hub": _BASE | {"files", "kernels", "serving", "targets"},
    "publish": _BASE | {"files"},
    "verification": _BASE | {"files", "kernels", "numerics", "options", "plan", "targets"},
    "inspection": _BASE | {"checkpoint", "files", "kernels", "options", "serving", "targets"},
    "eta": _BASE | {"files"},
    "serving": frozenset({"errors", "kernels"}),
    "console": _BASE,
    "conversion": _BASE | {"budget", "checkpoint", "console", "distributed", "eta", "files", "hub", "kernels",
                           "options", "pipeline", "plan", "resume", "targets", "publish"},
    "runtime": _BASE | {"files", "kernels", "numerics", "targets"},
    "testing": _BASE | {"checkpoint", "files"},
    "demo": _BASE | {"console", "conversion", "testing", "verification"},
    "cli": _BASE | {"console", "conversion", "demo", "files", "hub", "inspection", "kernels", "options", "targets",
                    "publish", "serving", "verification"},
    "entry": frozenset({"cli"}),
    "__main__": frozenset({"entry"}),
}
