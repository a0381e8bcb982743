"""The CLI's front door: presets by name, errors that say what to do, and the waits that say what they wait for."""

import json
import re

import pytest
from click.testing import CliRunner

from fimoe_convert.cli import main
from fimoe_convert.files.preset import PRESETS_DIR, preset_names


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_presets_are_package_data_listed_by_targets():
    assert preset_names() == sorted(p.stem for p in PRESETS_DIR.glob("*.toml")) and len(preset_names()) >= 6
    r = run("targets")
    assert r.exit_code == 0, r.output
    assert "presets (--config NAME):" in r.output
    assert re.search(r"^  v4_flash_fp8_block_vllm +V4-Flash: --target fp8_block --param scale_dtype=f32$", r.output,
                     re.M), r.output


@pytest.mark.parametrize("config", ["v4_flash_fp8_block_vllm", "configs/v4_flash_fp8_block_vllm.toml"])
def test_a_preset_by_name_or_by_its_path_in_the_repository(tiny_ckpt, tmp_path, config):
    r = run(tiny_ckpt, tmp_path / "out", "--config", config, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["target"] == "fp8_block"


@pytest.mark.parametrize("config, match", [
    ("v4_flash_fp8_vllm", r"did you mean v4_flash_fp8_block_vllm or v4_flash_fp8_block_sglang\?"),
    ("v4_pro", r"did you mean v4_pro_bf16 or v4_pro_megamoe_sm90_ep8\?"),
    ("nothing_like_it", r"the presets are v4_flash_fp8_block_sglang, "),
])
def test_an_unknown_preset_gets_a_suggestion(tiny_ckpt, tmp_path, config, match):
    r = run(tiny_ckpt, tmp_path / "out", "--config", config, "--dry-run")
    assert r.exit_code == 2, r.output
    assert re.search(rf"^error: --config {config}: no such preset or file; .*{match}", r.output), r.output


def test_a_preset_for_another_model_is_refused(tiny_ckpt, tmp_path):
    r = run(tiny_ckpt, tmp_path / "out", "--config", "v4_pro_bf16", "--dry-run")
    assert r.exit_code == 1, r.output
    assert re.fullmatch(r"error: --config v4_pro_bf16: made for model V4-Pro, but SRC \S+ is a V4-Flash checkpoint "
                        r"\(hidden \d+, \d+ experts\); pick a preset for V4-Flash \(fimoe-convert targets lists them\) "
                        r"or give the flags without --config\n", r.output), r.output
    assert not (tmp_path / "out").exists()


def test_target_on_the_command_line_drops_the_presets_params(tiny_ckpt, tmp_path, caplog):
    r = run(tiny_ckpt, tmp_path / "out", "--config", "v4_flash_fp8_block_vllm", "--target", "bf16", "-v",
            "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    assert "--target bf16: the --param values of --config v4_flash_fp8_block_vllm (for fp8_block) dropped: " \
           "{'scale_dtype': 'f32'}" in caplog.text


@pytest.fixture(scope="module")
def converted(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "out"
    r = run(tiny_ckpt, out, "--target", "fp8_block", "--param", "scale_dtype=f32", "-q")
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("complete, says", [
    (True, r"it holds a complete conversion \(--target fp8_block --param scale_dtype=f32, \d+ files\); pass "
           r"--overwrite to replace it, or choose an empty folder"),
    (False, r"it holds an unfinished conversion \(--target fp8_block --param scale_dtype=f32\); pass --resume with "
            r"those flags to finish it, --overwrite to replace it, or choose an empty folder"),
])
def test_out_not_empty_says_what_it_holds(tiny_ckpt, converted, tmp_path, complete, says):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(converted, out)
    manifest = out / "fimoe-manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "complete": complete}))
    r = run(tiny_ckpt, out)
    assert r.exit_code == 1, r.output
    assert re.fullmatch(rf"error: OUT {re.escape(str(out))}: is not empty; {says}\n", r.output), r.output


def test_a_missing_kernel_package_is_exit_1_with_a_pip_line_that_always_works(tiny_ckpt, tmp_path, monkeypatch):
    from fimoe_convert.targets import rules

    monkeypatch.setattr(rules, "present", lambda m: False)
    r = run(tiny_ckpt, tmp_path / "out", "--target", "megamoe_sm90_mxfp4", "--arch", "9.0", "--dry-run")
    assert r.exit_code == 1, r.output
    assert ("Python package 'flashinfer' (needed by --target megamoe_sm90_mxfp4): not installed here; "
            "pip install 'flashinfer-python>=0.7.4'") in r.output.splitlines()[-1], r.output


def test_targets_lists_each_targets_params():
    r = run("targets")
    assert r.exit_code == 0, r.output
    assert re.search(r"^ +params: --param scale_dtype=e8m0\|f32 \(default e8m0\)$", r.output, re.M), r.output
    assert re.search(r"^ +params: --param dense=fp8\|bf16 \(default fp8\)$", r.output, re.M), r.output


@pytest.mark.parametrize("target, meant", [
    ("megamoe", "'megamoe_sm90_mxfp4'"),
    ("fp8", "'fp8_block' or "),
    ("bf61", "'bf16'"),
])
def test_an_unknown_target_gets_a_suggestion(tmp_path, target, meant):
    r = run(tmp_path / "src", tmp_path / "out", "--target", target)
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: --target {target}: unknown target; did you mean {meant}"), r.output


@pytest.mark.slow
def test_progress_lines_on_a_terminal_of_width_0(tiny_ckpt, tmp_path):
    """A fresh pty reports 0 columns, where a tqdm bar prints nothing: plain progress lines instead."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    assert os.get_terminal_size(slave).columns == 0
    p = subprocess.run([sys.executable, "-m", "fimoe_convert", str(tiny_ckpt), str(tmp_path / "out")],
                       stdout=subprocess.PIPE, stderr=slave, env={**os.environ, "COLUMNS": "0"}, timeout=300)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert p.returncode == 0, err
    assert re.search(rb"^converting: [\d.]+ \w?B of [\d.]+ \w?B \(100%\)", err, re.M), err


def test_dry_run_says_what_it_times_before_it_does(tiny_ckpt, tmp_path):
    r = run(tiny_ckpt, tmp_path / "out", "--target", "fp8_block", "--device", "cpu", "--dry-run")
    assert r.exit_code == 0, r.output
    assert re.search(r"^timing \d+ sample units? \((\S+, [\d.]+ \w?B(, )?)+\) of --target fp8_block on cpu to "
                     r"estimate the "
                     r"conversion's time\.\.\.$", r.stderr, re.M), r.stderr
    assert r.stdout.startswith("plan for --target fp8_block on cpu:"), r.stdout
    quiet = run(tiny_ckpt, tmp_path / "out", "--target", "fp8_block", "--device", "cpu", "--dry-run", "--json")
    assert quiet.exit_code == 0 and "timing" not in quiet.stderr, quiet.output


@pytest.mark.parametrize("flags, match", [
    (["--ep-size", "0"], r"--ep-size 0: must be 1 or more"),
    (["--shard-size", "lots"], r"--shard-size: cannot read size 'lots'"),
    (["--target", "megamoe"], r"--target megamoe: unknown target; did you mean 'megamoe_sm90_mxfp4'"),
    (["--resume", "--overwrite"], r"--resume and --overwrite: pass one of them"),
])
def test_flags_are_checked_before_torch_is_imported(tmp_path, flags, match):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "fimoe_convert", str(tmp_path / "src"),
                        str(tmp_path / "out"), *flags], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert re.search(rf"^error: {match}", p.stderr, re.M), p.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "fimoe_convert.cli" in imported and "torch" not in imported


@pytest.fixture
def hub_answering(request):
    """A Hub endpoint that answers every request with `status` and X-Error-Code `code` (as the Hub does for a repo
    it has not, or a private one)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    status, code = request.param

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again when the with ends: connection refused


NO_REPO = (r"error: SRC 'nobody/no-such-repo': no such repo on the Hub \(or it is private or gated: log in with "
           r"`hf auth login` or set HF_TOKEN\); check the repo id")


def hub_cli(endpoint, tmp_path):
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "0"}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "fimoe_convert", "nobody/no-such-repo", str(tmp_path / "out"),
                        "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    return p, time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.parametrize("hub_answering", [(404, "RepositoryNotFound"), (401, "RepositoryNotFound"), (404, None)],
                         indirect=True)
def test_a_repo_the_hub_has_not_fails_in_one_line_within_seconds(hub_answering, tmp_path):
    p, secs = hub_cli(hub_answering, tmp_path)
    assert p.returncode == 1 and secs < 10, (secs, p.stderr)
    assert re.fullmatch(NO_REPO + "\n", p.stderr), p.stderr


@pytest.mark.slow
def test_no_network_fails_in_one_line_within_seconds_naming_offline_and_download(tmp_path):
    endpoint = closed_port()
    p, secs = hub_cli(endpoint, tmp_path)
    assert p.returncode == 1 and secs < 10, (secs, p.stderr)
    assert re.fullmatch(
        rf"error: SRC 'nobody/no-such-repo': cannot reach the Hub at {re.escape(endpoint)} \(no network\? "
        r"\w+\); pass --offline to use the local cache, or run `fimoe-convert download SRC` where "
        r"there is network\n",
        p.stderr,
    ), p.stderr


def test_a_missing_src_folder_is_refused_before_torch_is_imported(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "fimoe_convert", str(tmp_path / "no" / "src"),
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert re.search(rf"^error: SRC '{re.escape(str(tmp_path / 'no' / 'src'))}': no such folder \('no' is not in "
                     rf"{re.escape(str(tmp_path))}/\); ", p.stderr, re.M), p.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "fimoe_convert.files.sources.hub" in imported and "torch" not in imported


@pytest.mark.slow
def test_verify_deep_checks_the_source_before_hashing_out(bf16_out_of, tiny_ckpt, tmp_path):
    """A wrong --src is said before any byte of OUT is hashed (on a large output that took minutes), and blamed as
    --src; the right one still verifies."""
    from fimoe_convert import verify
    from fimoe_convert.errors import InputError
    from fimoe_convert.testing import make_checkpoint

    out = bf16_out_of("5GB")
    other = make_checkpoint(tmp_path / "other", "tiny", seed=7)
    hashed = []
    wrong_src = rf"^--src {re.escape(str(other))}: is not the checkpoint .* was converted from"
    with pytest.raises(InputError, match=wrong_src):
        verify(str(out), deep=True, src=str(other), progress=lambda done, total: hashed.append(done))
    assert hashed == []
    ver = verify(str(out), deep=True, src=str(tiny_ckpt), progress=lambda done, total: hashed.append(done))
    assert ver.problems == []
    assert hashed  # the same call with the right source does hash OUT
