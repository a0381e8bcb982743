"""The first ten minutes, as a user meets them: every point runs the CLI as a user does and matches what it
prints and its exit code."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fimoe_convert import console
from fimoe_convert.cli import main


def run(*args, **env):
    return CliRunner().invoke(main, [str(a) for a in args], env=env or None)


@pytest.fixture(scope="module")
def bf16_out(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out"
    assert run(tiny_ckpt, out, "-q").exit_code == 0
    return out


@pytest.mark.parametrize("typo, command", [("inpsect", "inspect"), ("verfy", "verify"), ("targest", "targets"),
                                           ("uplaod", "upload")])
def test_a_mistyped_command_is_not_taken_as_src(typo, command, tmp_path):
    r = run(typo, tmp_path / "x")
    assert r.exit_code == 2
    assert f"no such command '{typo}'; did you mean '{command}'?" in r.output


@pytest.mark.parametrize("name, ok", [("BF16", True), ("fp8-block", True), ("Megamoe_SM90_MXFP4", True),
                                      ("bf61", False), ("fp8_blok", False)])
def test_target_names_ignore_case_and_hyphens_and_typos_get_a_suggestion(tiny_ckpt, tmp_path, name, ok):
    r = run(tiny_ckpt, tmp_path / "out", "--target", name, "--dry-run", "--json")
    if ok:
        assert r.exit_code == 0, r.output
    else:
        assert r.exit_code == 2 and re.search(
            rf"^error: --target {name}: unknown target; did you mean '", r.stderr, re.M
        )


@pytest.mark.parametrize("args, match", [
    (["--ep-size", "0"], r"^error: --ep-size 0: must be 1 or more \(the number of expert-parallel ranks\)$"),
    (["--ep-size", "-2"], r"^error: --ep-size -2: must be 1 or more"),
    (["--max-memory", "8G"], r"^error: --max-memory: cannot read size '8G'; did you mean 8GB \(decimal\) or 8GiB "
                             r"\(binary\)\?$"),
    (["--shard-size", "5g"], r"did you mean 5GB \(decimal\) or 5GiB \(binary\)\?"),
    (["--param", "dense"], r"^error: --param dense: expected KEY=VALUE"),
    (["--target", "megamoe_sm90_mxfp4", "--ep-size", "3"], r"--ep-size 3: must divide the 8 routed experts"),
])
def test_flag_errors_exit_2_in_one_line(tiny_ckpt, tmp_path, args, match):
    r = run(tiny_ckpt, tmp_path / "out", *args)
    assert r.exit_code == 2, r.output
    assert re.search(match, r.stderr, re.M), r.stderr
    assert "Traceback" not in r.output


def test_help_has_examples_and_every_option_has_help():
    r = run("--help")
    assert r.exit_code == 0 and "Examples:" in r.output and "fimoe-convert demo" in r.output
    for cmd in ("convert", "inspect", "verify", "upload", "targets", "demo", "download"):
        text = run(cmd, "--help").output
        options = re.findall(r"^  (-[-\w, ]+?)(?:  +|\n)(.*)$", text, re.M)
        assert options, cmd
        for flag, helptext in options:
            assert helptext.strip() or flag.strip() in ("--help",), (cmd, flag)


def test_one_file_one_shard_plural(tiny_ckpt, tmp_path):
    r = run(tiny_ckpt, tmp_path / "out")
    assert r.exit_code == 0 and "converted to bf16 on cpu: 1 shard (0 kept)" in r.stdout


def test_reports_are_one_readable_line(tiny_ckpt, tmp_path):
    r = run(tiny_ckpt, tmp_path / "out", "--target", "fp8_block")
    assert r.exit_code == 0, r.output
    assert re.search(r"^fp8_block: 96 expert matrices, \d+ tiles, all exact$", r.stdout, re.M), r.stdout
    assert "{" not in r.stdout


def test_progress_without_a_terminal_is_plain_lines_and_the_error_comes_last(tiny_ckpt, tmp_path, monkeypatch):
    """stderr is not a terminal here: no \\r redraws, a plain line per interval; after Ctrl-C the error is the last
    line."""
    monkeypatch.setattr(console, "PLAIN_EVERY_S", 0.0)
    r = run(tiny_ckpt, tmp_path / "out", "--shard-size", "1MB")
    assert r.exit_code == 0
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr and len(lines) >= 3
    assert all(
        re.fullmatch(r"converting: [0-9.]+ [kMG]?B of [0-9.]+ MB \(\d+%\), [0-9.]+ [kMG]?B/s"
                     r"(, about [0-9.]+ (s|min|h) left)?", ln)
        for ln in lines
    ), lines
    assert lines[-1].startswith("converting: ") and "(100%)" in lines[-1]

    import fimoe_convert.conversion as conv

    real = conv.convert

    def interrupted(*a, progress, **kw):
        def stop(done, total):
            progress(done, total)
            if done > total // 2:
                raise KeyboardInterrupt
        return real(*a, progress=stop, **kw)

    monkeypatch.setattr(conv, "convert", interrupted)
    r = run(tiny_ckpt, tmp_path / "out2", "--shard-size", "1MB")
    assert r.exit_code == 130
    assert r.stderr.splitlines()[-1] == ("error: interrupted (SIGINT); finished shards are kept: run the same command "
                                          "with --resume")


def test_only_rank_0_prints(tiny_ckpt, tmp_path):
    r = run(tiny_ckpt, tmp_path / "out", RANK="1")
    assert r.exit_code == 0 and r.output == ""


@pytest.mark.parametrize("flag, expect", [("-v", ["plan: 1 shard(s)", "writing 1 shard(s) on"]),
                                          ("-vv", ["plan: 1 shard(s)"])])
def test_verbose_shows_the_steps(tiny_ckpt, tmp_path, flag, expect):
    r = run(tiny_ckpt, tmp_path / "out", flag)
    assert r.exit_code == 0
    for text in expect:
        assert f"fimoe-convert: {text}" in r.stderr, r.stderr
    assert "fimoe-convert: plan" not in run(tiny_ckpt, tmp_path / "quiet").stderr


def test_verify_deep_blames_a_wrong_src_not_the_output(bf16_out, tiny_ckpt, tmp_path):
    from fimoe_convert.testing import make_checkpoint

    other = make_checkpoint(tmp_path / "other", "tiny", seed=7)
    r = run("verify", bf16_out, "--deep", "--src", other)
    assert r.exit_code == 1
    assert re.search(
        rf"^error: --src {re.escape(str(other))}: is not the checkpoint {re.escape(str(bf16_out))} was "
        r"converted from \(model-00001-of-\d+\.safetensors: \d+ bytes, sha256 [0-9a-f]{16}; the output was "
        r"converted from \d+ bytes, sha256 [0-9a-f]{16}.*\); pass the original with --src PATH$",
        r.stderr,
        re.M,
    ), r.stderr
    assert run("verify", bf16_out, "--deep", "--src", tiny_ckpt).exit_code == 0


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _rename_source(out: Path, spec: str) -> None:
    m = json.loads((out / "fimoe-manifest.json").read_text())
    m["source"]["spec"] = spec
    (out / "fimoe-manifest.json").write_text(json.dumps(m))


# verify OUT --deep with no --src: (OUT, {folder: change made to its copy of the source}, what it says). The manifest
# records the source by name only ('ckpt'); the folders of that name tried: next to OUT, here, in demo-out.
SHARD = "model-00001-of-00004.safetensors"
FOUND = [
    ("work/out", {"work/ckpt": None}, r"; 8 units re-derived from the source match \(source: work/ckpt, found next "
     r"to OUT\)$"),
    ("elsewhere/out", {"ckpt": None}, r"\(source: ckpt, found in the current directory\)$"),
    ("out", {"demo-out/ckpt": None}, r"\(source: demo-out/ckpt, found in the demo's folder\)$"),
    ("work/out", {"work/ckpt": _flip_last_byte, "ckpt": None}, r"\(source: ckpt, found in the current directory\)$"),
]
REFUSED = [
    ("work/out", {}, r"; tried work/ckpt, next to OUT: no such folder; ckpt, in the current directory: no such "
     r"folder; demo-out/ckpt, in the demo's folder: no such folder; pass --src PATH$"),
    ("work/out", {"work/ckpt": _flip_last_byte}, rf"; tried work/ckpt, next to OUT: {SHARD}: (\d+) bytes, sha256 "
     r"[0-9a-f]{16}, the output was converted from \1 bytes, sha256 [0-9a-f]{16}; ckpt, in the current directory: "
     r"no such folder; demo-out/ckpt, in the demo's folder: no such folder; pass --src PATH$"),
    ("work/out", {"work/ckpt": lambda p: p.write_bytes(p.read_bytes() + b" ")},
     rf"; tried work/ckpt, next to OUT: {SHARD}: (\d+) bytes, the output was converted from (?!\1)\d+; ckpt, "),
    ("work/out", {"work/ckpt": Path.unlink}, rf"; tried work/ckpt, next to OUT: {SHARD}: No such file or directory; "),
    ("work/out", {"work/ckpt": None, "rename": lambda out: _rename_source(out, "../ckpt")},
     r"^error: verify --deep: the manifest records the source as '\.\./ckpt', a folder named relative to where the "
     r"conversion ran \(an output names no path of its machine\), not a folder name; pass --src PATH$"),
]


def _lay_out(tiny_ckpt, bf16_out, root: Path, out: str, folders: dict) -> Path:
    """bf16_out copied to root/out and the source copied to each folder, changed (a shard) as the table says."""
    shutil.copytree(bf16_out, root / out)
    for folder, change in folders.items():
        if folder == "rename":
            change(root / out)
            continue
        shutil.copytree(tiny_ckpt, root / folder)
        if change:
            change(root / folder / SHARD)
    return root / out


@pytest.mark.parametrize("out, folders, match", FOUND, ids=["next-to-out", "cwd", "demo-out", "wrong-then-cwd"])
def test_verify_deep_finds_the_source_by_its_recorded_name_and_says_which(tiny_ckpt, bf16_out, tmp_path, monkeypatch,
                                                                          out, folders, match):
    _lay_out(tiny_ckpt, bf16_out, tmp_path, out, folders)
    monkeypatch.chdir(tmp_path)
    r = run("verify", out, "--deep")
    assert r.exit_code == 0, r.output
    assert re.search(match, r.stdout.strip()), r.stdout


@pytest.mark.parametrize("out, folders, match", REFUSED,
                         ids=["none", "other-bytes", "other-size", "file-missing", "name-not-a-folder-name"])
def test_verify_deep_names_each_folder_tried_and_why_it_was_refused(tiny_ckpt, bf16_out, tmp_path, monkeypatch, out,
                                                                    folders, match):
    """A folder of the recorded name is used only when its files' sizes and sha256 are the manifest's; else --src."""
    _lay_out(tiny_ckpt, bf16_out, tmp_path, out, folders)
    monkeypatch.chdir(tmp_path)
    r = run("verify", out, "--deep")
    assert r.exit_code == 2, r.output
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: verify --deep: the manifest records the source as ") and re.search(match, line), line
    r = run("verify", out, "--deep", "--src", tiny_ckpt)
    assert r.exit_code == 0 and r.stdout.rstrip().endswith("units re-derived from the source match"), r.output


def test_upload_with_swapped_arguments_says_so(bf16_out):
    r = run("upload", "me/my-model", bf16_out, "--dry-run")
    assert r.exit_code == 2
    assert "did you swap them? The command is `fimoe-convert upload OUT REPO_ID`" in r.stderr


def test_an_unexpected_failure_is_one_line(tiny_ckpt, tmp_path, monkeypatch):
    import fimoe_convert.conversion as conv

    def broken(*a, **kw):
        raise RuntimeError("disk controller\nexploded")

    monkeypatch.setattr(conv, "convert", broken)
    r = run(tiny_ckpt, tmp_path / "out")
    assert r.exit_code == 1
    assert r.stderr == ("error: RuntimeError: disk controller exploded; this is not a known input problem: run again "
                        "with FIMOE_DEBUG=1 for the traceback and report it\n")


def test_targets_lists_engines_and_suggestions():
    r = run("targets")
    assert r.exit_code == 0
    assert "loads in: transformers; vLLM;" in r.stdout
    assert "suggested by GPU: 9.0 (H100/H200): megamoe_sm90_mxfp4, sm90_fp8_mxfp4_bf16_pull_cutedsl" in r.stdout
    assert json.loads(run("targets", "--json").stdout)[0]["engines"]


@pytest.mark.parametrize("target, missing, match", [
    ("megamoe_sm90_mxfp4", "flashinfer",
     r"^error: Python package 'flashinfer' \(needed by --target megamoe_sm90_mxfp4\): "
                                         r"not installed here; pip install 'flashinfer-python>=0\.7\.4'$"),
    ("sm90_fp8_fp8_bf16_pull_cutedsl", "flashinfer", r"^error: Python package 'flashinfer' \(needed by --target "
                                                     r"sm90_fp8_fp8_bf16_pull_cutedsl\): .*flashinfer-python>="),
    ("sm100_fp8_fp4_bf16_deepgemm", "deep_gemm", r"Python package 'deep_gemm' \(needed by --target "
     r"sm100_fp8_fp4_bf16_deepgemm\): not installed here; install a DeepGEMM build"),
])
def test_a_target_whose_package_is_missing_says_what_to_install_in_one_line(tiny_ckpt, tmp_path, monkeypatch, target,
                                                                            missing, match):
    """An environment problem: exit 1, and a pip line that works however fimoe-convert was installed."""
    from fimoe_convert.targets import rules

    present = rules.present
    monkeypatch.setattr(rules, "present", lambda m: m != missing and present(m))
    r = run(tiny_ckpt, tmp_path / "out", "--target", target, "--arch", "10.0" if "sm100" in target else "9.0")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert any(re.search(match, line) for line in r.stderr.splitlines()), r.stderr
    assert not (tmp_path / "out").exists()


def test_ci_runs_the_readme_set_up_commands_as_written():
    """The README opens with two set-up commands (the demo, the test suite); `.ci/run` runs both, verbatim."""
    root = Path(__file__).resolve().parents[2]
    blocks = [body for fence, body in re.findall(r"^(```\w*)\n(.*?)\n```$", (root / "README.md").read_text(),
                                                 re.S | re.M) if fence == "```"]  # plain fences: commands
    demo, suite = blocks[0], blocks[1]
    assert demo.endswith("\nfimoe-convert demo") and suite.endswith("\npython3 -m pytest -q"), blocks[:2]
    for block in (demo, suite):  # a torch already there (a GPU host's) is kept; else a venv, CPU torch first
        assert block.startswith("python3 -c 'import torch' 2>/dev/null || { python3 -m venv --system-site-packages "
                                ".venv && . .venv/bin/activate &&\n  python3 -m pip install torch==2.13.0 "
                                "--extra-index-url https://download.pytorch.org/whl/cpu; }\n"), block
    # the FlashInfer extra of the torch kept or installed by the first line (scripts/flashinfer_extra.py)
    assert demo.splitlines()[2] == 'python3 -m pip install -e ".[$(python3 scripts/flashinfer_extra.py)]"', demo
    assert suite.splitlines()[2] == 'python3 -m pip install -e ".[test,$(python3 scripts/flashinfer_extra.py)]"', suite
    ci = [line for line in (root / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    body = "\n".join(ci[ci.index("set -euo pipefail") + 2:])  # after `set` and `cd`: the README's lines only
    assert body == f"{suite}\n{demo}", body


def _flashinfer_extra():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "flashinfer_extra.py"
    spec = importlib.util.spec_from_file_location("flashinfer_extra", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cuda, extra, note", [
    (None, "flashinfer", None),
    ("12.8", "flashinfer-cu12", None),
    ("12.6", "flashinfer-cu12", None),
    ("13.0", "flashinfer-cu13", None),
    ("11.8", "flashinfer", r"^torch here is built for CUDA 11\.8; fimoe-convert has extras for CUDA 12 and 13 only, "
                           r"so \[flashinfer\] \(FlashInfer's own choice, cuda-python 13\)$"),
])
def test_the_set_up_takes_the_flashinfer_extra_of_torchs_cuda(cuda, extra, note):
    """torch.version.cuda -> the extra the README's set-up installs; a CPU torch gets FlashInfer's own choice."""
    got, said = _flashinfer_extra().extra_for(cuda)
    assert got == extra
    assert (said is None) if note is None else re.fullmatch(note, said), said


def test_each_cuda_extra_holds_cuda_python_to_its_major():
    """pyproject's extras named by scripts/flashinfer_extra.py: FlashInfer (its extra of that CUDA) and cuda-python
    of that major; `flashinfer` stays FlashInfer alone (the Dockerfile's default)."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    by_major = _flashinfer_extra().BY_MAJOR
    assert {n: extras.get(n) for n in by_major.values()} == {
        f"flashinfer-cu{m}": [f"flashinfer-python[cu{m}]>=0.7.4", f"cuda-python=={m}.*"] for m in by_major}
    assert extras["flashinfer"] == ["flashinfer-python>=0.7.4"]


@pytest.mark.parametrize("args, label", [
    (["verify", "{out}"], "verifying"),
    (["verify", "{out}", "--deep", "--src", "{src}"], "verifying"),
    (["upload", "{out}", "org/name", "--dry-run"], "checking OUT"),
    (["{src}", "{out}", "--resume"], "checking kept shards"),
])
def test_every_long_step_shows_progress(tiny_ckpt, bf16_out, tmp_path, monkeypatch, args, label):
    """The steps that hash whole folders print plain progress lines with a rate (no terminal here), then their
    result."""
    monkeypatch.setattr(console, "PLAIN_EVERY_S", 0.0)
    out = tmp_path / "out"
    shutil.copytree(bf16_out, out)
    r = run(*[a.format(out=out, src=tiny_ckpt) for a in args], HF_TOKEN="hf_test", HF_HUB_OFFLINE="1")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(f"{label}: ")]
    assert lines and re.fullmatch(rf"{label}: [0-9.]+ [kMG]?B of [0-9.]+ MB \(100%\), [0-9.]+ [kMG]?B/s", lines[-1]), \
        r.stderr


def test_the_docs_link_only_to_files_of_this_repository(tmp_path):
    """README.md and docs/*.md: every relative link and image resolves inside the repository, no external links;
    the checker itself fails on a broken one."""
    root = Path(__file__).resolve().parents[2]
    check = [sys.executable, str(root / "scripts" / "check_doc_links.py")]
    r = subprocess.run([*check, str(root)], capture_output=True, text=True)
    assert r.returncode == 0 and re.search(r"relative links resolve, 0 broken, 0 external$", r.stdout), r.stdout
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[a](docs/nope.md) [b](../shared/DESIGN.md) [c](https://example.com)\n")
    r = subprocess.run([*check, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout.endswith("1 files, 0 relative links resolve, 2 broken, 1 external\n"), (
        r.stdout
    )


@pytest.mark.slow
def test_the_demo_makes_converts_verifies_and_summarizes(tmp_path):
    """The README's first command ends in `fimoe-convert demo`: a tiny checkpoint, BF16 and megamoe, verify --deep."""
    r = run("demo", "--workdir", tmp_path / "demo")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"made tiny DeepSeek V4 checkpoint .*/src \([0-9.]+ MB\)", lines[0]), lines
    assert re.fullmatch(r"converted to bf16: 1 shard, [0-9.]+ MB in [0-9.]+ s; verify --deep: ok \(7 files, 8 units "
                        r"re-derived\)", lines[1]), lines
    assert re.fullmatch(r"converted to megamoe_sm90_mxfp4: \d+ shards, .*; verify --deep: ok \(\d+ files, 8 units "
                        r"re-derived\)", lines[2]), lines
    assert lines[-1].startswith("demo passed in ") and lines[-1].count("(ok)") == 2, lines
