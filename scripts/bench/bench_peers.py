"""fimoe-convert against the peer converters users run today, on one fixture, measured in one run.

Each conversion runs in a fresh child process (ours: `python3 -m fimoe_convert SRC OUT --target T`), the
rounds interleave every command (round 1 runs each once, then round 2, ...) so that a load change on a shared
host hits all of them alike, and each command's median wall time and median peak RSS (the child's
`ru_maxrss` from `os.wait4`) over the rounds is printed, then the ratios peer/ours against our conversion
with the same output (FP8 128x128 or BF16), and ours against ours. The source is read once before the rounds
(page cache warm for all); each output folder is deleted between runs, outside the timing.

usage: python3 scripts/bench/bench_peers.py [--src DIR | --layers 2 --experts 16] [--rounds 3] [--work DIR]
           [--peers-dir DIR] [--peer NAME=TEMPLATE ...] [--bf16-peer NAME=TEMPLATE ...] [--baseline-tree DIR]

A TEMPLATE is a command line with {src}, {out} and {python} placeholders, split with shlex (no shell).
`--peer` commands write FP8 128x128 experts and are compared with our `fp8_block`; `--bf16-peer` commands
write BF16 experts and are compared with our `bf16`. `--baseline-tree DIR` adds our `fp8_block` run from
another checkout of this repository (say a `git worktree` of an older commit) as one more command.

Peer recipe (`--peers-dir DIR` adds these three when their files are there; nothing of them is in this repo):
- miles `tools/convert_mxfp4_to_fp8.py` (radixark/miles commit ca8d2450036544b64b7cb7785f0664422641a0ce,
  PR #2717), saved as DIR/miles-ca8d245/tools/convert_mxfp4_to_fp8.py; it runs on the CPU as published:
      {python} DIR/miles-ca8d245/tools/convert_mxfp4_to_fp8.py --model-dir {src} --save-dir {out} --device cpu
- DeepSeek's `inference/convert.py` of DeepSeek-V4-Flash (as copied verbatim into GitHub
  Mockingjay1316/deepseek-v4-flash-spark, commit 0825add42734731a285e30f657b0ccfc5bad74c9,
  inference/convert.py), saved as DIR/deepseek-v4-inference/convert.py; CPU as published; one MP rank so
  every expert is converted once:
      {python} DIR/deepseek-v4-inference/convert.py --hf-ckpt-path {src} --save-path {out}
          --n-experts <n_routed_experts of SRC> --model-parallel 1 --expert-dtype fp8
- miles `tools/fp8_cast_bf16.py` with DeepSeek V4 FP4 support (radixark/miles PR #2044 head,
  commit 8ef5433dee552a406896d1559d241fc2f5318a5c, checked out at DIR/miles). As published it needs CUDA and
  Triton, and sglang for the V4 name remap. DIR/miles_fp8_cast_bf16_cpu.py runs it unchanged on the CPU ("torch
  path"): a stub `triton` module, `load_file(device="cpu")`, its two Triton kernels replaced by the same
  float32 product in torch ops, and sglang's `remap_weight_name_to_dpsk_hf_format` from DIR/dpsk_hf_remap.py
  (the copy a later miles vendors):
      {python} DIR/miles_fp8_cast_bf16_cpu.py --input-fp8-hf-path {src} --output-bf16-hf-path {out}
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READ_BLOCK = 64 * 2**20  # bytes per read call when warming the page cache


@dataclass
class Command:
    name: str
    output: str  # "fp8" or "bf16": which of ours it is compared with
    argv: list[str]
    env: dict[str, str] | None = None
    walls: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)  # bytes

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def peak(self) -> float:
        return statistics.median(self.rss)


def ours(name: str, tree: Path, target: str, output: str) -> Command:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # PYTHONPATH wins over an editable install elsewhere
    return Command(
        name, output, [sys.executable, "-m", "fimoe_convert", "{src}", "{out}", "--target", target, "-q"], env
    )


def parse_peer(spec: str, output: str) -> Command:
    name, sep, template = spec.partition("=")
    if not sep or not name or not template:
        raise SystemExit(f"--peer {spec!r}: expected NAME=TEMPLATE")
    return Command(name, output, shlex.split(template))


def recipe_peers(peers: Path, src: Path) -> list[Command]:
    n_experts = _n_experts(src)
    py = "{python}"
    recipes = [
        ("miles convert_mxfp4_to_fp8", "fp8", peers / "miles-ca8d245/tools/convert_mxfp4_to_fp8.py",
         "--model-dir {src} --save-dir {out} --device cpu"),
        ("deepseek convert.py fp8", "fp8", peers / "deepseek-v4-inference/convert.py",
         f"--hf-ckpt-path {{src}} --save-path {{out}} --n-experts {n_experts} --model-parallel 1 --expert-dtype fp8"),
        ("miles fp8_cast_bf16", "bf16", peers / "miles_fp8_cast_bf16_cpu.py",
         "--input-fp8-hf-path {src} --output-bf16-hf-path {out}"),
    ]
    found = []
    for name, output, script, args in recipes:
        if script.exists():
            found.append(Command(name, output, [py, str(script), *shlex.split(args)]))
        else:
            print(f"peer {name}: {script} not found, left out")
    return found


def _n_experts(src: Path) -> int:
    cfg = json.loads((src / "config.json").read_text())
    return int(cfg.get("n_routed_experts") or cfg.get("text_config", {}).get("n_routed_experts"))


def warm(src: Path) -> None:
    for p in sorted(src.iterdir()):
        if p.is_file():
            with open(p, "rb", buffering=0) as f:
                while f.read(READ_BLOCK):
                    pass


def run_once(cmd: Command, src: Path, out: Path) -> None:
    argv = [a.format(src=src, out=out, python=sys.executable) for a in cmd.argv]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    # cwd: a folder with no package in it, since `python3 -m` puts the cwd ahead of PYTHONPATH
    proc = subprocess.Popen(argv, env=cmd.env, cwd=out.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # ru_maxrss of that child (and of any child it waited for)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{cmd.name} failed ({status}): {shlex.join(argv)}\n{stderr.decode(errors='replace')[-2000:]}")
    cmd.walls.append(wall)
    cmd.rss.append(usage.ru_maxrss * 1024)
    shutil.rmtree(out, ignore_errors=True)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", help="an existing checkpoint folder (default: make the fixture)")
    ap.add_argument("--layers", type=int, default=2, help="fixture: MoE layers (plus 1 MTP block)")
    ap.add_argument("--experts", type=int, default=16, help="fixture: routed experts per layer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/fimoe-bench-peers")
    ap.add_argument("--peers-dir", help="add the peers of the recipe above found in this folder")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=TEMPLATE", help="an FP8 128x128 peer")
    ap.add_argument("--bf16-peer", action="append", default=[], metavar="NAME=TEMPLATE", help="a BF16 peer")
    ap.add_argument("--baseline-tree", help="also run fp8_block from this checkout of fimoe-convert")
    args = ap.parse_args()

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.src:
        src = Path(args.src).resolve()
        fixture = f"{src}"
    else:
        sys.path.insert(0, str(REPO))
        from fimoe_convert.testing import make_checkpoint

        src = make_checkpoint(work / "src", "flash-geometry", layers=args.layers, experts=args.experts)
        fixture = f"flash-geometry (H=4096, I=2048), {args.experts} experts, {args.layers} layers + 1 MTP"
    in_bytes = sum(p.stat().st_size for p in src.iterdir() if p.is_file())

    cmds = [ours("fimoe-convert fp8_block", REPO, "fp8_block", "fp8"), ours("fimoe-convert bf16", REPO, "bf16", "bf16")]
    if args.baseline_tree:
        base = Path(args.baseline_tree).resolve()
        if not (base / "fimoe_convert").is_dir():
            raise SystemExit(f"--baseline-tree {base}: no fimoe_convert package there")
        cmds.append(ours("fimoe-convert fp8_block (baseline)", base, "fp8_block", "fp8"))
    if args.peers_dir:
        cmds += recipe_peers(Path(args.peers_dir).resolve(), src)
    cmds += [parse_peer(p, "fp8") for p in args.peer] + [parse_peer(p, "bf16") for p in args.bf16_peer]

    print(f"fixture: {fixture}; {in_bytes / 1e9:.2f} GB in {src}")
    print(f"before: {load()}")
    warm(src)
    for r in range(args.rounds):
        for cmd in cmds:
            run_once(cmd, src, work / "out")
        print(f"round {r + 1}/{args.rounds} done: {load()}", flush=True)

    width = max(len(c.name) for c in cmds)
    print(f"\n{'command':<{width}}  output  median s  peak RSS GB (median)  runs (s)")
    for c in cmds:
        print(f"{c.name:<{width}}  {c.output:<6}  {c.wall:8.2f}  {c.peak / 1e9:20.2f}  "
              + " ".join(f"{w:.2f}" for w in c.walls))
    ref = {"fp8": cmds[0], "bf16": cmds[1]}
    print()
    for c in cmds[2:]:
        o = ref[c.output]
        print(f"ratio time {c.name} / {o.name}: {c.wall / o.wall:.2f}x; peak RSS: {c.peak / o.peak:.2f}x")
    peers_fp8 = [c for c in cmds[2:] if c.output == "fp8" and not c.name.startswith("fimoe-convert")]
    if peers_fp8:
        fastest = min(peers_fp8, key=lambda c: c.wall)
        print(f"ratio time fastest FP8 peer ({fastest.name}) / fimoe-convert fp8_block: "
              f"{fastest.wall / cmds[0].wall:.2f}x (goal >= 2x)")
    peers_bf16 = [c for c in cmds[2:] if c.output == "bf16"]
    if peers_bf16:
        fastest = min(peers_bf16, key=lambda c: c.wall)
        print(f"ratio time fastest BF16 peer ({fastest.name}) / fimoe-convert bf16: "
              f"{fastest.wall / cmds[1].wall:.2f}x (goal >= 4x)")
    peers = [c for c in cmds[2:] if not c.name.startswith("fimoe-convert")]
    if peers:
        lowest = min(peers, key=lambda c: c.peak)
        print(f"ratio peak RSS lowest peer ({lowest.name}) / highest of ours: "
              f"{lowest.peak / max(cmds[0].peak, cmds[1].peak):.2f}x (goal > 1x)")
    print(f"ours vs ours: fp8_block / bf16 time {cmds[0].wall / cmds[1].wall:.2f}x")
    print(f"after: {load()}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
