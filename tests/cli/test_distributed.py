"""torchrun across processes (gloo on CPU): the output is byte-identical to a single-process run, and
--resume finishes after the whole launch is killed midway."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fimoe_convert.files.output.manifest import read_manifest
from fimoe_convert.plan import OutTensor, assign_shards, plan_shards


def folder(p: Path) -> dict:
    return {f.name: f.read_bytes() for f in sorted(p.iterdir())}


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(src, out, *extra, port=None):
    port = port or free_port()
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "-m", "fimoe_convert", str(src), str(out), "--shard-size", "1MB", "-q", *extra]


@pytest.fixture(scope="module")
def reference(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run([sys.executable, "-m", "fimoe_convert", str(tiny_ckpt), str(out), "--shard-size", "1MB", "-q"],
                   check=True)
    return out


@pytest.mark.slow
def test_two_ranks_match_one_process(tiny_ckpt, reference, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(torchrun(tiny_ckpt, out, port=None), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert folder(out) == folder(reference)


@pytest.mark.slow
def test_two_ranks_report_every_unit(tmp_path):
    """Each rank's shards carry the reports of their units: the report of a 2-rank launch is the report of one
    process (it was rank 0's units only before)."""
    from fimoe_convert.testing import make_checkpoint

    src = make_checkpoint(tmp_path / "src", "lossy-fp8")
    one, two = tmp_path / "one", tmp_path / "two"
    args = ("--target", "fp8_block", "--allow-lossy", "--shard-size", "1MB")  # a shard per rank
    subprocess.run([sys.executable, "-m", "fimoe_convert", str(src), str(one), "-q", *args], check=True)
    r = subprocess.run(torchrun(src, two, *args), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_manifest(two).report.fp8_block.tensors == 2 * 4 * 3
    assert folder(two) == folder(one)


def start_and_kill(src, out, kill) -> None:
    """Start a 2-rank launch, wait until a rank has finished a shard, then `kill(launcher)`. Retried when
    the tiny conversion finished before the kill landed (then there is nothing to resume)."""
    for _ in range(3):
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen(torchrun(src, out), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not list(out.glob("fimoe-status.rank*.json")):
            time.sleep(0.01)
        if proc.poll() is None:
            kill(proc)
        proc.wait(timeout=120)
        if (out / "fimoe-manifest.json").exists() and read_manifest(out).complete is False:
            return
    pytest.fail("the launch finished before it could be killed, 3 times")


def kill_launch(proc):
    os.killpg(proc.pid, signal.SIGKILL)  # every rank and the launcher


def kill_one_rank(proc):
    workers = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True
    ).stdout.split()
    assert len(workers) == 2, workers
    os.kill(int(workers[-1]), signal.SIGKILL)  # torchrun then stops the other rank and fails the launch


@pytest.mark.slow
@pytest.mark.parametrize("kill", [kill_launch, kill_one_rank], ids=["whole-launch", "one-rank"])
def test_resume_after_a_kill(tiny_ckpt, reference, tmp_path, kill):
    out = tmp_path / "out"
    start_and_kill(tiny_ckpt, out, kill)
    r = subprocess.run(torchrun(tiny_ckpt, out, "--resume"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert folder(out) == folder(reference)


def test_shard_assignment_balances_bytes():
    sizes = [900, 100, 500, 500, 300, 200]
    shards = plan_shards([OutTensor(f"t{i}", "U8", (n,)) for i, n in enumerate(sizes)], 1)
    owner = assign_shards(shards, 2)
    load = [sum(s.nbytes for s, o in zip(shards, owner) if o == r) for r in (0, 1)]
    assert sorted(load) == [1200, 1300] and owner == assign_shards(shards, 2)


@pytest.mark.slow
def test_two_ranks_from_a_shared_hub_cache(hub_cache, tmp_path):
    """A Hub repo id under torchrun: every rank reads the one shared cache (offline), same bytes."""
    from reference import HUB_REPO

    one, two = tmp_path / "one", tmp_path / "two"
    single = [sys.executable, "-m", "fimoe_convert", HUB_REPO, str(one), "--shard-size", "1MB", "-q", "--offline"]
    subprocess.run(single, check=True, timeout=300)
    r = subprocess.run(torchrun(HUB_REPO, two, "--offline"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert folder(two) == folder(one)
    assert len(list(two.glob("model-*.safetensors"))) > 2
