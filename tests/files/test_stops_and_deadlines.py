"""Waits that end: a Hub request's overall deadline, a signal during inspect of a slow Hub repo, a torchrun rank
whose peers never come, and a single Ctrl-C at any moment of a command. Each ends in one line naming what it
waited for, with exit 128 + the signal for a stop."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_reliability import child_env

import fimoe_convert.cli as cli_mod
from fimoe_convert.entry import EARLY_STOP
from fimoe_convert.errors import InputError

# Seconds a stopped command may take to end: its exit (torch loaded) takes seconds on a busy machine; a signal not
# taken during the wait would leave it waiting for minutes (the drip's 120 s, the rendezvous's 600 s).
STOP_S = 30

# -------------------------------------------------------------- 1. Hub requests end, and signals end them


class _Drip(BaseHTTPRequestHandler):
    """Answers a Range with 206 and the bytes asked, one every `gap` s (0: at once): a drip never trips a read
    timeout, only the overall deadline."""

    gap = 0.0
    data = bytes(range(256)) * 4

    def log_message(self, *args):
        pass

    def do_GET(self):
        first, last = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        last = min(last, len(self.data) - 1)
        self.send_response(206)
        self.send_header("Content-Length", str(last + 1 - first))
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(self.data)}")
        self.end_headers()
        try:
            for i in range(first, last + 1):
                self.wfile.write(self.data[i:i + 1])
                self.wfile.flush()
                if self.gap:
                    time.sleep(self.gap)  # the slow server itself
        except OSError:
            pass


@pytest.mark.parametrize("gap, start, end, result", [
    (0.0, 0, 99, (0, 100)),
    (0.0, 1000, 5000, (1000, 1024)),  # past the file's end: cut where it ends
    (0.05, 0, 3, (0, 4)),  # what was asked arrived before the deadline: no timeout
    (0.05, 0, 1023, InputError),  # a byte every 0.05 s, past the deadline
])
def test_a_header_read_has_an_overall_deadline(monkeypatch, gap, start, end, result):
    from helpers.hub_files import QuietServer

    import fimoe_convert.files.sources.http_range as http_range

    monkeypatch.setattr(http_range, "REQUEST_DEADLINE_S", 0.5)
    monkeypatch.setattr(_Drip, "gap", gap)
    server = QuietServer(("127.0.0.1", 0), _Drip)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # shutdown() waits one poll
    url = f"http://127.0.0.1:{server.server_address[1]}/org/x/resolve/main/a.safetensors"
    try:
        if result is InputError:
            with pytest.raises(InputError, match=r"^org/x/a\.safetensors: byte \d+ of 1024 after 0 s, the most one "
                                                 r"read of a header may take; the server is too slow"):
                http_range.read_head(url, start, end, where="org/x/a.safetensors")
        else:
            lo, hi = result
            assert http_range.read_head(url, start, end, where="org/x/a.safetensors") == (_Drip.data[lo:hi], 1024)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("signum, times", [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGINT, 2),
                                           (signal.SIGTERM, 3)])
def test_a_signal_ends_inspect_of_a_hub_repo_stuck_on_a_slow_server(tiny_ckpt, tmp_path, signum, times):
    from helpers.hub_files import HubFiles

    dripping = threading.Event()

    class Drip(HubFiles):
        """Shard headers sent one byte every 0.2 s: never a read timeout, never an end."""

        def _serve(self, h, body):
            if not (body and h.path.endswith(".safetensors")):
                return super()._serve(h, body)
            with self.lock:
                self.requests.append((h.command, h.path, h.headers.get("Range")))
            h.send_response(206)
            h.send_header("Content-Length", str(1 << 20))
            h.send_header("Content-Range", f"bytes 0-{(1 << 20) - 1}/{1 << 30}")
            h.end_headers()
            try:
                for _ in range(600):
                    h.wfile.write(b"\0")
                    h.wfile.flush()
                    dripping.set()  # the client reads a shard header, stuck on this server
                    time.sleep(0.2)  # the slow server itself
            except OSError:
                pass

    with Drip("org/tiny-v4", tiny_ckpt, "c" * 40) as hub:
        env = child_env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_DISABLE_TELEMETRY="1",
                        HF_TOKEN="", FIMOE_DEBUG="", HF_HUB_OFFLINE=None)
        proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", "inspect", "org/tiny-v4"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert dripping.wait(60), "no shard header was asked for within 60 s"
        sent = time.monotonic()
        for _ in range(times):  # a second Ctrl-C during the clean-up changes nothing
            proc.send_signal(signum)
            time.sleep(0.02)  # apart: signals sent together may arrive as one
        try:
            _, err = proc.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"the run did not end within {STOP_S} s of the signal")
    assert time.monotonic() - sent < STOP_S
    assert proc.returncode == 128 + signum, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"error: interrupted ({signal.Signals(signum).name})") and "Traceback" not in err, err


# ------------------------------------------------------------- 2. a torchrun rank whose peers never come


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


@pytest.mark.slow
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
            time.sleep(0.05)  # until rank 0 opens the store: its wait for the peers has begun
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
        assert time.monotonic() - t0 < STOP_S, "the signal was not taken during the wait"
        assert proc.returncode == 128 + signum, err
        assert lines[0].startswith(f"error: interrupted ({signal.Signals(signum).name})"), err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------- 3. a single Ctrl-C at any moment


def _one_stop_line(rc: int, err: str, out: Path) -> None:
    """A run stopped by one Ctrl-C: the interruption line alone and exit 130 (or, finished first, no error), and no
    temporary left."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("converting: ")]
    if rc == 0:
        assert lines == [], err
    else:
        assert rc == 130 and len(lines) == 1 and lines[0].startswith("error: interrupted (SIGINT); "), (rc, err)
    assert not list(out.glob("*.fimoe-tmp")) if out.exists() else True


@pytest.mark.slow
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_landing_in_a_condition_s_enter_comes_again_after_it(signal_handlers, signum):
    """Raised in Condition.__enter__ after its lock is acquired, a stop would leave the lock held (the `with` never
    entered) and the clean-up waiting on it forever: the handler lets it pass and sends it again, raised later."""
    from fimoe_convert.console import Interrupted, _on_signal, signals_interrupt, stopped_by

    class Lock:  # records the frame of Condition.__enter__, the one the handler sees after a C lock's acquire
        def __enter__(self):
            self.frame = sys._getframe(1)

        def __exit__(self, *exc):
            pass

        acquire = release = __exit__

    lock = Lock()
    with threading.Condition(lock):
        pass
    assert lock.frame.f_code is threading.Condition.__enter__.__code__
    with signals_interrupt():
        _on_signal(signum, lock.frame)  # let pass: nothing raised here
        held = stopped_by()
        with pytest.raises(Interrupted) as stop:
            time.sleep(10)  # raised again from SIGALRM's handler, here
    assert held is None and stopped_by() == signum and stop.value.signum == signum


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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["INT", "TERM"])
@pytest.mark.parametrize("args", [["targets"], ["verify", "no-such-folder"]])
def test_a_signal_after_the_command_ended_changes_nothing(name, args):
    """The command has printed its result; a Ctrl-C while the interpreter exits (joining threads, unloading torch)
    neither prints a traceback nor changes the exit status."""
    r = subprocess.run([sys.executable, "-c", AT_EXIT.format(name=name), *args], env=child_env(FIMOE_DEBUG=""),
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    assert r.returncode == (0 if args == ["targets"] else 1), (r.returncode, r.stderr)
