#!/usr/bin/env python3
"""Crash-resume check: SIGKILL the real CLI at random points, then `--resume`, compare byte for byte.

    python3 scripts/reliability/crash_resume.py [--kills 20] [--seed 0] [--workdir DIR] [--shard-size 1MB]
                                    [--target bf16]
                                    [--writers N]
    python3 scripts/reliability/crash_resume.py --enospc-tmpfs [--workdir DIR]   # a real disk-full run, prints JSON

Makes a multi-shard tiny fixture, does one uninterrupted reference conversion
(`python3 -m fimoe_convert SRC OUT --shard-size 1MB --device cpu -q`), then N times: starts the same
command in a child process, waits for a kill point (seeded: a random delay, the k-th output shard
being written, the k-th manifest rewrite, a source shard being read, the final metadata files),
freezes the child with SIGSTOP, records what it was doing (its open files and what lies in OUT),
SIGKILLs it and checks the torn OUT:

- `verify OUT` fails unless the manifest says complete (and then it must pass);
- every shard the manifest marks `written` is on disk with the recorded size and sha256, and the
  manifest never says complete while a shard is missing or pending;
- the manifest is valid JSON (atomic rewrite), never half written.

Then it runs the same command with `--resume` to completion and compares every file of OUT with
the reference, byte for byte. Prints the counts. `tests/files/test_reliability.py` runs a 3-kill version.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package, wherever the installed one points

MANIFEST = "fimoe-manifest.json"
INDEX = "model.safetensors.index.json"
TMP = ".fimoe-tmp"
MODES = ("delay", "shard", "manifest", "read", "finalize")
# A kill's phase, first match wins (the state of the frozen child decides, not the mode that aimed at it).
PHASES = ("startup", "manifest-rewrite", "finalizing", "reading", "writing-shard", "between-shards", "finished")


@dataclass
class Kill:
    i: int
    mode: str
    phase: str
    torn: bool
    verify_passed: bool
    complete_early: bool
    problems: list[str] = field(default_factory=list)
    resumed: bool = False


def child_env() -> dict[str, str]:
    """The environment for `python3 -m fimoe_convert` children: this checkout's package first."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def cli_args(src: Path, out: Path, shard_size: str, *extra: str, convert_opts: tuple[str, ...] = ()) -> list[str]:
    return [str(src), str(out), "--shard-size", shard_size, "--device", "cpu", "-q", *convert_opts, *extra]


def run_cli(args: list[str], in_process: bool) -> tuple[int, str]:
    """(exit code, stderr) of `fimoe-convert ARGS`, in a child process or in this one (faster in tests)."""
    if in_process:
        from click.testing import CliRunner

        from fimoe_convert.cli import main

        r = CliRunner().invoke(main, args)
        return r.exit_code, r.stderr + (
            f"\n{r.exception!r}" if r.exception and r.exit_code not in (0, 1, 2, 130) else ""
        )
    p = subprocess.run([sys.executable, "-m", "fimoe_convert", *args], capture_output=True, text=True, env=child_env())
    return p.returncode, p.stderr


def folder_bytes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _open_files(pid: int) -> list[str]:
    out = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    except OSError:
        pass
    return out


def _listing(out: Path) -> list[str]:
    try:
        return os.listdir(out)
    except OSError:
        return []


def _wait_for_kill_point(proc: subprocess.Popen, mode: str, rng: random.Random, src: Path, out: Path,
                         ref_seconds: float, n_shards: int) -> None:
    """Return when the child reaches the kill point chosen by `mode` (or has exited)."""
    t0 = time.monotonic()
    if mode == "delay":
        deadline = t0 + rng.uniform(0.0, ref_seconds * 1.1)
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.001)
        return
    k = rng.randint(1, n_shards + (2 if mode == "manifest" else 0))  # the k-th occurrence of the event
    extra = rng.uniform(0.0, 0.003) if mode == "shard" else 0.0  # the whole write phase lasts ~0.2 s
    seen: set[str] = set()
    manifest_rewrites = reads = 0
    in_tmp = False
    src_s = str(src)
    while proc.poll() is None and time.monotonic() - t0 < 120:
        names = _listing(out)
        if mode == "shard":
            seen.update(n for n in names if n.startswith("model-") and n.endswith(TMP))
            if len(seen) >= k:
                break
        elif mode == "manifest":
            now = MANIFEST + TMP in names
            if now and not in_tmp:
                manifest_rewrites += 1  # the manifest is written n_shards + 2 times: start, per shard, end
                if manifest_rewrites >= k:
                    return
            in_tmp = now
        elif mode == "read":
            if MANIFEST in names and any(
                f.startswith(src_s) and f.endswith(".safetensors") for f in _open_files(proc.pid)
            ):
                reads += 1  # polls that caught a source shard open for reading
                if reads >= k:
                    return
        elif mode == "finalize" and (INDEX in names or INDEX + TMP in names or "config.json" + TMP in names):
            return
        time.sleep(0.0002)
    deadline = time.monotonic() + extra
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.0005)


def _phase(pid_exited: bool, open_files: list[str], names: list[str], src: Path, manifest: dict | None) -> str:
    if pid_exited:
        return "finished"
    if MANIFEST not in names and MANIFEST + TMP not in names:
        return "startup"  # imports, reading config, index and every shard header
    if MANIFEST + TMP in names:
        return "manifest-rewrite"
    if manifest and manifest.get("complete"):
        return "finished"
    if any(n in names for n in (INDEX, INDEX + TMP, "config.json" + TMP, "README.md", "README.md" + TMP)):
        return "finalizing"
    if any(f.startswith(str(src)) and f.endswith(".safetensors") for f in open_files):
        return "reading"
    if any(n.startswith("model-") and n.endswith(TMP) for n in names):
        return "writing-shard"  # the writer streams a shard while the producer converts ahead
    return "between-shards"


def check_torn(out: Path) -> tuple[bool, bool, bool, list[str], dict | None]:
    """(torn, verify_passed, complete_early, problems, manifest) for OUT as the kill left it."""
    from click.testing import CliRunner

    from fimoe_convert.cli import main
    from fimoe_convert.files.hashing import sha256_file

    problems: list[str] = []
    manifest = None
    if (out / MANIFEST).exists():
        try:
            manifest = json.loads((out / MANIFEST).read_text())
        except ValueError as e:
            problems.append(f"manifest is not valid JSON after the kill: {e}")
    torn = not (manifest and manifest.get("complete") is True)
    r = CliRunner().invoke(main, ["verify", str(out)])
    verify_passed = r.exit_code == 0
    if r.exit_code not in (0, 1) or "Traceback" in r.output:
        problems.append(f"verify exited {r.exit_code}: {r.output[-300:]!r} {r.exception!r}")
    complete_early = False
    if manifest:
        status, files = manifest.get("status", {}), manifest.get("files", {})
        for shard, st in sorted(status.items()):
            ok = (out / shard).is_file() and shard in files and (out / shard).stat().st_size == files[shard]["size"] \
                and sha256_file(out / shard) == files[shard]["sha256"]
            if st == "written" and not ok:
                problems.append(f"manifest marks {shard} written, but it is missing or differs")
            if manifest.get("complete") and (st != "written" or not ok):
                complete_early = True
                problems.append(f"manifest says complete while {shard} is {st} / missing")
    if torn and verify_passed:
        problems.append("verify passed on a torn OUT")
    if not torn and not verify_passed:
        problems.append(f"manifest complete but verify fails: {r.stderr.strip()!r}")
    return torn, verify_passed, complete_early, problems, manifest


def make_fixture(work: Path) -> Path:
    from fimoe_convert.testing import make_checkpoint

    return make_checkpoint(work / "src", "tiny")


def campaign(kills: int = 20, seed: int = 0, workdir: Path | None = None, shard_size: str = "1MB",
             modes: tuple[str, ...] = MODES, in_process: bool = False, log=print,
             convert_opts: tuple[str, ...] = ()) -> dict:
    """Run the kill/resume loop; returns the counts (and every kill's record under 'kills'). `convert_opts`:
    more CLI options for every run (`--target`, `--writers`, ...)."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="fimoe-crash-")) if own else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    try:
        src = make_fixture(work)
        src_hash = folder_bytes(src)
        ref = work / "reference"
        shutil.rmtree(ref, ignore_errors=True)
        t0 = time.monotonic()
        code, err = run_cli(cli_args(src, ref, shard_size, convert_opts=convert_opts), in_process)
        ref_seconds = time.monotonic() - t0
        if code != 0:
            raise SystemExit(f"reference conversion failed ({code}): {err}")
        reference = folder_bytes(ref)
        n_shards = sum(1 for n in reference if n.startswith("model-"))
        if not in_process:
            pkg = subprocess.run([sys.executable, "-c", "import fimoe_convert; print(fimoe_convert.__file__)"],
                                 capture_output=True, text=True, env=child_env()).stdout.strip()
            log(f"reference: {n_shards} output shards, {len(reference)} files, CLI run {ref_seconds:.1f} s; "
                f"package {Path(pkg).parent}")
        rng = random.Random(seed)
        plan = [modes[i % len(modes)] for i in range(kills)]
        rng.shuffle(plan)
        records: list[Kill] = []
        out = work / "out"
        for i, mode in enumerate(plan):
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.Popen(
                [sys.executable, "-m", "fimoe_convert", *cli_args(src, out, shard_size, convert_opts=convert_opts)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=child_env(),
            )
            try:
                _wait_for_kill_point(proc, mode, rng, src, out, ref_seconds if not in_process else 4.0, n_shards)
                exited = proc.poll() is not None
                if not exited:
                    os.kill(proc.pid, signal.SIGSTOP)  # freeze every thread, then look
                files = _open_files(proc.pid) if not exited else []
                names = _listing(out)
                try:
                    m = json.loads((out / MANIFEST).read_text()) if MANIFEST in names else None
                except ValueError:
                    m = None
                phase = _phase(exited, files, names, src, m)
                if not exited:
                    os.kill(proc.pid, signal.SIGKILL)
            finally:
                if proc.poll() is None:
                    proc.kill()
                _, stderr = proc.communicate()
            if exited and proc.returncode != 0:
                raise SystemExit(f"kill {i}: the conversion failed on its own ({proc.returncode}): {stderr.decode()}")
            torn, verified, early, problems, _ = check_torn(out)
            rec = Kill(i, mode, phase, torn, verified, early, problems)
            code, err = run_cli(cli_args(src, out, shard_size, "--resume", convert_opts=convert_opts), in_process)
            if code != 0:
                rec.problems.append(f"--resume exited {code}: {err.strip()[-400:]}")
            else:
                got = folder_bytes(out)
                if got != reference:
                    diff = sorted(k for k in set(got) | set(reference) if got.get(k) != reference.get(k))
                    if MANIFEST in diff and MANIFEST in got:  # which of the manifest's fields differ, and how
                        a, b = (json.loads((d / MANIFEST).read_text()) for d in (out, ref))
                        diff += [f"{k}: {json.dumps(a.get(k))[:300]} vs {json.dumps(b.get(k))[:300]}"
                                 for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
                    rec.problems.append(f"after --resume OUT differs from the reference: {diff}")
                else:
                    rec.resumed = True
            records.append(rec)
            log(f"kill {i + 1:3d}/{kills}: aimed at {mode:8s} -> phase {phase:15s} torn={torn!s:5s} "
                f"verify={'PASSED' if verified else 'failed'} resume={'ok' if rec.resumed else 'FAILED'}"
                + (f"  PROBLEMS: {rec.problems}" if rec.problems else ""))
        if folder_bytes(src) != src_hash:
            records[-1].problems.append("the source folder changed")
        torn = [r for r in records if r.torn]
        counts = {
            "kills": len(records),
            "phases": dict(Counter(r.phase for r in records)),
            "torn": len(torn),
            "verify_passed_on_torn": sum(r.verify_passed for r in torn),
            "complete_early": sum(r.complete_early for r in records),
            "resumes_ok": sum(r.resumed for r in records),
            "problems": [p for r in records for p in r.problems],
            "output_shards": n_shards,
            "kills_detail": [r.__dict__ for r in records],
        }
        return counts
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def enospc_on_tmpfs(work: Path, shard_size: str = "1MB") -> dict:
    """A real ENOSPC: OUT on a small tmpfs (mounted in this process's private mount namespace) that another
    writer fills once the second output shard is written. Then the filler is removed and `--resume` runs."""
    from click.testing import CliRunner

    from fimoe_convert.cli import main

    work.mkdir(parents=True, exist_ok=True)
    src = make_fixture(work)
    mnt = work / "tmpfs"
    mnt.mkdir(exist_ok=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if m.returncode:
        return {"skipped": f"mount tmpfs: {m.stderr.strip()}"}
    try:
        out = mnt / "out"
        proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", *cli_args(src, out, shard_size)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        t0 = time.monotonic()
        filled = 0
        while proc.poll() is None and time.monotonic() - t0 < 120:
            shards = [n for n in _listing(out) if n.startswith("model-") and not n.endswith(TMP)]
            if len(shards) >= 2:
                with open(mnt / "filler", "wb", buffering=0) as f:
                    try:
                        while True:
                            filled += f.write(b"\0" * 65536)
                    except OSError as e:
                        if e.errno != 28:
                            raise
                break
            time.sleep(0.0005)
        stdout, stderr = proc.communicate(timeout=120)
        names = sorted(_listing(out))
        manifest = json.loads((out / MANIFEST).read_text()) if MANIFEST in names else None
        problems = []
        if proc.returncode == 0:
            problems.append("the conversion finished before the disk filled up (raced); run again")
        if "Traceback" in stderr or stderr.count("\n") != 1 or not stderr.startswith("error: "):
            problems.append(f"not one clean error line: {stderr!r}")
        if any(n.endswith(TMP) for n in names):
            problems.append(f"temporary files left: {names}")
        if manifest is None or manifest.get("complete") is not False or INDEX in names:
            problems.append(f"OUT looks complete or has no manifest: {names}")
        (mnt / "filler").unlink()
        r = CliRunner().invoke(main, cli_args(src, out, shard_size, "--resume"))
        v = CliRunner().invoke(main, ["verify", str(out)])
        return {"exit_code": proc.returncode, "stderr": stderr, "filled_bytes": filled, "left_in_out": names,
                "resume_exit_code": r.exit_code, "verify_exit_code": v.exit_code, "problems": problems}
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def summary(c: dict) -> str:
    phases = ", ".join(f"{p} {c['phases'][p]}" for p in PHASES if p in c["phases"])
    return "\n".join([
        f"kills: {c['kills']} (SIGKILL, {c['output_shards']}-shard output)",
        f"kill points by phase: {phases}",
        f"torn OUTs: {c['torn']}; verify passed on a torn OUT: {c['verify_passed_on_torn']} "
        f"({'never' if not c['verify_passed_on_torn'] else 'BUG'})",
        f"manifest complete while a shard was missing: {c['complete_early']}",
        f"resumes OK (exit 0, byte-identical to the reference): {c['resumes_ok']}/{c['kills']}",
        f"problems: {len(c['problems'])}",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--shard-size", default="1MB")
    ap.add_argument("--target", default="bf16")
    ap.add_argument("--writers", type=int, default=None, help="shards written at once (default: the CLI's)")
    ap.add_argument("--enospc-tmpfs", action="store_true",
                    help="instead: a real disk-full run on a small tmpfs (needs unshare -m and mount; prints JSON)")
    args = ap.parse_args()
    if args.enospc_tmpfs:
        if os.environ.get("FIMOE_PRIVATE_MOUNTS") != "1":  # re-run in a private mount namespace
            try:
                p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, *sys.argv],
                                   env={**os.environ, "FIMOE_PRIVATE_MOUNTS": "1"}, capture_output=True, text=True)
            except OSError as e:
                p = None
                print(json.dumps({"skipped": f"unshare: {e}"}))
            if p is not None:
                sys.stderr.write(p.stderr)
                print(p.stdout.strip() or json.dumps({"skipped": f"unshare -m: {p.stderr.strip()[-300:]}"}))
            return 0
        work = args.workdir or Path(tempfile.mkdtemp(prefix="fimoe-enospc-"))
        print(json.dumps(enospc_on_tmpfs(work, args.shard_size)))
        return 0
    t0 = time.monotonic()
    opts = ("--target", args.target, *(("--writers", str(args.writers)) if args.writers else ()))
    c = campaign(args.kills, args.seed, args.workdir, args.shard_size, convert_opts=opts)
    print(summary(c))
    print(f"seed {args.seed}, {time.monotonic() - t0:.0f} s")
    for p in c["problems"]:
        print("PROBLEM:", p)
    return 1 if c["problems"] or c["resumes_ok"] != c["kills"] else 0


if __name__ == "__main__":
    sys.exit(main())
