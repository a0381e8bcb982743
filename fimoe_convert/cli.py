"""Command line: parse, call the library, print. Flag names match `convert(...)`'s keyword arguments.

Errors print as `error: ...` lines (exit 2 for usage, 1 for bad input or failure), one per problem; a
traceback only with FIMOE_DEBUG=1, whatever failed. SIGINT, SIGTERM and SIGHUP stop a command the same way
(clean-up, one line, exit 128 + the signal's number)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import sys
import threading

import click

from . import __version__
from .convert import convert
from .errors import FimoeError, UsageError, format_problems
from .inspection import inspect, list_targets
from .options import DEFAULT_MAX_MEMORY, DEFAULT_SHARD_SIZE
from .sizes import human
from .eta import dry_run_eta
from .verify import verify


# What to do after an interrupted command, by command (default: run it again).
_AFTER_INTERRUPT = {"convert": "finished shards are kept: run the same command with --resume",
                    "upload": "run the same command again to resume (what reached the Hub is not sent again)"}
_STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM", signal.SIGHUP: "stopped by SIGHUP"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread as Ctrl-C is: the library cleans up the same way."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt():
    """While a command runs: the first SIGINT, SIGTERM or SIGHUP raises Interrupted; later ones are ignored, so
    that a second Ctrl-C cannot cut the clean-up short (temporary files left, a traceback). Signals the process
    was started ignoring (nohup, a background job) stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in _STOPPED if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def one_line(text: str) -> str:
    """`text` with control characters (a newline in a flag's value, say) escaped: one problem, one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class _DefaultGroup(click.Group):
    """`fimoe-convert SRC OUT ...` means `fimoe-convert convert SRC OUT ...`. Every command's errors end here."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["convert", *args]
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        with _signals_interrupt():
            try:
                return super().invoke(ctx)
            except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
                raise
            except FimoeError as e:
                _debug_reraise()
                problems = [one_line(p) for p in e.problems]
                for i, line in enumerate(format_problems(problems).splitlines()):
                    click.echo(("error: " if i == 0 else "") + line, err=True)
                sys.exit(e.exit_code)
            except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP as Interrupted
                _debug_reraise()
                signum = getattr(e, "signum", signal.SIGINT)
                after = _AFTER_INTERRUPT.get(ctx.invoked_subcommand or "", "run the same command again")
                click.echo(f"error: {_STOPPED[signum]}; {after}", err=True)
                sys.exit(128 + signum)
            except Exception as e:  # a failure no check foresaw: still one line, the traceback on request
                _debug_reraise()
                what = one_line(" ".join(str(e).split()))[:300]
                click.echo(f"error: {ctx.invoked_subcommand or 'fimoe-convert'} failed: {e.__class__.__name__}"
                           f"{': ' + what if what else ''}; this is a bug or an input fimoe-convert does not check: "
                           "rerun with FIMOE_DEBUG=1 for the traceback and report it", err=True)
                sys.exit(1)


def _debug_reraise() -> None:
    if os.environ.get("FIMOE_DEBUG") == "1":
        raise


def _default(ctx: click.Context, name: str):
    return next(p.default for p in ctx.command.params if p.name == name)


def _emit(obj, as_json: bool, text: str) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True, default=str) if as_json else text)


@click.group(cls=_DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fimoe-convert")
def main() -> None:
    """Convert DeepSeek V4 routed experts offline: BF16 or FlashInfer megakernel layouts.

    \b
    fimoe-convert SRC OUT [--target NAME] ...   convert (SRC: folder or Hub repo id)
    fimoe-convert inspect SRC                   what the checkpoint holds, which targets fit
    fimoe-convert targets                       every target and whether it runs here
    fimoe-convert verify OUT [--deep]           hashes against the manifest
    fimoe-convert upload OUT REPO_ID            publish a verified OUT on the Hub
    fimoe-convert demo                          make a tiny checkpoint, convert, verify
    """


@main.command("convert")
@click.argument("src")
@click.argument("out")
@click.option("--target", default="bf16", show_default=True, help="Target name (fimoe-convert targets).")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) of SRC.")
@click.option("--ep-size", type=int, default=1, show_default=True, help="Expert-parallel ranks to pre-shard for.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--arch", default=None, help="Compute capability to validate for, e.g. 9.0 (default: the GPU's).")
@click.option("--max-memory", default=DEFAULT_MAX_MEMORY, show_default=True, help="Host memory budget.")
@click.option("--shard-size", default=DEFAULT_SHARD_SIZE, show_default=True, help="Output shard size bound.")
@click.option("--allow-lossy", is_flag=True, help="Accept a lossy repack and report it instead of failing.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Kernel parameter, e.g. fp8_scale_mode=blockwise (fimoe-convert targets lists them).")
@click.option("--resume", is_flag=True, help="Finish an interrupted conversion into OUT.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier conversion in OUT.")
@click.option("--dry-run", is_flag=True, help="Print the plan, sizes and free disk; write nothing.")
@click.option("--offline", is_flag=True, help="Use the local Hugging Face cache only (like HF_HUB_OFFLINE=1).")
@click.option("--writers", type=int, default=None,
              help="Output shards written (and hashed) at once; default: from the cores and --max-memory.")
@click.option("--config", "config", default=None, metavar="FILE",
              help="A preset (configs/convert/*.toml); flags given here override it.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@click.option("-v", "--verbose", count=True)
@click.option("-q", "--quiet", is_flag=True)
def convert_cmd(src, out, target, revision, ep_size, device, arch, max_memory, shard_size, allow_lossy, params, resume,
                overwrite, dry_run, offline, writers, config, as_json, verbose, quiet):
    """Convert the checkpoint SRC into OUT."""
    bar = None
    bad = [p for p in params if "=" not in p]
    if bad:
        raise UsageError(f"--param {bad[0]!r}: expected KEY=VALUE")
    params = dict(p.split("=", 1) for p in params)
    ctx = click.get_current_context()
    if config:
        from .files.preset import load_preset

        preset = load_preset(config)
        preset.pop("model", None)
        params = {**preset.pop("params", {}), **params}
        given = {k for k in preset if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT}
        for k, v in preset.items():
            if k not in given:
                ctx.params[k] = v
        target, revision, ep_size, device, arch, max_memory, shard_size, allow_lossy, writers = (
            ctx.params[k] for k in ("target", "revision", "ep_size", "device", "arch", "max_memory", "shard_size",
                                    "allow_lossy", "writers"))

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="B", unit_scale=True, desc="converting", disable=quiet or as_json)
        bar.update(done - bar.n)

    # in a fixed order: the card's bytes must not depend on the order the flags were typed in
    shown = [f"--{k.replace('_', '-')} {ctx.params[k]}" for k in ("target", "revision", "ep_size", "arch", "shard_size")
             if ctx.params[k] != _default(ctx, k)]
    command = one_line(" ".join(["fimoe-convert", shlex.quote(src), "OUT", *shown,
                                 *(["--allow-lossy"] if allow_lossy else []),
                                 *[f"--param {k}={v}" for k, v in sorted(params.items())]]))
    try:
        res = convert(src, out, target, revision=revision, ep_size=ep_size, device=device, arch=arch,
                      max_memory=max_memory, shard_size=shard_size, allow_lossy=allow_lossy, params=params,
                      resume=resume, overwrite=overwrite, dry_run=dry_run, offline=offline, writers=writers,
                      progress=progress, command=command)
    finally:
        if bar is not None:
            bar.close()
    if dry_run:
        rows = "\n".join(f"  {r['file']}  rank {'-' if r['rank'] is None else r['rank']}  {r['tensors']} tensors  "
                         f"{human(r['bytes'])}{'  (kept)' if r['kept'] else ''}" for r in res.plan)
        text = (f"plan for --target {res.target} on {res.device}: {res.shards} shards\n{rows}\n"
                f"read {human(res.bytes_read)}, write {human(res.bytes_written)}, free disk {human(res.free_disk)}"
                + ("" if res.free_disk >= res.bytes_written else "  (NOT ENOUGH)"))
        text += "\n" + dry_run_eta(src, revision, res.bytes_read + res.bytes_written)
    else:
        text = (f"converted to {res.target} on {res.device}: {res.shards} shards ({res.shards_kept} kept), "
                f"read {human(res.bytes_read)}, wrote {human(res.bytes_written)} in {res.seconds:.1f} s -> {res.out}")
        if res.report:
            text += "\n" + json.dumps(res.report, sort_keys=True)
    if res.skipped:
        text += ("\nnot copied from SRC (named like fimoe-convert's own files): "
                 + ", ".join(one_line(n) for n in res.skipped))
    if not quiet or as_json:
        _emit(res.to_json(), as_json, text)


@main.command("inspect")
@click.argument("src")
@click.option("--revision", default=None)
@click.option("--offline", is_flag=True)
@click.option("--ep-size", type=int, default=1, show_default=True)
@click.option("--arch", default=None)
@click.option("--json", "as_json", is_flag=True)
def inspect_cmd(src, revision, offline, ep_size, arch, as_json):
    """What the checkpoint SRC holds and which targets fit it."""
    r = inspect(src, revision=revision, offline=offline, ep_size=ep_size, arch=arch)
    m = r["model"]
    lines = [f"{r['source']}: {r['variant']}: {m['model_type']} ({m['dialect']}), experts {m['expert_dtype']}, "
             f"hidden {m['hidden_size']}, moe_intermediate {m['moe_intermediate_size']}, "
             f"{m['n_routed_experts']} experts top-{m['num_experts_per_tok']}, {m['num_hidden_layers']} layers "
             f"+ {m['num_nextn_predict_layers']} MTP, {m['num_hash_layers']} hash layers",
             f"{r['shards']} shards, {r['tensors']} tensors, {human(r['bytes'])} "
             f"({human(r['routed_expert_bytes'])} routed experts)"]
    lines += [f"  {k}: {v}" for k, v in r["tensor_classes"].items()]
    lines.append("targets:")
    for name, fit in r["targets"].items():
        lines.append(f"  {name}: " + (fit if fit == "fits" else "no: " + "; ".join(fit)))
    _emit(r, as_json, "\n".join(lines))


@main.command("targets")
@click.option("--json", "as_json", is_flag=True)
def targets_cmd(as_json):
    """Every target: kernel, architectures, formats, NVSHMEM, and whether it can run here now."""
    rows = list_targets()
    lines = [f"{'target':34} {'arch':10} {'weights':8} {'nvshmem':7} {'here':4} notes"]
    for r in rows:
        lines.append(f"{r['name']:34} {','.join(r['capabilities']) or 'any':10} {r['weight_format'].split()[0]:8} "
                     f"{'yes' if r['needs_nvshmem'] else 'no':7} {'yes' if r['available_here'] else 'no':4} "
                     + (r["why"] if not r["available_here"] else "")
                     + (f" aliases: {', '.join(r['aliases'])}" if r["aliases"] else ""))
    _emit(rows, as_json, "\n".join(lines))


@main.command("verify")
@click.argument("out")
@click.option("--deep", is_flag=True, help="Also re-derive a sample of experts from the source.")
@click.option("--src", default=None, help="Source to re-derive from (default: the one in the manifest).")
@click.option("--json", "as_json", is_flag=True)
def verify_cmd(out, deep, src, as_json):
    """Check OUT against its manifest (exit 1 naming the first bad file)."""
    r = verify(out, deep=deep, src=src)
    if r["problems"]:
        if as_json:
            _emit(r, True, "")
        else:
            click.echo(f"error: {one_line(r['problems'][0])}", err=True)
        sys.exit(1)
    _emit(r, as_json, f"ok: {r['files']} files, {human(r['bytes'])} match the manifest"
          + (f"; {r['deep_checked']} units re-derived from the source match" if deep else ""))


@main.command("upload")
@click.argument("out")
@click.argument("repo_id")
@click.option("--private", is_flag=True, help="Create the repo private (an existing public repo is refused).")
@click.option("--revision", default=None, help="Branch to upload to (created if missing).")
@click.option("--dry-run", is_flag=True, help="List files and bytes; upload nothing.")
@click.option("--json", "as_json", is_flag=True)
def upload_cmd(out, repo_id, private, revision, dry_run, as_json):
    """Publish a complete, verified OUT to the Hub repo REPO_ID.

    The token comes from HF_TOKEN or `hf auth login` and is never printed; HF_ENDPOINT picks the
    Hub. An interrupted upload resumes when the same command runs again."""
    from .hub import upload

    r = upload(out, repo_id, private=private, revision=revision, dry_run=dry_run)
    where = f"{repo_id}@{r['revision']}"
    if dry_run:
        text = "\n".join([f"would upload {r['files']} files, {r['human']} ({r['bytes']} bytes) to {where}"
                          + (" (private)" if private else ""),
                          *[f"  {f['file']}  {f['bytes']} bytes ({human(f['bytes'])})" for f in r["list"]],
                          *[f"  not uploaded (not in the manifest): {f}" for f in r["not_uploaded"]],
                          "token: " + ("found (not shown)" if r["token_found"] else
                                       "none found: set HF_TOKEN or run `hf auth login` before uploading")])
    else:
        text = f"uploaded {r['files']} files, {r['human']} to {where}: {r['url']} (commit {r['commit']})"
    _emit(r, as_json, text)


@main.command("demo")
@click.option("--workdir", default="demo-out", show_default=True, help="Folder for the fixture and outputs.")
@click.option("--json", "as_json", is_flag=True)
def demo_cmd(workdir, as_json):
    """Make a tiny V4 checkpoint, convert it to BF16 and to a FlashInfer layout, verify, summarize."""
    from .demo import run_demo

    r = run_demo(workdir, log=None if as_json else click.echo)
    _emit(r, as_json, r["summary"])


if __name__ == "__main__":
    main()
