"""Trust boundary, third pass: a torchrun launch whose peers never come, JSON that parses into far more memory than
its bytes, the cost of recording input hashes, and a single Ctrl-C at any moment. One test per class; every refusal
is one line naming what it waited for or read, the limit, and the next step."""

import signal
import socket
import subprocess
import sys
import time

import pytest
from test_reliability import child_env

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
