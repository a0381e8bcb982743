"""Trust boundary, third pass: a torchrun launch whose peers never come, JSON that parses into far more memory than
its bytes, the cost of recording input hashes, and a single Ctrl-C at any moment. One test per class; every refusal
is one line naming what it waited for or read, the limit, and the next step."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reliability import child_env

from fimoe_convert.entry import EARLY_STOP
from fimoe_convert.errors import InputError

# ------------------------------------------------------------- 1. a torchrun rank whose peers never come


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


RANK_ALONE = """import sys
import fimoe_convert.distributed as d
d.RENDEZVOUS_TIMEOUT_S = float(sys.argv[1])
from fimoe_convert.cli import main
sys.argv = ["fimoe-convert", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize("rank, timeout_s, signum", [
    (0, 2, None),  # rank 0 holds the store and waits for rank 1
    (1, 1.5, None),  # rank 1 knocks at a store nobody opened
    (0, 600, signal.SIGTERM),  # a scheduler's stop ends the wait at once
    (0, 600, signal.SIGINT),
])
def test_a_rank_whose_peers_never_come_stops_in_time_or_on_a_signal(tiny_ckpt, tmp_path, rank, timeout_s, signum):
    port = _free_port()
    env = child_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port), FIMOE_DEBUG="", TORCHELASTIC_USE_AGENT_STORE=None)
    proc = subprocess.Popen([sys.executable, "-c", RANK_ALONE, str(timeout_s), str(tiny_ckpt), str(tmp_path / "out"),
                             "-q"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.monotonic()
    if signum is not None:
        while not _listening(port) and proc.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()
        t0 = time.monotonic()
        proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the rank did not end within 60 s")
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    if signum is None:
        assert proc.returncode == 1, err
        assert lines[0] == (f"error: torchrun rendezvous: rank {rank} of WORLD_SIZE=2 waited {timeout_s:g} s at "
                            f"127.0.0.1:{port} for the other 1 rank(s), and not all came; start every rank (one "
                            "torchrun per node, the same --nnodes, --master-addr and --master-port), or unset "
                            "WORLD_SIZE for one process"), err
    else:
        assert time.monotonic() - t0 < 5, "the signal was not taken during the wait"
        assert proc.returncode == 128 + signum, err
        assert lines[0].startswith(f"error: interrupted ({signal.Signals(signum).name})"), err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------- 2. JSON that costs far more memory than its bytes


def _items(value) -> int:
    """The keys, values and containers in a parsed JSON value (what count_items bounds from above)."""
    if isinstance(value, dict):
        return 1 + sum(1 + _items(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_items(v) for v in value)
    return 1


@pytest.mark.parametrize("item, n, refused", [
    (b"{}", 600, True),  # each `{}` counts twice (`{` and `,`): the bound is conservative for containers
    (b"[]", 600, True),
    (b'"ab"', 1100, True),
    (b"1.5", 1100, True),
    (b"[[[1]]]", 300, True),
    (b'"ab"', 990, False),  # just under the limit: read
    (b'{"k":1}', 300, False),
])
def test_json_with_too_many_items_is_refused_before_it_is_built(tmp_path, monkeypatch, item, n, refused):
    from fimoe_convert.files import jsonfile

    monkeypatch.setattr(jsonfile, "MAX_ITEMS", 1000)
    path = tmp_path / "fimoe-manifest.json"
    path.write_bytes(b"[" + b",".join([item] * n) + b"]")
    built = []
    monkeypatch.setattr(jsonfile.json, "loads", lambda *a, **k: built.append(1) or [])
    if refused:
        with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: about \d+ JSON items \(keys, values and "
                                             r"containers\), more than the 1000 such a file may hold \(reading them "
                                             r"would take ~[\d.]+ kB\); redo$"):
            jsonfile.read_json(path, "manifest", fix="redo")
        assert built == []
    else:
        jsonfile.read_json(path, "manifest", fix="redo")
        assert built == [1]


@pytest.mark.parametrize("text", [
    b"[]", b'{"a": [1, 2, {"b": null}], "c": "x,y:[{"}', b'[[[[[]]]]]', b'{"a": {}, "b": []}',
    b'[1e5, -2, true, false, null, "\\u00e9"]',
])
def test_the_item_count_bounds_the_parsed_items(text):
    from fimoe_convert.files.jsonfile import count_items

    assert count_items(text) >= _items(json.loads(text))


def test_the_largest_real_files_fit_the_limits(tiny_ckpt):
    """V4-Pro's index (145,116 tensors) within a fifth of the byte and item limits; so are the tiny files."""
    from fimoe_convert.files.jsonfile import MAX_BYTES, MAX_ITEMS, count_items

    names = [f"layers.{i % 61}.ffn.experts.{i % 384}.w{i % 3 + 1}.weight_{i}" for i in range(145_116)]
    index = json.dumps({"metadata": {"total_size": 1 << 40}, "weight_map": {
        n: f"model-{i % 64 + 1:05d}-of-00064.safetensors" for i, n in enumerate(names)}}, indent=2).encode()
    assert len(index) * 5 < MAX_BYTES["index"] and count_items(index) * 5 < MAX_ITEMS
    for f in tiny_ckpt.glob("*.json"):
        assert count_items(f.read_bytes()) * 1000 < MAX_ITEMS


def test_a_safetensors_header_with_too_many_items_is_refused(tmp_path, monkeypatch):
    import struct

    from fimoe_convert.files.safetensors import header as st_header

    monkeypatch.setattr(st_header, "MAX_HEADER_ITEMS", 1000)
    header = b'{"__metadata__": {}, "a": {"dtype": "U8", "shape": [' + b",".join([b"1"] * 2000) + b"]}}"
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: header: about 20\d\d JSON items .* more than the "
                                         r"1000 such a file may hold .*; the file is corrupt or not safetensors$"):
        st_header.read_header(path)


# ------------------------------------------------------------- 3. input hashes are recorded in batches


@pytest.fixture
def many_inputs(tiny_ckpt, tmp_path) -> Path:
    """The tiny checkpoint with 300 small extra files: 309 inputs, each hashed and recorded."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_ckpt, src)
    for i in range(300):
        (src / f"extra_{i:03d}.txt").write_text(f"extra file {i}\n")
    return src


@pytest.mark.parametrize("defer_s, most_writes", [
    (5.0, 10),  # the default: the first manifest, one per shard (4), the last hash; not one per input
    (0.0, 300),  # no batching: a write per input, as the count catches
])
def test_input_hashes_are_recorded_in_batches(many_inputs, tmp_path, monkeypatch, defer_s, most_writes):
    from fimoe_convert import convert
    from fimoe_convert.files import hashing
    from fimoe_convert.files.output import manifest as manifest_mod
    from fimoe_convert.files.output.manifest import LiveManifest, read_manifest

    monkeypatch.setattr(LiveManifest, "DEFER_S", defer_s)
    writes = []
    real = manifest_mod.write_manifest
    monkeypatch.setattr(manifest_mod, "write_manifest", lambda *a: writes.append(1) or real(*a))
    out = tmp_path / "out"
    convert(str(many_inputs), str(out), "bf16")
    if defer_s:
        assert len(writes) <= most_writes, len(writes)
    else:
        assert len(writes) > most_writes, len(writes)
    recorded = read_manifest(out).source.files
    assert len(recorded) == 309 and all(r.sha256 == hashing.sha256_file(many_inputs / k) for k, r in recorded.items())


@pytest.mark.parametrize("at", [0.05, 0.5, 0.9])
def test_a_kill_with_hashes_not_yet_recorded_resumes_correctly(many_inputs, tmp_path, monkeypatch, at):
    """Hashes deferred for an hour: the interrupted manifest records only hashes of the bytes on disk (or none), and
    --resume of it gives the same folder as one uninterrupted run."""
    from test_trust import interrupted_run

    from fimoe_convert import convert
    from fimoe_convert.files import hashing
    from fimoe_convert.files.names import MANIFEST_NAME
    from fimoe_convert.files.output.manifest import LiveManifest

    monkeypatch.setattr(LiveManifest, "DEFER_S", 3600.0)
    out, ref = tmp_path / "out", tmp_path / "ref"
    interrupted_run(many_inputs, out, at=at, hashed=False)
    files = json.loads((out / MANIFEST_NAME).read_text())["source"]["files"]
    recorded = {k: r["sha256"] for k, r in files.items() if r["sha256"]}
    assert recorded == {k: hashing.sha256_file(many_inputs / k) for k in recorded}
    convert(str(many_inputs), str(out), "bf16", shard_size="1MB", resume=True)
    convert(str(many_inputs), str(ref), "bf16", shard_size="1MB")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in ref.iterdir()}


# ------------------------------------------------------------- 4. a single Ctrl-C at any moment


def _one_stop_line(rc: int, err: str, out: Path) -> None:
    """A run stopped by one Ctrl-C: the interruption line alone and exit 130 (or, finished first, no error), and no
    temporary left."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("converting: ")]
    if rc == 0:
        assert lines == [], err
    else:
        assert rc == 130 and len(lines) == 1 and lines[0].startswith("error: interrupted (SIGINT); "), (rc, err)
    assert not list(out.glob("*.fimoe-tmp")) if out.exists() else True


@pytest.mark.parametrize("delay_s", [1.0, 1.5, 2.0, 2.5, 3.5])
def test_a_single_ctrl_c_at_any_moment_prints_one_line(tiny_ckpt, tmp_path, delay_s):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", str(tiny_ckpt), str(out), "--shard-size", "1MB",
                             "--writers", "2"], env=child_env(FIMOE_DEBUG=""), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    _one_stop_line(proc.returncode, err, out)


SIGINT_ON_IMPORT = """
import os, signal, sys
class _Stop:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["FIMOE_TEST_STOP_AT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the CLI's modules load
        return None
sys.meta_path.insert(0, _Stop())
"""


@pytest.mark.parametrize("module", ["click", "fimoe_convert.console", "fimoe_convert.options"])
@pytest.mark.parametrize("how", [["-m", "fimoe_convert"], ["-c", "from fimoe_convert.entry import run; run()"]])
def test_a_ctrl_c_while_the_cli_loads_prints_one_line(tmp_path, module, how):
    """Before the CLI's own handlers exist: the same one line and 130, not Python's traceback and -2."""
    (tmp_path / "sitecustomize.py").write_text(SIGINT_ON_IMPORT)
    env = child_env(FIMOE_TEST_STOP_AT=module)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    r = subprocess.run([sys.executable, *how, "targets"], env=env, capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (r.returncode, r.stderr, r.stdout) == (130, EARLY_STOP, "")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_the_torch_import_is_raised_after_it(signal_handlers, signum):
    """A compiled extension's initialization calls Python from C++ frames that cannot pass an exception on (exit -6
    once, in the middle of `import torch`): inside signals_deferred the stop is held, and raised when it ends."""
    import threading

    from fimoe_convert.console import Interrupted, signals_deferred, signals_interrupt, stopped_by

    reached_end = False
    with signals_interrupt(), pytest.raises(Interrupted) as stop, signals_deferred():
        signal.pthread_kill(threading.main_thread().ident, signum)  # to this thread: its handler runs here
        deadline = time.monotonic() + 10
        while stopped_by() is None and time.monotonic() < deadline:
            pass
        reached_end = True  # without the deferral the handler's exception ends the block in the loop above
    assert reached_end and stopped_by() == signum and stop.value.signum == signum


def test_a_stop_that_ended_an_earlier_command_is_not_raised_again(signal_handlers):
    """A library call after a command a Ctrl-C stopped, in the same process (convert() imports torch inside
    signals_deferred): the old stop is not raised again."""
    import threading

    from fimoe_convert.console import Interrupted, signals_deferred, signals_interrupt, stopped_by

    with signals_interrupt(), pytest.raises(Interrupted):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(10)  # the handler raises in this thread first
    assert stopped_by() == signal.SIGINT
    try:
        with signals_deferred():
            pass
    except Interrupted:
        pytest.fail("the earlier command's stop was raised again")


SIGINT_AS_THE_COMMAND_ENDS = """
import os, signal, click.core
_main = click.core.Command.main
def main(self, *a, **kw):
    try:
        return _main(self, *a, **kw)
    finally:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C just as the command's exit is under way
click.core.Command.main = main
"""


@pytest.mark.parametrize("args", [["targets"], ["inspect", "no-such-folder"]])
def test_a_ctrl_c_as_the_command_ends_prints_one_line(tmp_path, args):
    """The signal lands while the command's own exit (SystemExit) is under way, before its handlers are taken
    down: one line and 130, not an uncaught exception (which took the process down with exit -6 once)."""
    (tmp_path / "sitecustomize.py").write_text(SIGINT_AS_THE_COMMAND_ENDS)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    r = subprocess.run([sys.executable, "-m", "fimoe_convert", *args], env=env, capture_output=True, text=True,
                       timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (r.returncode, r.stderr.splitlines()[-1:]) == (130, [EARLY_STOP.strip()]), r.stderr


@pytest.mark.parametrize("stage", ["parse", "work"])
def test_what_the_clean_up_after_a_stop_raises_is_the_stop(tiny_ckpt, tmp_path, monkeypatch, signal_handlers, stage):
    """The signal cut an import short and the clean-up imports the module again (ImportError), or the signal came
    while the command line was parsed: either way the interruption line and 130, not 'Aborted!' or another error."""
    import os

    from click.testing import CliRunner

    import fimoe_convert.cli as cli_mod
    import fimoe_convert.conversion as conversion
    import fimoe_convert.files.output.folder as output

    def stop_then_fail(*a, **k):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        finally:
            raise ImportError("cannot load module more than once per process")

    def stop(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    if stage == "work":
        monkeypatch.setattr(conversion, "build_plan", stop_then_fail)
    else:
        monkeypatch.setattr(output, "path_kind", stop)
    src = str(tiny_ckpt) if stage == "work" else "inspekt"  # a near-miss of a command: its path is looked up
    r = CliRunner().invoke(cli_mod.main, [src, str(tmp_path / "out")], env={"FIMOE_DEBUG": ""})
    assert r.exit_code == 130, (r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"error: interrupted \(SIGINT\); (nothing was left half-done|finished shards "
                                        r"are kept: run the same command with --resume)$", lines[0]), r.stderr


AT_EXIT = """import atexit, os, signal, sys, time
from fimoe_convert.cli import main
atexit.register(lambda: (os.kill(os.getpid(), signal.SIG{name}), time.sleep(0.5)))  # a signal while the process exits
sys.argv = ["fimoe-convert", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("name", ["INT", "TERM"])
@pytest.mark.parametrize("args", [["targets"], ["verify", "no-such-folder"]])
def test_a_signal_after_the_command_ended_changes_nothing(name, args):
    """The command has printed its result; a Ctrl-C while the interpreter exits (joining threads, unloading torch)
    neither prints a traceback nor changes the exit status."""
    r = subprocess.run([sys.executable, "-c", AT_EXIT.format(name=name), *args], env=child_env(FIMOE_DEBUG=""),
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    assert r.returncode == (0 if args == ["targets"] else 1), (r.returncode, r.stderr)
