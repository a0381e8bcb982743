"""Command line: parse, call the library, print. Flag names match the keyword arguments of the library's
functions (`convert`, `verify`, `inspect`, `upload`); `--config` (a preset file) is the CLI's own.

One error handler for every command (`Cli.invoke`): a FimoeError prints as `error: ...` lines (exit 2 for usage,
1 for bad input or failure), Ctrl-C, SIGTERM and SIGHUP stop the work cleanly (exit 128 + the signal), anything
else is one line too; a traceback only with FIMOE_DEBUG=1. torch, FlashInfer and huggingface_hub are imported by
the commands that need them, so `--help` and `targets` start fast."""

from __future__ import annotations

import difflib
import gc
import json
import logging
import os
import shlex
import signal
import sys

import click

from . import __version__, console
from .console import Interrupted, Progress, is_rank0, plural, setup_logging, signals_interrupt, stopped_by
from .errors import FimoeError, UsageError, format_problems, one_line
from .kernels import BY_NAME, GPU_FAMILIES, KERNELS, suggested
from .options import DEFAULT_MAX_MEMORY, DEFAULT_SHARD_SIZE
from .records import DEMO_WORKDIR, CheckpointInfo, OutputInfo, to_json
from .sizes import human

ON_INTERRUPT = "fimoe_convert.on_interrupt"  # ctx.meta key (shared by every context): what to say after Ctrl-C
PRESET_PARAMS = "fimoe_convert.preset_params"  # ctx.meta key: the --config file's params, merged with --param
PRESET = "fimoe_convert.preset"  # ctx.meta key: the --config file's model and target
EXAMPLES = """\b
Examples:
  fimoe-convert deepseek-ai/DeepSeek-V4-Flash out/ --target fp8_block --param scale_dtype=f32
  fimoe-convert deepseek-ai/DeepSeek-V4-Flash out/ --config v4_flash_megamoe_sm90_ep8
  fimoe-convert inspect deepseek-ai/DeepSeek-V4-Flash
  fimoe-convert verify out/ --deep
  fimoe-convert demo
"""


def _debug() -> bool:
    return os.environ.get("FIMOE_DEBUG") == "1"


def _interrupted(e: KeyboardInterrupt, meta: dict):
    """The one line a stop prints, and its exit status (128 + the signal)."""
    signum = getattr(e, "signum", signal.SIGINT)
    click.echo(f"error: interrupted ({signal.Signals(signum).name}); "
               f"{meta.get(ON_INTERRUPT, 'nothing was left half-done')}", err=True)
    if _OWN_PROCESS:  # the clean-up is done: the interpreter's shutdown is skipped
        _exit_now(128 + signum)
    gc.freeze()  # a stop ends within a second or two: the collector's passes over torch's objects at exit took 1.5-2 s
    sys.exit(128 + signum)


_OWN_PROCESS: list[bool] = []  # the command runs as this process's own command line (not called from Python)


def _exit_now(code: int) -> None:
    """End the process after a stop, its line printed, without the interpreter's shutdown: threads still blocked in
    a socket read or in native code (torch) made that take seconds under load, or crash it (exit -11)."""
    logging.shutdown()  # log files flushed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


class Cli(click.Group):
    """`fimoe-convert SRC OUT ...` means `fimoe-convert convert SRC OUT ...`; a mistyped command is not taken as SRC."""

    def parse_args(self, ctx, args):
        first = args[0] if args else None
        if first and first not in self.commands and not first.startswith("-"):
            from .files.output.folder import path_kind

            close = difflib.get_close_matches(first, list(self.commands), n=1, cutoff=0.75)
            if close and "/" not in first and path_kind(first) == "missing":
                raise click.UsageError(f"no such command {first!r}; did you mean {close[0]!r}? (or, to convert, SRC "
                                       "must be a folder or a Hub repo id org/name)", ctx)
            args = ["convert", *args]
        return super().parse_args(ctx, args)

    def main(self, args=None, *rest, **kwargs):
        """The signal handlers are in place from the start: a Ctrl-C while the command line is parsed (SRC's kind
        looked up, modules loaded) ends as one during the work does, not with click's 'Aborted!' and exit 1. When
        this is the process's own command line (`args` None), signals are ignored once the command has ended: one
        then would only cut the interpreter's exit short (exit -2, or a traceback from joining a thread)."""
        if _debug():
            return super().main(args, *rest, **kwargs)
        if args is None:
            _OWN_PROCESS.append(True)
        try:
            with signals_interrupt(ignore_after=args is None):
                return super().main(args, *rest, **kwargs)
        except KeyboardInterrupt as e:  # came as the command ended (its exit under way): the work is done or reported
            _interrupted(e, {})

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except KeyboardInterrupt as e:
            if _debug():
                raise
            _interrupted(e, {})

    def invoke(self, ctx):
        if _debug():
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - each kind gets its one line below
            _report(e, ctx.meta)


def _report(e: BaseException, meta: dict):
    """The one line (or lines, one per problem) for what ended a command, and its exit status."""
    # After a stop, whatever the clean-up raises is the stop's doing (e.g. numpy loaded again after the signal cut
    # its first import short: "cannot load module more than once per process"): the interruption line, 128 + signal.
    if (signum := stopped_by()) is not None or isinstance(e, KeyboardInterrupt):
        _interrupted(e if signum is None else Interrupted(signum), meta)
    if isinstance(e, FimoeError):
        problems = [one_line(p) for p in e.problems]
        for i, line in enumerate(format_problems(problems).splitlines()):
            click.echo(("error: " if i == 0 else "") + line, err=True)
        sys.exit(e.exit_code)
    if isinstance(e, (click.ClickException, click.exceptions.Abort)) or not isinstance(e, Exception):
        raise e
    # a bug or an environment problem: one line, the rest on request
    what = one_line(" ".join(str(e).split()))[:500]
    click.echo(f"error: {type(e).__name__}{': ' + what if what else ''}; this is not a known input problem: "
               "run again with FIMOE_DEBUG=1 for the traceback and report it", err=True)
    sys.exit(1)


class TargetName(click.ParamType):
    """A --target name: any case, '-' or '_', aliases too (checked by the library); shells complete it."""

    name = "target"

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        names = [n for k in KERNELS for n in (k.name, *k.aliases)]
        return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def _emit(obj, as_json: bool, text: str) -> None:
    # Text: control characters but the line breaks escaped (a name read from a file sends no escape sequence).
    click.echo(json.dumps(to_json(obj), indent=1, sort_keys=True, default=str) if as_json else
               "\n".join(one_line(line) for line in text.split("\n")))


def _params(pairs: tuple[str, ...]) -> dict:
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise UsageError(f"--param {bad[0]}: expected KEY=VALUE, e.g. --param scale_dtype=f32")
    return dict(p.split("=", 1) for p in pairs)


def _preset(ctx: click.Context, param, path: str | None) -> str | None:
    """--config (eager, so before the other flags): the preset's values become the command's defaults
    (ctx.default_map), converted by the command's own flag types; a value they refuse names the file and the key.
    Its `params` merge with --param in the command."""
    if path is None or ctx.resilient_parsing:
        return path
    from .files.preset import load_preset

    preset = load_preset(path)
    ctx.meta[PRESET] = {"config": path, "model": preset.pop("model", None), "target": preset.get("target")}
    ctx.meta[PRESET_PARAMS] = preset.pop("params", {})
    flags = {p.name: p for p in ctx.command.params}
    problems = []
    for key, value in preset.items():
        try:
            flags[key].type_cast_value(ctx, value)
        except (click.BadParameter, TypeError, ValueError) as e:  # click's int() lets TypeError through for a list
            why = getattr(e, "message", None) or str(e)
            problems.append(f"--config {path}: {key} is {value!r}: {why.rstrip('.')}; correct it in the file "
                            f"(or give --{key.replace('_', '-')} on the command line)")
    if problems:
        raise UsageError("; ".join(problems), problems)
    ctx.default_map = {**(ctx.default_map or {}), **preset}
    return path


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXAMPLES)
@click.version_option(__version__, prog_name="fimoe-convert")
def main() -> None:
    """Convert DeepSeek V4 routed experts offline, once: BF16, FP8 blocks or FlashInfer megakernel layouts.

    \b
    fimoe-convert SRC OUT [--target NAME] ...   convert (SRC: a folder or a Hub repo id org/name)
    fimoe-convert inspect SRC                   what a checkpoint (or an output) holds, which targets fit
    fimoe-convert recommend --engine E --gpu G  do I need a conversion, and which, for my engine and GPU
    fimoe-convert targets                       every target, which GPUs and engines run it, which fit here
    fimoe-convert verify OUT [--deep]           every file of OUT against its manifest
    fimoe-convert verify ORG/NAME [--deep]      a published conversion, by range (--deep: re-derived from its source)
    fimoe-convert upload OUT REPO_ID            publish a verified OUT on the Hub
    fimoe-convert download SRC                  fetch the files a conversion reads into the Hub cache
    fimoe-convert demo                          make a tiny checkpoint, convert, verify
    """


@main.command("convert", epilog=EXAMPLES)
@click.argument("src")
@click.argument("out")
@click.option("--target", type=TargetName(), default=None,
              help="What to convert to; `fimoe-convert targets` lists them.  [default: bf16, or --engine's choice]")
@click.option("--engine", default=None, metavar="ENGINE",
              help="vllm, sglang, transformers or flashinfer: convert so that the output loads there (without "
                   "--target: that engine's conversion, e.g. fp8_block with F32 scales for vLLM).")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) of SRC.")
@click.option("--ep-size", type=int, default=1, show_default=True,
              help="Expert-parallel ranks to pre-shard for (rank r gets experts [r*E/N, (r+1)*E/N)).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where to convert: auto takes the GPU when torch sees one.")
@click.option("--arch", default=None, help="Compute capability to check the target for, e.g. 9.0 (default: the GPU's).")
@click.option("--max-memory", default=DEFAULT_MAX_MEMORY, show_default=True,
              help="Host memory the conversion may hold, e.g. 8GiB.")
@click.option("--shard-size", default=DEFAULT_SHARD_SIZE, show_default=True, help="Largest output shard, e.g. 5GB.")
@click.option("--allow-lossy", is_flag=True, help="Accept a lossy repack and report its error instead of failing.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A target parameter, e.g. scale_dtype=f32 (`fimoe-convert targets` lists them).")
@click.option("--resume", is_flag=True, help="Finish an interrupted conversion into OUT (finished shards are kept).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier conversion in OUT.")
@click.option("--dry-run", is_flag=True, help="Print the plan, sizes, free disk and an estimate; write nothing.")
@click.option("--offline", is_flag=True, help="Use the local Hugging Face cache only (like HF_HUB_OFFLINE=1).")
@click.option("--writers", type=int, default=None,
              help="Output shards written and hashed at once (default: from the cores and --max-memory).")
@click.option("--stream", is_flag=True,
              help="Read a Hub SRC's shards over HTTP straight into the conversion (sha256-checked), none to disk.")
@click.option("--connections", type=int, default=None,
              help="--stream: ranged GETs at once, over the shards (default 16: a 1 GB/s link at 100 MB/s each).")
@click.option("--upload-repo", default=None, metavar="ORG/NAME",
              help="Upload the finished, verified OUT to this Hub repo at the end (as `fimoe-convert upload`).")
@click.option("--config", "config", default=None, metavar="NAME|FILE", is_eager=True, callback=_preset,
              help="A preset by name (`fimoe-convert targets` lists them) or a TOML file; flags given here override "
                   "it.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@click.option("-v", "--verbose", count=True, help="Show the steps (-v) and details (-vv).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def convert_cmd(src, out, params, config, as_json, verbose, quiet, **flags):
    """Convert the DeepSeek V4 checkpoint SRC into the folder OUT."""
    from .conversion import convert

    setup_logging(verbose, quiet)
    ctx = click.get_current_context()
    params = {**_preset_params(ctx, flags["target"]), **_params(params)}  # --param wins over the preset's, by key
    preset = ctx.meta.get(PRESET, {})
    ctx.meta[ON_INTERRUPT] = "finished shards are kept: run the same command with --resume"
    progress = Progress("converting", enabled=not (quiet or as_json))
    checking = Progress("checking kept shards", enabled=not (quiet or as_json))
    try:
        res = convert(src, out, params=params, progress=progress, check_progress=checking,
                      command=_command(ctx, src, flags, params), model=preset.get("model"),
                      config=preset.get("config"), **flags,
                      notice=None if quiet or as_json or not is_rank0() else lambda m: click.echo(m, err=True))
    finally:
        checking.close()
        progress.close()
    gc.freeze()  # the ~190k objects of torch's import out of the collector's passes: at exit they took 1.5-2 s
    if (not quiet or as_json) and is_rank0():  # under torchrun, rank 0 speaks for all
        _emit(res, as_json, _dry_run_text(res) if res.dry_run else _summary(res))


def _preset_params(ctx: click.Context, target: str) -> dict:
    """The preset's params, unless --target on the command line names another target (they are that one's)."""
    preset, params = ctx.meta.get(PRESET, {}), ctx.meta.get(PRESET_PARAMS, {})
    given = ctx.get_parameter_source("target") == click.core.ParameterSource.COMMANDLINE
    if params and given and preset.get("target") and _kernel_name(target) != _kernel_name(preset["target"]):
        logging.getLogger("fimoe_convert").info("--target %s: the --param values of --config %s (for %s) dropped: %s",
                                                target, preset["config"], preset["target"], params)
        return {}
    return params


def _kernel_name(name: str) -> str | None:
    from .kernels import get_kernel

    try:
        return get_kernel(name).name
    except FimoeError:
        return name


def _command(ctx: click.Context, src: str, flags: dict, params: dict) -> str:
    """The command line for the model card: the flags that differ from their defaults, in a fixed order (the card's
    bytes must not depend on the order they were typed in, or on a preset file's path)."""
    defaults = {p.name: p.default for p in ctx.command.params}
    defaults["target"] = None if flags["engine"] else "bf16"  # bf16 given or not: the same card without --engine
    shown = [f"--{k.replace('_', '-')} {flags[k]}" for k in ("target", "engine", "revision", "ep_size", "arch",
                                                            "shard_size") if flags[k] not in (None, defaults[k])]
    from .files.output.folder import path_kind

    shown_src = shlex.quote(src) if path_kind(src) == "missing" else "SRC"  # a local path stays on this machine
    return one_line(" ".join(["fimoe-convert", shown_src, "OUT", *shown,
                              *(["--allow-lossy"] if flags["allow_lossy"] else []),
                              *[f"--param {k}={v}" for k, v in sorted(params.items())]]))


def _summary(res) -> str:
    text = (f"converted to {res.target} on {res.device}: {plural(res.shards, 'shard')} ({res.shards_kept} kept), "
            f"read {human(res.bytes_read)}, wrote {human(res.bytes_written)} in {res.seconds:.1f} s -> {res.out}")
    if res.upload:
        text += f"\nuploaded {plural(res.upload.files, 'file')}, {res.upload.human} -> {res.upload.url}"
    from .targets.families import family

    line = family(BY_NAME[res.target]).report_line(res.report)
    return text + (f"\n{line}" if line else "") + f"\n{_loads_in(BY_NAME[res.target], res.params)}" + _skipped(res)


def _loads_in(kernel, params: dict) -> str:
    """The output's expert scale dtype (fp8_block) and the engines that load it (serving.py)."""
    from .serving import engine_names, expert_scales, loading_engines

    scales = expert_scales(kernel, params)
    # a kernel layout: the kernel table says through what FlashInfer loads it
    engines = kernel.engines if kernel.kernel_name else engine_names(loading_engines(kernel, params))
    return (f"expert scales: {scales}; " if scales else "") + f"loads in: {engines}"


def _skipped(res) -> str:
    return ("\nnote: not copied from SRC (named like fimoe-convert's own files): "
            + ", ".join(one_line(n) for n in res.skipped)) if res.skipped else ""


def _dry_run_text(res) -> str:
    rows = "\n".join(f"  {r.file}  rank {'-' if r.rank is None else r.rank}  {plural(r.tensors, 'tensor')}  "
                     f"{human(r.bytes)}{'  (kept)' if r.kept else ''}" for r in res.plan)
    enough = "" if res.free_disk >= res.bytes_written else "  (NOT ENOUGH)"
    return (f"plan for --target {res.target} on {res.device}: {plural(res.shards, 'shard')}\n{rows}\n"
            f"read {human(res.bytes_read)}, write {human(res.bytes_written)}, "
            f"free disk {human(res.free_disk)}{enough}\n"
            f"{res.estimate}" + _skipped(res))


@main.command("inspect")
@click.argument("src")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) of SRC.")
@click.option("--offline", is_flag=True, help="Use the local Hugging Face cache only.")
@click.option("--ep-size", type=int, default=1, show_default=True, help="Judge the targets for this EP size.")
@click.option("--arch", default=None, help="Judge the targets for this compute capability, e.g. 9.0.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable description.")
def inspect_cmd(src, revision, offline, ep_size, arch, as_json):
    """What the checkpoint SRC holds and which targets fit it (or, for a converted folder, what it is)."""
    from .inspection import inspect

    r = inspect(src, revision=revision, offline=offline, ep_size=ep_size, arch=arch)
    _emit(r, as_json, _converted_text(r) if isinstance(r, OutputInfo) else _checkpoint_text(r))


def _checkpoint_text(r: CheckpointInfo) -> str:
    m = r.model
    lines = [f"{r.source}: {r.variant}: {m.model_type} ({m.dialect}), experts {m.expert_dtype}, "
             f"hidden {m.hidden_size}, moe_intermediate {m.moe_intermediate_size}, "
             f"{m.n_routed_experts} experts top-{m.num_experts_per_tok}, {m.num_hidden_layers} layers "
             f"+ {m.num_nextn_predict_layers} MTP, {m.num_hash_layers} hash layers",
             f"{plural(r.shards, 'shard')}, {plural(r.tensors, 'tensor')}, {human(r.bytes)} "
             f"({human(r.routed_expert_bytes)} routed experts)"
             + (f"; {plural(r.headers_from_hub, 'shard header')} read from the Hub, no weights downloaded"
                if r.headers_from_hub else "")]
    lines += [f"  {k}: {v}" for k, v in r.tensor_classes.items()]
    lines.append("targets:")
    for name, fit in r.targets.items():
        lines.append(f"  {name}: " + (fit if fit == "fits" else "no: " + "; ".join(fit)))
    return "\n".join(lines)


def _converted_text(r: OutputInfo) -> str:
    m, t, origin = r.model, r.target, r.origin
    line = (lambda v: one_line(v) if isinstance(v, str) else v)  # read from a manifest: one line each
    repo, spec, revision, name, kernel = map(line, (origin.repo_id, origin.spec, origin.revision, t.name,
                                                    t.kernel_name))
    return "\n".join([
        f"{r.source}: a fimoe-convert output for --target {name}"
        + (f" (FlashInfer kernel {kernel})" if kernel else "")
        + f", EP size {r.ep_size}, {'complete' if r.complete else 'NOT complete (run with --resume)'}",
        f"converted from {repo or spec}" + (f" at {revision}" if revision else "")
        + f" by fimoe-convert {line(r.tool.version)}: {plural(r.files, 'file')}, {human(r.bytes)}",
        f"model: {line(m.model_type)}, hidden {m.hidden_size}, moe_intermediate {m.moe_intermediate_size}, "
        f"{m.n_routed_experts} experts, {m.moe_blocks} MoE blocks",
        _loads_in(BY_NAME[t.name], dict(t.parameters)) if t.name in BY_NAME else "loads in: see its README.md",
        f"compute capabilities: {', '.join(map(line, t.capabilities)) or 'any'}; check it with "
        f"`fimoe-convert verify {r.source}`"])


@main.command("targets")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable table.")
def targets_cmd(as_json):
    """Every target: its GPUs, formats, NVSHMEM need, the engines that load it, and whether it converts here."""
    from .inspection import list_targets

    rows = list_targets()
    _emit(rows, as_json, "\n".join(targets_lines(rows)))


def targets_lines(rows: list, here: bool = True) -> list[str]:
    """`targets`' text: the table, the GPUs' suggestions and the presets; here=False leaves out the `here` column
    and its reasons, what depends on the machine (docs/TARGETS.md shows that table)."""
    lines = [f"{'target':34} {'arch':10} {'weights':9} {'nvshmem':7} " + (f"{'here':4} " if here else "") + "notes"]
    for r in rows:
        notes = [r.why if here and not r.available_here else "",
                 f"aliases: {', '.join(r.aliases)}" if r.aliases else ""]
        lines.append(f"{r.name:34} {','.join(r.capabilities) or 'any':10} {r.weight_format.split()[0]:9} "
                     f"{'yes' if r.needs_nvshmem else 'no':7} "
                     + (f"{'yes' if r.available_here else 'no':4} " if here else "")
                     + " ".join(n for n in notes if n))
        lines.append(f"{'':34} loads in: {r.engines}")
        params = BY_NAME[r.name].params
        if params:
            lines.append(f"{'':34} params: " + "; ".join(f"--param {k}={'|'.join(v)} (default {v[0]})"
                                                           for k, v in params.items()))
    lines.append("suggested by GPU: " + "; ".join(f"{cap} ({name}): {', '.join(k.name for k in suggested(cap))}"
                                                   for cap, name in GPU_FAMILIES.items() if suggested(cap))
                 + "; any GPU or engine without FP4 MoE kernels: bf16 or fp8_block (docs/TARGETS.md)")
    return [line.rstrip() for line in lines + _presets_text()]


def _presets_text() -> list[str]:
    """The shipped presets, one line each: --config NAME, its model and its flags."""
    from .files.preset import load_preset, preset_names

    lines = ["presets (--config NAME):"]
    for name in preset_names():
        p = load_preset(name)
        flags = [f"--{k.replace('_', '-')} {v}" for k, v in p.items() if k not in ("model", "params")]
        flags += [f"--param {k}={v}" for k, v in p.get("params", {}).items()]
        lines.append(f"  {name:34} {p.get('model', 'any model')}: {' '.join(flags)}")
    return lines


@main.command("recommend")
@click.option("--engine", required=True, help="vllm, sglang, transformers or flashinfer (your own serving code).")
@click.option("--gpu", required=True, help="A GPU by name (H200, B200, RTX 5090) or compute capability (9.0, sm90).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable answer.")
def recommend_cmd(engine, gpu, as_json):
    """Which target (or none) to convert to for an ENGINE on a GPU: why, the size on disk, the serve command."""
    from .serving import recommend, text

    r = recommend(engine, gpu)
    _emit(r.to_json(), as_json, text(r))


@main.command("verify")
@click.argument("out")
@click.option("--deep", is_flag=True, help="Also re-derive a sample of units from the source, bit for bit.")
@click.option("--src", default=None, help="The source to re-derive from (default: the one in the manifest).")
@click.option("--revision", default=None, help="For a Hub repo id: its branch, tag or commit.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result.")
def verify_cmd(out, deep, src, revision, as_json):
    """Check every file of OUT, a folder or a Hub repo id (ORG/NAME), against its manifest (exit 1 naming the first
    bad file). A repo is checked by the Hub's sha256 of each file and its shards' headers: no shard is downloaded.
    With --deep, a repo's sampled units are re-derived from its Hub source, both read by range."""
    with console.signals_deferred():  # torch is imported here
        from .verification import verify

    progress = Progress("verifying", enabled=not as_json)
    try:
        r = verify(out, deep=deep, src=src, progress=progress, revision=revision)
    finally:
        progress.close()
    if r.problems:
        if as_json:
            _emit(r, True, "")
        else:
            click.echo(f"error: {one_line(r.problems[0])}", err=True)
        sys.exit(1)
    if r.source:  # verify ORG/NAME --deep: what was compared, and how
        _emit(r, as_json, f"ok: {plural(r.deep_checked, 'unit')} re-derived from {r.source}, byte-identical, and "
              f"{plural(r.copies_checked or 0, 'copied tensor')}; {plural(r.files, 'file')}' sha256 "
              f"({human(r.bytes)}) match the manifest, from the Hub's records; the {human(r.range_bytes or 0)} "
              "read by range were compared, not hashed whole")
        return
    _emit(r, as_json, f"ok: {plural(r.files, 'file')}, {human(r.bytes)} match the manifest"
          + (f"; {plural(r.deep_checked, 'unit')} re-derived from the source match" if deep else "")
          + (f" (source: {r.source_folder})" if r.source_folder else ""))


@main.command("upload")
@click.argument("out")
@click.argument("repo_id")
@click.option("--token", default=None, help="Hugging Face token (default: HF_TOKEN or `hf auth login`'s); never "
              "printed.")
@click.option("--private", is_flag=True, help="Create the repo private (an existing public repo is refused).")
@click.option("--revision", default=None, help="Branch to upload to (created if missing).")
@click.option("--commit-message", default=None, help="The commit's summary.")
@click.option("--commit-description", default=None, help="The commit's description.")
@click.option("--create-pr", is_flag=True, help="Open a pull request with the files instead of committing to the "
              "branch.")
@click.option("--dry-run", is_flag=True, help="Check OUT and list its files and bytes; upload nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result.")
def upload_cmd(out, repo_id, token, private, revision, commit_message, commit_description, create_pr, dry_run,
               as_json):
    """Publish a complete, verified OUT to the Hub repo REPO_ID (note: OUT first, the reverse of `hf upload`).

    The token comes from --token, HF_TOKEN or `hf auth login` and is never printed; HF_ENDPOINT picks the
    Hub. An interrupted upload is finished by the same command (what reached the Hub is not sent again)."""
    from .publish import upload

    ctx = click.get_current_context()
    ctx.meta[ON_INTERRUPT] = "run the same command again to finish (what reached the Hub is not sent again)"
    progress = Progress("checking OUT", enabled=not as_json)
    try:
        r = upload(out, repo_id, private=private, revision=revision, dry_run=dry_run, progress=progress, token=token,
                   commit_message=commit_message, commit_description=commit_description, create_pr=create_pr)
    finally:
        progress.close()
    where = f"{repo_id}@{r.revision}"
    if dry_run:
        text = "\n".join([f"would upload {plural(r.files, 'file')}, {r.human} ({r.bytes} bytes) to {where}"
                          + (" (private)" if private else ""),
                          *[f"  {one_line(f.file)}  {f.bytes} bytes ({human(f.bytes)})" for f in r.list],
                          *[f"  not uploaded (not in the manifest): {one_line(f)}" for f in r.not_uploaded],
                          "token: " + ("found (not shown)" if r.token_found else
                                       "none found: set HF_TOKEN or run `hf auth login` before uploading")])
    elif r.pr_url:
        text = f"uploaded {plural(r.files, 'file')}, {r.human} to {repo_id}, pull request: {r.pr_url}"
    else:
        text = f"uploaded {plural(r.files, 'file')}, {r.human} to {where}: {r.url} (commit {r.commit})"
    _emit(r, as_json, text)


@main.command("download")
@click.argument("src")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) of SRC.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable result.")
def download_cmd(src, revision, as_json):
    """Fetch the files a conversion of the Hub repo SRC reads (weights, configs, tokenizer) into the Hugging Face
    cache (HF_HUB_CACHE), resumably; a later conversion (or an image build) then runs with --offline."""
    from .files.sources.hub import download

    r = download(src, revision)
    _emit(r, as_json, f"{src}@{r['revision']}: {plural(r['files'], 'file')}, {human(r['bytes'])} in {r['path']}")


@main.command("demo")
@click.option("--workdir", default=DEMO_WORKDIR, show_default=True, help="Folder for the fixture and the outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
def demo_cmd(workdir, as_json):
    """Make a tiny V4 checkpoint, convert it to BF16 and to a FlashInfer layout, verify both, summarize."""
    with console.signals_deferred():  # torch is imported here
        from .demo import run_demo

    r = run_demo(workdir, log=None if as_json else click.echo)
    _emit(r, as_json, r["summary"])


if __name__ == "__main__":
    main()
