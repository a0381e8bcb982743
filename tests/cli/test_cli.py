"""The command line: exit codes, one-line errors without tracebacks, --json, dry run, inspect, targets."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fimoe_convert.cli import main
from fimoe_convert.testing import PRESETS


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_convert_then_verify_json(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    r = run(str(tiny_ckpt), str(out), "--target", "bf16", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["target"] == "bf16" and summary["shards"] == 1 and summary["bytes_written"] > 0
    r = run("verify", str(out), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["problems"] == []
    card = (out / "README.md").read_text()
    assert "fimoe-convert SRC OUT\n" in card


def test_the_flags_order_does_not_change_the_output(tiny_ckpt, tmp_path):
    """The model card shows the command with its flags in one order, whatever order they were typed in."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert (
        run(str(tiny_ckpt), str(a), "--shard-size", "3MB", "--ep-size", "2", "--target", "fp8_block", "-q").exit_code
        == 0
    )
    assert (
        run(str(tiny_ckpt), str(b), "--target", "fp8_block", "--ep-size", "2", "--shard-size", "3MB", "-q").exit_code
        == 0
    )
    assert "fimoe-convert SRC OUT --target fp8_block --ep-size 2 --shard-size 3MB\n" in (a / "README.md").read_text()
    assert {p.name: p.read_bytes() for p in a.iterdir()} == {p.name: p.read_bytes() for p in b.iterdir()}


def test_dry_run_prints_plan(tiny_ckpt, tmp_path):
    r = run(str(tiny_ckpt), str(tmp_path / "out"), "--dry-run", "--shard-size", "7MB", "--device", "cpu")
    assert r.exit_code == 0
    assert "plan for --target bf16 on cpu: 3 shards" in r.stdout and "free disk" in r.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, code, match", [
    (["--target", "nope"], 2, r"^error: --target nope: unknown target; known: bf16"),
    (["--target", "bf61"], 2, r"^error: --target bf61: unknown target; did you mean 'bf16'\? known: bf16"),
    (["--shard-size", "lots"], 2, r"^error: --shard-size: cannot read size 'lots'"),
    (["--ep-size", "3"], 2, r"^error: --ep-size 3: must divide the 8 routed experts"),
    (["--target", "megamoe_sm90_mxfp4", "--arch", "10.0"], 2,
     r"^error: --arch 10\.0: --target megamoe_sm90_mxfp4 runs on"),
    (["--resume", "--overwrite"], 2, r"^error: --resume and --overwrite: pass one of them, not both"),
])
def test_bad_flags(tiny_ckpt, tmp_path, args, code, match):
    r = run(str(tiny_ckpt), str(tmp_path / "out"), *args)
    assert r.exit_code == code
    assert "Traceback" not in r.output
    import re
    assert re.search(match, r.stderr, re.M), r.stderr


def test_bad_input_exit_1_one_line(tiny_copy, tmp_path):
    (tiny_copy / "config.json").write_text('{"model_type": "llama"}')
    r = run(str(tiny_copy), str(tmp_path / "out"))
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "model_type is 'llama'" in r.stderr


def test_verify_names_the_bad_file(tiny_ckpt, tmp_path):
    out = tmp_path / "out"
    assert run(str(tiny_ckpt), str(out), "-q").exit_code == 0
    shard = next(out.glob("model-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = run("verify", str(out))
    assert r.exit_code == 1 and shard.name in r.stderr and "sha256" in r.stderr


def test_inspect_and_targets(tiny_ckpt):
    r = run("inspect", str(tiny_ckpt))
    assert r.exit_code == 0
    assert (
        f"deepseek_v4 (v4), experts fp4, hidden 256, moe_intermediate {PRESETS['tiny'].inter}, 8 experts top-2, "
        "3 layers + 1 MTP" in r.stdout
    )
    assert "routed expert I8: 96" in r.stdout and "bf16: fits" in r.stdout
    r = run("targets", "--json")
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["bf16"]["available_here"] is True
    assert "transformers" in rows["bf16"]["engines"] and "vLLM" in rows["fp8_block"]["engines"]


@pytest.mark.parametrize("target, says", [
    ("bf16", "a fimoe-convert output for --target bf16, EP size 1, complete"),
    ("megamoe_sm90_mxfp4", "a fimoe-convert output for --target megamoe_sm90_mxfp4 (FlashInfer kernel "
                           "megamoe_sm90_mxfp4), EP size 1, complete"),
])
def test_inspect_describes_a_converted_output(tiny_ckpt, tmp_path, target, says):
    """Not 'routed-expert tensors missing': the folder is recognized from its manifest."""
    out = tmp_path / "out"
    assert run(str(tiny_ckpt), str(out), "--target", target, "--allow-lossy", "-q").exit_code == 0
    r = run("inspect", str(out))
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"{out}: {says}\nconverted from {tiny_ckpt.name} by fimoe-convert 0.1.0: ")
    assert json.loads(run("inspect", str(out), "--json").stdout)["converted"] is True


@pytest.mark.slow
def test_traceback_only_with_debug(tiny_copy, tmp_path):
    (tiny_copy / "config.json").write_text('{"model_type": "llama"}')
    cmd = [sys.executable, "-m", "fimoe_convert", str(tiny_copy), str(tmp_path / "out")]
    plain = subprocess.run(cmd, capture_output=True, text=True)
    debug = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "FIMOE_DEBUG": "1"})
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert debug.returncode == 1 and "Traceback" in debug.stderr
