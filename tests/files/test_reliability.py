"""Reliability: crash-resume, bad inputs through the CLI, header fuzzing, secrets, integrity.

The long versions are scripts: scripts/reliability/crash_resume.py (20 SIGKILLs), scripts/reliability/fuzz_headers.py
(100,000 inputs, hypothesis or atheris), scripts/reliability/flip_bytes.py (100 flips); docs/RELIABILITY.md
says what each shows. Every bad input here goes through the CLI and must give: the exit code,
exactly one `error: ...` line naming the file or tensor, no traceback, the source untouched and
no complete-looking OUT."""

import errno
import hashlib
import http.server
import importlib.util
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import test_source as damage
from click.testing import CliRunner
from helpers.hub_files import QuietServer

from fimoe_convert.cli import main
from fimoe_convert.errors import FimoeError
from fimoe_convert.files import names
from fimoe_convert.files.output import atomic
from fimoe_convert.files.safetensors import header as st_header, writer as st_writer
from fimoe_convert.files.safetensors.header import parse_header
from fimoe_convert.testing import make_checkpoint, seed_hub_cache

ROOT = Path(__file__).resolve().parents[2]
INDEX = "model.safetensors.index.json"
MANIFEST = "fimoe-manifest.json"
REPO = "deepseek-ai/DeepSeek-V4-Tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
INTERRUPTED = "error: interrupted (SIGINT); finished shards are kept: run the same command with --resume"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"_fimoe_script_{name}", ROOT / "scripts" / "reliability" / f"{name}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def child_env(**extra) -> dict[str, str]:
    """Environment for child processes: this checkout's package first, whatever the installed one points at."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {k: v for k, v in env.items() if v is not None}


def cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def tree_hash(folder: Path, skip: str | None = None) -> dict:
    """Every entry under `folder` (but `skip`): file sha256, link target, or dir; with its mode (links not followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        if Path(dirpath) == folder and skip in dirnames:
            dirnames.remove(skip)
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(folder))] = ("link", os.readlink(p))
            elif p.is_file():
                out[str(p.relative_to(folder))] = ("file", st.st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[str(p.relative_to(folder))] = ("dir", st.st_mode)
    return out


def assert_not_complete(out: Path) -> None:
    if not out.is_dir():
        return
    assert not (out / INDEX).exists(), "a failed conversion left an index (a complete-looking OUT)"
    if (out / MANIFEST).exists():
        assert json.loads((out / MANIFEST).read_text())["complete"] is False
    assert not list(out.glob("*" + names.TMP_SUFFIX)), list(out.iterdir())


PROGRESS_LINE = re.compile(
    r"^[A-Za-z ]+: [\d.]+ [kMGT]?B of [\d.]+ [kMGT]?B \(\d+%\)"
)  # console.Progress without a tty


def refused(r, match: str, code: int = 1) -> str:
    """The CLI result `r` is exactly one `error:` line matching `match`, exit `code`, no traceback; the line."""
    assert r.exit_code == code, (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    lines = [line for line in r.stderr.splitlines() if not PROGRESS_LINE.match(line)]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert re.search(match, lines[0]), (match, lines[0])
    return lines[0]


def assert_refused(r, out: Path, match: str, code: int = 1) -> None:
    refused(r, match, code)
    assert_not_complete(out)


# ------------------------------------------------------------------------------------------ crash-resume


@pytest.mark.slow
def test_crash_resume_three_sigkills(tmp_path):
    """The CI version of scripts/reliability/crash_resume.py: 3 SIGKILLs of the real CLI (while a shard is written,
    while the manifest is rewritten, while a source shard is read), then --resume: byte-identical to the reference."""
    cr = _script("crash_resume")
    c = cr.campaign(kills=3, seed=1, workdir=tmp_path, modes=("shard", "manifest", "read"), in_process=True,
                    log=lambda *a: None)
    assert c["problems"] == [], c["kills_detail"]
    assert c["kills"] == 3 and c["resumes_ok"] == 3
    assert c["verify_passed_on_torn"] == 0 and c["complete_early"] == 0
    assert c["torn"] >= 2, c["phases"]  # the kill points fall inside the conversion, not after it


# ---------------------------------------------------------------------------------------------- bad inputs


def holey_offsets(src: Path) -> None:
    """8 spare bytes between the first two tensors of a shard, later offsets shifted past them."""
    p = src / "model-00002-of-00004.safetensors"
    data = p.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    first_end = header[names[0]]["data_offsets"][1]
    for k in names[1:]:
        header[k]["data_offsets"] = [o + 8 for o in header[k]["data_offsets"]]
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    payload = data[8 + n:]
    p.write_bytes(struct.pack("<Q", len(body)) + body + payload[:first_end] + b"\0" * 8 + payload[first_end:])


def unknown_model_type(src):
    damage._config(src, model_type="deepseek_v5")


def config_field_missing(src):
    damage._config(src, moe_intermediate_size=None)


def config_contradicts_tensors(src):
    damage._config(src, moe_intermediate_size=2 * damage.TINY.inter)


def index_names_dot(src):  # found by scripts/reliability/fuzz_headers.py: crashed with IndexError
    idx = damage._index(src)
    idx["weight_map"]["embed.weight"] = "."
    damage._write_index(src, idx)


def index_names_nul(src):  # found by the fuzzer: ValueError (embedded null byte) from Path.resolve
    idx = damage._index(src)
    idx["weight_map"]["embed.weight"] = "a\0b.safetensors"
    damage._write_index(src, idx)


def symlink_loop(src):  # found by the fuzzer: RuntimeError from Path.resolve on Python < 3.13
    os.symlink("loop.safetensors", src / "loop.safetensors")
    idx = damage._index(src)
    idx["weight_map"]["embed.weight"] = "loop.safetensors"
    damage._write_index(src, idx)


def header_big_int(src):  # found by the fuzzer: ValueError (int > 4300 digits) escaped json.loads
    p = src / "model-00002-of-00004.safetensors"
    body = b'{"x":' + b"9" * 5000 + b"}"
    p.write_bytes(struct.pack("<Q", len(body)) + body + p.read_bytes()[8:])


def header_deep_nesting(src):  # found by the fuzzer: RecursionError escaped json.loads
    p = src / "model-00002-of-00004.safetensors"
    body = b"[" * 100_000 + b"]" * 100_000
    p.write_bytes(struct.pack("<Q", len(body)) + body)


def header_dtype_not_a_string(src):  # found by the fuzzer: TypeError (unhashable list)
    def edit(h):
        h[f"{damage.EXPERT}.weight"]["dtype"] = ["I8"]
    damage._rewrite_header(damage._shard_of(src, f"{damage.EXPERT}.weight"), edit)


def scale_byte_255(src):
    name = "layers.2.ffn.experts.5.w2.scale"
    shard = damage._shard_of(src, name)
    info = st_header.read_header(shard).tensors[name]
    data = bytearray(shard.read_bytes())
    data[info.start + 3] = 255
    shard.write_bytes(bytes(data))


BAD_INPUTS = [(f, m) for f, m in damage.CASES] + [
    (holey_offsets, r"model-00002-of-00004\.safetensors: tensor '.*' at data offset \d+ leaves a hole of 8 bytes"),
    (unknown_model_type, r"config\.json.*model_type is 'deepseek_v5'; expected one of deepseek_v4, deepseek_v41"),
    (config_field_missing, r"config\.json.*moe_intermediate_size is None; expected a positive integer"),
    (
        config_contradicts_tensors,
        r"^error: 192 routed-expert tensors do not match config\.json, e\.g\. tensor "
        rf"'layers\.0\.ffn\.experts\.0\.w1\.weight': I8 \[{damage.TINY.inter}, {damage.TINY.hidden // 2}\], "
        rf"expected I8 \[{2 * damage.TINY.inter}, {damage.TINY.hidden // 2}\]",
    ),
    (index_names_dot, r"shard name '\.' is not a plain relative path"),
    (index_names_nul, r"shard name 'a\\x00b\.safetensors' is not a plain relative path"),
    (symlink_loop, r"shard 'loop\.safetensors' cannot be resolved"),
    (header_big_int, r"model-00002-of-00004\.safetensors: header is not valid JSON \(ValueError: Exceeds the limit"),
    (header_deep_nesting, r"model-00002-of-00004\.safetensors: header is not valid JSON \(RecursionError"),
    (header_dtype_not_a_string, r"tensor 'layers\.1\.ffn\.experts\.3\.w1\.weight': unknown dtype \['I8'\]"),
    (scale_byte_255, r"tensor 'layers\.2\.ffn\.experts\.5\.w2\.scale': 1 scale bytes are 255"),
]


@pytest.mark.parametrize("bad, match", BAD_INPUTS, ids=[b.__name__ for b, _ in BAD_INPUTS])
def test_bad_input_through_the_cli(tiny_copy, tmp_path, bad, match):
    bad(tiny_copy)
    before = tree_hash(tiny_copy.parent, skip="out")  # SRC, and what its links point to beside it
    out = tmp_path / "out"
    r = cli(tiny_copy, out, "--shard-size", "1MB", "-q")
    assert_refused(r, out, match)
    assert tree_hash(tiny_copy.parent, skip="out") == before, "the source changed"


def test_fp8_base_experts_for_an_fp4_target(tmp_path):
    src = make_checkpoint(tmp_path / "base", "tiny", expert_dtype="fp8", layers=1, mtp=0, shards=2)
    before = tree_hash(src)
    out = tmp_path / "out"
    r = cli(src, out, "--target", "megamoe_sm90_mxfp4", "--arch", "9.0", "-q")
    assert_refused(r, out, r"--target megamoe_sm90_mxfp4: consumes FP4 experts, but this checkpoint's experts are "
                           r"FP8 \(expert_dtype 'fp8'\); use --target bf16", code=2)  # a flag that does not fit: usage
    assert tree_hash(src) == before and not out.exists()


@pytest.mark.parametrize("where", ["inside", "equal"])
def test_out_inside_or_equal_to_src(tiny_copy, where):
    out = tiny_copy / "out" if where == "inside" else tiny_copy
    before = tree_hash(tiny_copy)
    r = cli(tiny_copy, out, "-q")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.output
    assert re.match(rf"error: OUT {re.escape(str(out))}: lies inside SRC", r.stderr), r.stderr
    assert tree_hash(tiny_copy) == before


@pytest.mark.parametrize("how", ["read-only-fs", "chmod", "access-denied"])
def test_out_not_writable(tiny_ckpt, tmp_path, monkeypatch, how):
    if how == "read-only-fs":  # a real read-only mount; works as root, where permission bits do not bind
        folder = Path("/proc/sys")
        if not folder.is_dir() or os.access(folder, os.W_OK):
            pytest.skip("no read-only mount at /proc/sys here")
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        if how == "chmod":
            if os.geteuid() == 0:
                pytest.skip("running as root: chmod 0o500 does not stop root (see read-only-fs and access-denied)")
            folder.chmod(0o500)
        else:  # as root: the check itself, with os.access answering as it would for another user
            real = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == folder
                                else real(p, mode, *a, **k))
    out = folder / "fimoe-out"
    try:
        r = cli(tiny_ckpt, out, "-q")
    finally:
        if how == "chmod":
            folder.chmod(0o700)
    assert_refused(r, out, rf"OUT {re.escape(str(out))}: {re.escape(str(folder))} is not writable; choose a folder")
    assert not out.exists()


class _FullDisk:
    """A file object whose writes fail with ENOSPC once the shared byte budget is spent (partial write first)."""

    def __init__(self, f, state):
        self._f, self._state = f, state

    def write(self, data):
        view = memoryview(data).cast("B")
        left = self._state["left"]
        if len(view) > left:
            self._f.write(view[:left // 4096 * 4096])  # O_DIRECT files take whole 4 KiB blocks only
            self._state["left"] = 0
            self._state["failed"] = True
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._state["left"] -= len(view)
        return self._f.write(view)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.mark.parametrize("victim, skip, budget, named", [
    # mid-shard, past the first: a lane writes two shards at once, and either open one may find the disk full
    pytest.param("model-", 0, 2_500_000, r"model-0000[2-9]-of-000\d\d\.safetensors", marks=pytest.mark.slow),
    pytest.param(MANIFEST, 3, 100, re.escape(MANIFEST), marks=pytest.mark.slow),  # the 4th manifest rewrite
    (INDEX, 0, 10, re.escape(INDEX)),  # while writing the final metadata
])
def test_disk_full(tiny_ckpt, tmp_path, monkeypatch, victim, skip, budget, named):
    """ENOSPC injected into the writer's file writes: a clean error naming the file and the next step, exit 1,
    temporary files removed, manifest not complete; once space is back, --resume completes and verifies."""
    state = {"left": budget, "skip": skip, "failed": False}
    real_open = open

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        name = Path(path).name
        if "w" in mode and name.endswith(names.TMP_SUFFIX) and name.startswith(victim):
            if state["skip"]:
                state["skip"] -= 1
                return f
            return _FullDisk(f, state)
        return f

    for module in (st_writer, atomic):  # shards; manifest and index
        monkeypatch.setattr(module, "open", fake_open, raising=False)
    before = tree_hash(tiny_ckpt)
    out = tmp_path / "out"
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "-q")
    assert state["failed"]
    assert_refused(r, out, rf"^error: {re.escape(str(out))}/{named}: cannot write \(the disk is full\); free space on "
                           rf"the disk holding {re.escape(str(out))}, then run the same command with --resume")
    monkeypatch.undo()
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "--resume", "--json")
    assert r.exit_code == 0, r.output
    assert victim != "model-" or json.loads(r.stdout)["shards_kept"] >= 1
    assert cli("verify", out).exit_code == 0
    assert tree_hash(tiny_ckpt) == before


def test_disk_full_in_one_of_three_writers(tiny_ckpt, tmp_path, monkeypatch):
    """--writers 3: ENOSPC in one lane stops all three; nothing complete-looking and no temporary file is
    left; --resume with one writer then completes a folder that verifies."""
    state = {"left": 1_500_000, "failed": False}
    real_open = open

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        name = Path(path).name
        return (
            _FullDisk(f, state) if "w" in mode and name.endswith(names.TMP_SUFFIX) and name.startswith("model-") else f
        )

    for module in (st_writer, atomic):  # shards; manifest and index
        monkeypatch.setattr(module, "open", fake_open, raising=False)
    out = tmp_path / "out"
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "--writers", "3", "-q")
    assert state["failed"]
    assert_refused(r, out, rf"^error: {re.escape(str(out))}/model-\d{{5}}-of-\d{{5}}\.safetensors: cannot write "
                           r"\(the disk is full\)")
    monkeypatch.undo()
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "--resume", "--writers", "1", "-q")
    assert r.exit_code == 0, r.output
    assert cli("verify", out).exit_code == 0


@pytest.mark.slow
def test_disk_full_on_a_real_tmpfs(tmp_path):
    """A real ENOSPC from the kernel: OUT on a small tmpfs (private mount namespace) that fills up mid-run."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "reliability" / "crash_resume.py"), "--enospc-tmpfs",
                        "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=120, env=child_env())
    res = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"skipped": p.stderr[-500:]}
    if res.get("skipped"):
        pytest.skip(f"no private tmpfs here: {res['skipped']}")
    assert res["problems"] == [], res
    assert (
        res["exit_code"] == 1 and res["stderr"].count("\n") == 1 and "cannot write (the disk is full)" in res["stderr"]
    )
    assert res["resume_exit_code"] == 0 and res["verify_exit_code"] == 0


def test_incomplete_hub_snapshot(tiny_ckpt, tmp_path):
    cache = tmp_path / "hub"
    snap = seed_hub_cache(tiny_ckpt, cache, REPO, COMMIT)
    (snap / "model-00003-of-00004.safetensors").unlink()  # the download stopped before this file's link
    before = tree_hash(cache)
    out = tmp_path / "out"
    r = cli(REPO, out, "--offline", "-q", env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert_refused(r, out, r"names shard 'model-00003-of-00004\.safetensors', which does not exist; "
                           r"the Hub snapshot is incomplete: run again without --offline")
    assert tree_hash(cache) == before and not out.exists()


@pytest.mark.parametrize("writers", ["1", "3"])
def test_ctrl_c_in_process_is_clean_and_resumable(tiny_ckpt, tmp_path, monkeypatch, writers):
    """KeyboardInterrupt raised from the progress callback, through the CLI: exit 130, one line, resumable."""
    import fimoe_convert.conversion as conv_mod

    real = conv_mod.convert

    def interrupted(*a, **kw):
        inner = kw["progress"]

        def progress(done, total):
            inner(done, total)
            if done > total // 2:
                raise KeyboardInterrupt

        return real(*a, **{**kw, "progress": progress})

    monkeypatch.setattr(conv_mod, "convert", interrupted)
    out = tmp_path / "out"
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "--writers", writers, "-q")
    assert r.exit_code == 130 and r.stderr == INTERRUPTED + "\n", (r.output, r.exception)
    assert_not_complete(out)
    assert "written" in json.loads((out / MANIFEST).read_text())["status"].values()
    assert cli("verify", out).exit_code == 1
    monkeypatch.undo()
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "--resume", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["shards_kept"] > 0
    assert cli("verify", out).exit_code == 0


def run_and_signal(src: Path, out: Path, signum: int) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the real CLI converting `src` into `out`, sent `signum` mid-conversion. The
    conversion proper takes ~0.2 s after ~2 s of start-up, so the child is frozen (SIGSTOP) as soon as its first
    manifest appears, checked to be mid-run, then signalled and continued; a run that got past its end before
    the freeze is tried again."""
    for _attempt in range(5):
        shutil.rmtree(out, ignore_errors=True)
        # SIG_DFL: a test run started in the background (`pytest &`, nohup) ignores SIGINT (SIGHUP), and children
        # inherit that
        proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", str(src), str(out), "--shard-size", "1MB",
                                 "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                                preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in
                                                    (signal.SIGINT, signal.SIGHUP)])
        t0 = time.monotonic()
        while proc.poll() is None and not (out / MANIFEST).exists() and time.monotonic() - t0 < 60:
            time.sleep(0.0005)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                mid_run = json.loads((out / MANIFEST).read_text())["complete"] is False and not (out / INDEX).exists()
            except (OSError, ValueError):
                mid_run = True  # the first manifest is being renamed into place
            if mid_run:
                os.kill(proc.pid, signum)
            os.kill(proc.pid, signal.SIGCONT)
            if mid_run:
                stdout, stderr = proc.communicate(timeout=60)
                return proc.returncode, stdout, stderr
        proc.communicate(timeout=60)
    pytest.fail("5 runs finished before they could be interrupted")


@pytest.mark.slow
def test_real_sigint_is_clean_and_resumable(tiny_ckpt, tmp_path):
    """SIGINT (Ctrl-C) to the real CLI mid-conversion: exit 130, one line, resumable."""
    out = tmp_path / "out"
    code, stdout, stderr = run_and_signal(tiny_ckpt, out, signal.SIGINT)
    assert code == 130, (code, stderr)
    assert stderr == INTERRUPTED + "\n" and stdout == ""
    assert_not_complete(out)
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "--resume", "-q")
    assert r.exit_code == 0, r.output
    assert cli("verify", out).exit_code == 0


# ------------------------------------------------------------------------------------------------ fuzzing


@pytest.mark.slow
def test_fuzz_headers_short(monkeypatch):
    """The CI version of scripts/reliability/fuzz_headers.py: 2,000 hypothesis inputs; only FimoeError may escape."""
    fz = _script("fuzz_headers")
    r = fz.run_hypothesis(2000, seed=1, log=lambda *a: None)
    assert r["inputs"] >= 2000 and r["accepted"] > 0 and r["rejected"] > 0


@pytest.mark.parametrize("raw", [
    struct.pack("<Q", 5000) + b"9" * 5000,
    struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000,
    struct.pack("<Q", 2**64 - 1),
    b"\x01\x00\x00\x00\x00\x00\x00",
], ids=["5000-digit-int", "deep-nesting", "max-length", "short"])
def test_parser_regressions_from_fuzzing(raw):
    with pytest.raises(FimoeError, match=r"^x\.safetensors: "):
        parse_header(raw[:8], lambda n: raw[8:8 + n], len(raw), "x.safetensors")


# ------------------------------------------------------------------------------------------------ secrets


SENTINEL = "hf_SENTINELfimoe0token0must0never0leak"


class _EchoingHub(http.server.BaseHTTPRequestHandler):
    """A hostile Hub endpoint: refuses everything with 401 and echoes the Authorization header back."""

    seen: list[str] = []

    def _refuse(self):
        auth = self.headers.get("Authorization", "")
        self.seen.append(auth)
        body = json.dumps({"error": f"Invalid credentials in Authorization header: {auth}"}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Message", f"bad token {auth}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _refuse

    def log_message(self, *a):
        pass


@pytest.mark.slow
def test_token_never_written_or_printed(tiny_ckpt, tmp_path):
    cache = tmp_path / "hub"
    seed_hub_cache(tiny_ckpt, cache, REPO, COMMIT)
    env = {"HF_TOKEN": SENTINEL, "HUGGING_FACE_HUB_TOKEN": SENTINEL, "HF_HUB_CACHE": str(cache),
           "HF_HUB_OFFLINE": "1", "FIMOE_DEBUG": None}
    texts: list[str] = []
    local, hub_out = tmp_path / "local", tmp_path / "hub_out"

    def run(*args, code=0):
        r = cli(*args, env=env)
        assert r.exit_code == code, (args, r.output, r.exception)
        texts.append(r.output + r.stderr)

    run(tiny_ckpt, local, "--json")
    run(REPO, hub_out, "--offline", "-v")
    run(REPO, tmp_path / "bad", "--target", "nope", code=2)
    run("deepseek-ai/Nope", tmp_path / "bad", "--offline", code=1)
    run("verify", local)
    run("verify", hub_out, "--deep", "--json")
    run("inspect", REPO, "--offline", "--json")
    run("upload", hub_out, "someone/converted", "--dry-run")
    # A child process against a hostile endpoint that echoes the token: the Hub path online, with -v.
    _EchoingHub.seen = []
    server = QuietServer(("127.0.0.1", 0), _EchoingHub)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    try:
        hostile = child_env(**{**env, "HF_HUB_OFFLINE": "0"}, HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}",
                            HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
        p = subprocess.run([sys.executable, "-m", "fimoe_convert", "deepseek-ai/Private", str(tmp_path / "bad2"), "-v"],
                           env=hostile, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert p.returncode == 1 and p.stderr.startswith("error: SRC 'deepseek-ai/Private'"), p.stderr
    assert "Traceback" not in p.stderr
    assert any(SENTINEL in a for a in _EchoingHub.seen)  # the token was really in play
    texts += [p.stdout, p.stderr]
    for text in texts:
        assert SENTINEL not in text
    for folder in (local, hub_out, tmp_path / "bad", tmp_path / "bad2"):
        for f in (folder.rglob("*") if folder.exists() else []):
            if f.is_file():
                assert SENTINEL.encode() not in f.read_bytes(), f
    assert json.loads((hub_out / MANIFEST).read_text())["complete"] is True


# ---------------------------------------------------------------------------------------------- integrity


@pytest.mark.slow
def test_verify_detects_single_byte_flips(tmp_path):
    """The CI version of scripts/reliability/flip_bytes.py: 10 random single-byte flips across output shards."""
    r = _script("flip_bytes").flip_campaign(10, seed=1, workdir=tmp_path, log=lambda *a: None)
    assert r["detected"] == 10 and r["missed"] == [] and r["restored_ok"]


@pytest.mark.parametrize("threads", [1, 3])
def test_input_hashes_come_from_every_file_once_and_a_vanished_file_is_named(tiny_ckpt, tmp_path, threads):
    """The manifest's source hashes run on several threads; a file that cannot be read then is reported by
    name, not as a bare OSError."""
    from fimoe_convert.files.sources.local import open_source
    from fimoe_convert.resume import hash_inputs

    src = tmp_path / "src"
    shutil.copytree(tiny_ckpt, src)
    source = open_source(str(src))
    files = source.input_files()
    hasher = hash_inputs(source, files, threads)
    assert hasher.workers == threads
    assert hasher.result() == {rel: hashlib.sha256((src / rel).read_bytes()).hexdigest() for rel in files}
    source = open_source(str(src))
    gone = sorted(p for p in files if p.endswith(".safetensors"))[0]
    (src / gone).unlink()
    with pytest.raises(
        FimoeError,
        match=rf"{re.escape(str(src / gone))}: cannot read it to record its sha256 \(No such "
        r"file or directory\); the source changed during the conversion",
    ):
        hash_inputs(source, files, threads).result()


@pytest.mark.slow
@pytest.mark.parametrize("target, cores, writers, threads", [
    ("bf16", 16, 4, 2),  # output 2.3x the input (experts 3.8x, the rest copied): fewer hashers than the lanes
    ("megamoe_sm90_mxfp4", 16, 4, 4),  # output the size of the input: one per lane
    ("megamoe_sm90_mxfp4", 2, 4, 1),  # at most one per 4 cores
])
def test_input_hash_threads_follow_the_lanes_and_the_input_share(tiny_ckpt, tmp_path, monkeypatch, target, cores,
                                                                 writers, threads):
    import fimoe_convert.conversion as conv
    import fimoe_convert.resume as resuming

    seen = []
    real = resuming.hash_inputs
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(resuming, "hash_inputs", lambda source, files, n, *more: seen.append(n) or real(
        source, files, n, *more))
    conv.convert(str(tiny_ckpt), str(tmp_path / "out"), target, shard_size="200KB", writers=writers)
    assert seen == [threads]


class _Interrupt(KeyboardInterrupt):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("preset, target, opts, stop_at", [
    # expert-chunk units and kept scale pieces; the experts come after the shared tensors, so stop late
    ("tiny", "megamoe_sm90_mxfp4", {"ep_size": 2, "max_memory": "3MiB"}, 0.8),
    ("lossy-fp8", "fp8_block", {"allow_lossy": True}, 0.6),  # a report with lossy tiles and examples
])
def test_a_resumed_conversion_reports_what_an_uninterrupted_one_does(tmp_path, preset, target, opts, stop_at):
    """Reports are stored with the shard holding each unit's first output, so the units of kept shards are
    counted after --resume: same report, same manifest, same folder."""
    from fimoe_convert import convert

    src = make_checkpoint(tmp_path / "src", preset)
    ref, out = tmp_path / "ref", tmp_path / "out"
    want = convert(str(src), str(ref), target, shard_size="60KB", **opts)
    assert want.shards > 3 and any(vars(want.report.fp8_block or want.report.mxfp4_window).values())

    def stop_midway(done, total):
        if done > total * stop_at:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        convert(str(src), str(out), target, shard_size="60KB", progress=stop_midway, **opts)
    got = convert(str(src), str(out), target, shard_size="60KB", resume=True, **opts)
    assert 0 < got.shards_kept < got.shards
    assert got.report == want.report
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in ref.iterdir()}
    # a --resume of the complete folder keeps every shard and, from their records, the report
    again = convert(str(src), str(out), target, shard_size="60KB", resume=True, **opts)
    assert again.shards_kept == again.shards and again.report == want.report
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in ref.iterdir()}


@pytest.mark.parametrize("writers", [1, 2])
def test_a_ctrl_c_while_a_lane_waits_for_a_shard_stops_that_shard_too(tiny_ckpt, tmp_path, monkeypatch, writers):
    """Ctrl-C while a lane waits for its oldest shard to be written: that shard's writer is stopped and joined
    with the others, so no thread goes on writing into OUT (or calling `progress`) after convert() raised."""
    from fimoe_convert import convert
    from fimoe_convert.pipeline import lanes

    jobs, real_init, real_next, real_join = [], lanes._ShardJob.__init__, lanes._ShardJob._next, lanes._ShardJob.join
    lane_waits = threading.Event()

    def init(self, *a):
        real_init(self, *a)
        jobs.append(self)

    def slow_next(self):
        lane_waits.wait(60)  # a slow disk: the shard is still being written when the lane waits for it
        return real_next(self)

    def join(self):
        if self.thread.is_alive():
            lane_waits.set()
            raise _Interrupt  # Ctrl-C during the wait
        real_join(self)

    monkeypatch.setattr(lanes._ShardJob, "__init__", init)
    monkeypatch.setattr(lanes._ShardJob, "_next", slow_next)
    monkeypatch.setattr(lanes._ShardJob, "join", join)
    with pytest.raises(_Interrupt):
        convert(str(tiny_ckpt), str(tmp_path / "out"), "bf16", shard_size="1MB", writers=writers)
    # every writer has run to its end (its thread may still be exiting: `done` is set as its last step)
    assert jobs and [j.shard.filename for j in jobs if not j.done.is_set()] == []
    assert not list((tmp_path / "out").glob("*.fimoe-tmp"))


@pytest.mark.parametrize("writers", [1, 2])
def test_a_real_ctrl_c_during_the_last_wait_returns_after_every_writer_ended(tiny_ckpt, tmp_path, signal_handlers,
                                                                             writers):
    """A SIGINT that lands while the main thread waits for a shard (or a lane) to finish: convert() raises only
    after that writer ended. Thread.join(timeout) cut short by the signal would call a running thread ended."""
    from fimoe_convert import convert
    from fimoe_convert.console import Interrupted, signals_interrupt, stopped_by

    main_thread, ended = threading.main_thread().ident, []

    def progress(done, total):
        if done == total:  # the last part: the main thread has handed everything on and waits
            signal.pthread_kill(main_thread, signal.SIGINT)
            deadline = time.monotonic() + 10
            while stopped_by() is None and time.monotonic() < deadline:
                pass  # until the signal's handler has run in the main thread
            time.sleep(0.5)  # still writing after it: long enough for a convert() that did not wait to return
            ended.append(True)

    with signals_interrupt(), pytest.raises(Interrupted):
        convert(str(tiny_ckpt), str(tmp_path / "out"), "bf16", writers=writers, progress=progress)  # one shard
    assert ended == [True]
    assert not list((tmp_path / "out").glob("*.fimoe-tmp"))
