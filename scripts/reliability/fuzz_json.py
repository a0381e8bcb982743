#!/usr/bin/env python3
"""Fuzz every JSON file the tool reads (SRC's config.json and index, OUT's manifest and status files) through the
code that reads them: only the tool's own errors (FimoeError) may come out, each line naming the file.

    python3 scripts/reliability/fuzz_json.py [--examples 100000] [--seed 0]

Each input is a file's bytes, made by one of these strategies (hypothesis), for each kind of file:
- structured: the real file of a tiny checkpoint or output with values swapped at random places for any JSON
  value (wrong types, huge integers, deep nesting, hostile names like `../x`, lone surrogates), keys deleted
  or added;
- mutated: the real file's bytes with flips, insertions and deletions;
- raw: deep nesting, integers of 20 to 5000 digits, duplicate keys, NaN/Infinity, UTF-16/latin-1 text,
  arbitrary bytes.

What reads them (the consumers of each kind):
- config: read_json + model_spec_from_config + check_counts + check_experts against the tiny index, `inspect`'s
  variant name, the targets' validate() and update_config(); a share through open_source on a real folder;
- index: open_source on a real folder (names through the path rule, headers read);
- manifest: read_manifest (for verify and for --resume), verify_files on a real output, the files --overwrite
  would delete (all must lie inside OUT), --resume's comparison of the source, the runtime's block lookup;
- status: read_rank_status (a damaged file is skipped, never an error).

An escape is any other exception, a message of several lines or one that does not start with the file (or
`OUT`, `--resume`, the tensor) it is about, or an accepted input that breaks a promise (a deletion outside
OUT). Escapes are counted, not raised, and the first few are printed with their input.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package, wherever the installed one points

COUNT = {"n": 0, "accepted": 0, "rejected": 0, "escapes": 0}
ESCAPES: list[str] = []
KINDS = ("config", "index", "manifest", "status")


class Fixture:
    """A tiny checkpoint (SRC), a bf16 conversion of it (OUT), and scratch copies the inputs are written into."""

    def __init__(self, tmp: Path):
        from fimoe_convert import convert
        from fimoe_convert.files.sources.local import open_source
        from fimoe_convert.testing import make_checkpoint

        self.tmp = tmp
        self.src = make_checkpoint(tmp / "src", "tiny", layers=2, mtp=1, experts=4, shards=2)
        convert(str(self.src), str(tmp / "out"), "bf16")
        self.out = tmp / "out"
        self.source = open_source(str(self.src))
        self.texts = {"config": (self.src / "config.json").read_bytes(),
                      "index": (self.src / "model.safetensors.index.json").read_bytes(),
                      "manifest": (self.out / "fimoe-manifest.json").read_bytes(),
                      "status": json.dumps({"rank": 0, "files": json.loads((self.out / "fimoe-manifest.json")
                                                                          .read_text())["files"]}).encode()}
        self.work_src = tmp / "work-src"
        shutil.copytree(self.src, self.work_src)
        self.work_out = tmp / "work-out"
        shutil.copytree(self.out, self.work_out)
        self.outside = tmp / "outside.safetensors"  # what a hostile name may point at
        self.outside.write_bytes(b"outside")
        (self.work_out / "up").symlink_to(tmp)


def _one_line(e: BaseException, starts: re.Pattern) -> str | None:
    """None if `e` is a FimoeError whose every problem is one line matching `starts`; else why not."""
    from fimoe_convert.errors import FimoeError

    if not isinstance(e, FimoeError):
        return f"{e.__class__.__name__}: {e}"[:300] + "\n" + "".join(traceback.format_exception(e))[-1500:]
    for p in e.problems:
        if "\n" in p or not starts.match(p):
            return f"bad message: {p[:300]!r}"
    return None


def _escape(kind: str, raw: bytes, why: str) -> None:
    COUNT["escapes"] += 1
    if len(ESCAPES) < 5:
        ESCAPES.append(f"[{kind}] {why}\n    input: {raw[:300]!r}")


def feed(fx: Fixture, kind: str, raw: bytes) -> None:
    """Run `raw` as a file of `kind` through its consumers; count an escape if anything but a clean refusal or a
    kept promise comes out."""
    COUNT["n"] += 1
    try:
        accepted = CONSUMERS[kind](fx, raw)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - everything else is judged here
        why = _one_line(e, STARTS[kind](fx))
        if why:
            _escape(kind, raw, why)
        else:
            COUNT["rejected"] += 1
        return
    if accepted is not True:
        _escape(kind, raw, f"a promise broken: {accepted}")
    else:
        COUNT["accepted"] += 1


def _config(fx: Fixture, raw: bytes):
    from fimoe_convert.checkpoint import check_counts, model_spec_from_config, variant_name
    from fimoe_convert.errors import ValidationError
    from fimoe_convert.files.jsonfile import parse_json
    from fimoe_convert.files.sources.local import check_config, check_experts, open_source
    from fimoe_convert.kernels import get_kernel
    from fimoe_convert.targets import TargetOptions, make_target

    where = str(fx.work_src / "config.json")
    if COUNT["n"] % 10 == 0:  # a share through the whole of open_source, on a real folder
        (fx.work_src / "config.json").write_bytes(raw)
        try:
            open_source(str(fx.work_src))
        finally:
            (fx.work_src / "config.json").write_bytes(fx.texts["config"])
        return True
    config = parse_json(raw, where)
    check_config(config, where)
    model = model_spec_from_config(config, where)
    problems = check_counts(model, fx.source.weight_map, where)
    if problems:
        raise ValidationError(problems)
    tensors = {n: fx.source.info(n) for n in fx.source.weight_map}
    problems = check_experts(model, tensors)
    if problems:
        raise ValidationError(problems)
    variant_name(model, config)
    for name in ("bf16", "fp8_block"):
        tgt = make_target(get_kernel(name), model, TargetOptions())
        tgt.validate()
        json.dumps(tgt.update_config(config))
    return True


def _index(fx: Fixture, raw: bytes):
    from fimoe_convert.files.sources.local import open_source

    path = fx.work_src / "model.safetensors.index.json"
    path.write_bytes(raw)
    try:
        s = open_source(str(fx.work_src))
    finally:
        path.write_bytes(fx.texts["index"])
    root = fx.work_src.resolve()
    bad = [rel for rel in s.headers if not (fx.work_src / rel).resolve().is_relative_to(root)]
    return True if not bad else f"accepted shard names outside SRC: {bad[:3]}"


def _manifest(fx: Fixture, raw: bytes):
    from fimoe_convert.errors import InputError
    from fimoe_convert.files.output.folder import earlier_files, verify_files
    from fimoe_convert.files.output.manifest import read_manifest
    from fimoe_convert.resume import same_inputs

    path = fx.work_out / "fimoe-manifest.json"
    path.write_bytes(raw)
    try:
        victims = earlier_files(fx.work_out)  # never raises: a damaged manifest is taken over
        root = fx.work_out.resolve()
        outside = [str(p) for p in victims if not p.parent.resolve().is_relative_to(root)]
        if outside:
            return f"--overwrite would delete outside OUT: {outside[:3]}"
        try:
            read_manifest(fx.work_out, purpose="resume")
        except InputError:
            pass
        m = read_manifest(fx.work_out)
        res = verify_files(fx.work_out, m)
        assert all(isinstance(p, str) and "\n" not in p for p in res.problems), res.problems
        try:
            m.layer_record("layers.0", 0)
        except InputError:
            pass
        same_inputs(fx.work_out, m, fx.source)
    finally:
        path.write_bytes(fx.texts["manifest"])
    return True


def _status(fx: Fixture, raw: bytes):
    from fimoe_convert.files.output.manifest import read_rank_status

    path = fx.work_out / "fimoe-status.rank0.json"
    path.write_bytes(raw)
    try:
        files = read_rank_status(fx.work_out)
    finally:
        path.unlink()
    return True if isinstance(files, dict) else f"read_rank_status returned {type(files).__name__}"


CONSUMERS = {"config": _config, "index": _index, "manifest": _manifest, "status": _status}
# What an error about each kind of file may start with: the file, OUT, --resume, or the tensors or block it names
# (check_experts' lines, and the count of the problems summarized in one line).
_TENSORS = r"tensor '|(layers|mtp)\.\d+: |\d+ routed-expert tensors |and \d+ more "
STARTS = {
    "config": lambda fx: re.compile(rf"{re.escape(str(fx.work_src))}/|{_TENSORS}|--target |--ep-size "),
    "index": lambda fx: re.compile(rf"{re.escape(str(fx.work_src))}/|{_TENSORS}"),
    "manifest": lambda fx: re.compile(rf"{re.escape(str(fx.work_out))}/|OUT {re.escape(str(fx.work_out))}|--resume: |"
                                      rf"{re.escape(str(fx.src))}/"),
    "status": lambda fx: re.compile(re.escape(str(fx.work_out))),
}


# ----------------------------------------------------------------------------------------------- strategies


def _strategies(fx: Fixture):
    from hypothesis import strategies as st

    names = st.one_of(
        st.sampled_from(["../x", "/etc/passwd", "a/../../b", "up/outside.safetensors", "..", ".", "", "a\\b", "C:x",
                         "a\0b", "\ud800", "fimoe-manifest.json", ".fimoe-lock", "model-00001-of-00001.safetensors",
                         "config.json", "x" * 300, "up", str(fx.outside)]),
        st.text(max_size=12))
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.sampled_from([2**63 - 1, 2**63, -2**63,
                                                                                           10**30, 10**7, 10**9]),
                        st.floats(allow_nan=False, allow_infinity=False), names)
    values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(names, kids, max_size=4)), max_leaves=12)

    def paths(obj, prefix=()):
        """Every (path) to a value in `obj`."""
        yield prefix
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from paths(v, prefix + (k,))
        elif isinstance(obj, list):
            for i, v in enumerate(obj[:8]):
                yield from paths(v, prefix + (i,))

    @st.composite
    def structured(draw, kind):
        obj = copy.deepcopy(json.loads(fx.texts[kind]))
        every = list(paths(obj))
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(every))
            if not path:
                obj = draw(values) if draw(st.integers(0, 9)) == 0 else obj
                continue
            *head, last = path
            parent = obj
            try:
                for k in head:
                    parent = parent[k]
                op = draw(st.sampled_from(["set", "set", "set", "delete", "rename", "add"]))
                if op == "set":
                    parent[last] = draw(values)
                elif op == "delete":
                    del parent[last]
                elif op == "rename" and isinstance(parent, dict):
                    parent[draw(names)] = parent.pop(last)
                elif op == "add" and isinstance(parent, dict):
                    parent[draw(names)] = draw(values)
            except (KeyError, IndexError, TypeError):
                pass
        text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
        return text.encode("utf-8", "surrogatepass")

    @st.composite
    def mutated(draw, kind):
        b = bytearray(fx.texts[kind])
        for _ in range(draw(st.integers(1, 4))):
            if not b:
                break
            at = draw(st.integers(0, len(b) - 1))
            op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
            if op == "flip":
                b[at] ^= 1 << draw(st.integers(0, 7))
            elif op == "set":
                b[at] = draw(st.sampled_from(b'"[]{},:0\\-9e.\xff\x80 '))
            elif op == "insert":
                b[at:at] = draw(st.binary(min_size=1, max_size=4))
            else:
                del b[at:at + draw(st.integers(1, 8))]
        return bytes(b)

    @st.composite
    def raw(draw):
        what = draw(st.sampled_from(["deep", "bigint", "dupkeys", "constant", "encoding", "bytes", "value"]))
        if what == "deep":
            d = draw(st.sampled_from([63, 64, 65, 500, 1000, 5000, 100_000]))
            inner = draw(st.sampled_from(["[", '{"a":']))
            close = "]" if inner == "[" else "}"
            return ('{"weight_map":' + inner * d + "1" + close * d + "}").encode()
        if what == "bigint":
            digits = draw(st.sampled_from([19, 20, 21, 4300, 4301, 5000]))
            key = draw(st.sampled_from(["n_routed_experts", "size", "total_size", "rank"]))
            return f'{{"{key}": {draw(st.sampled_from(["", "-"]))}{"9" * digits}}}'.encode()
        if what == "dupkeys":
            return b'{"model_type": "deepseek_v4", "model_type": "deepseek_v4"}'
        if what == "constant":
            return f'{{"a": {draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]))}}}'.encode()
        if what == "encoding":
            enc = draw(st.sampled_from(["utf-16", "utf-32", "latin-1", "utf-8-sig"]))
            return json.dumps({"model_type": "deepseek_v4", "x": "\u00e9"}).encode(enc)
        if what == "bytes":
            return draw(st.binary(max_size=64))
        return json.dumps(draw(values)).encode("utf-8", "surrogatepass")

    return structured, mutated, raw


def run_hypothesis(examples: int, seed: int, log=print) -> dict:
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

    shares = {("config", "structured"): 0.18, ("config", "mutated"): 0.07, ("config", "raw"): 0.05,
              ("index", "structured"): 0.12, ("index", "mutated"): 0.06, ("index", "raw"): 0.04,
              ("manifest", "structured"): 0.26, ("manifest", "mutated"): 0.09, ("manifest", "raw"): 0.05,
              ("status", "structured"): 0.04, ("status", "mutated"): 0.02, ("status", "raw"): 0.02}
    cfg = dict(deadline=None, database=None, derandomize=False, suppress_health_check=list(HealthCheck),
               phases=[Phase.generate])
    per_mode: dict[str, int] = {}
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fimoe-fuzz-json-"))
    try:
        fx = Fixture(tmp)
        structured, mutated, raw = _strategies(fx)
        for i, ((kind, how), share) in enumerate(shares.items()):
            strategy = {"structured": structured(kind), "mutated": mutated(kind), "raw": raw()}[how]

            def one_of_kind(kind: str, strategy):
                @given(strategy)
                def one(data):
                    feed(fx, kind, data)
                return one

            test_one = one_of_kind(kind, strategy)

            want = max(1, round(examples * share))
            before = COUNT["n"]
            rounds = 0
            while COUNT["n"] - before < want and rounds < 50:  # hypothesis stops early on small spaces: reseed
                fn = settings(max_examples=want - (COUNT["n"] - before), **cfg)(test_one)
                hseed(seed * 1000 + i * 100 + rounds)(fn)()
                rounds += 1
            per_mode[f"{kind}/{how}"] = COUNT["n"] - before
            log(f"  {kind:8s} {how:10s} {per_mode[f'{kind}/{how}']:7d} inputs  "
                f"({time.monotonic() - t_start:6.1f} s so far, {COUNT['escapes']} escapes)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"inputs": COUNT["n"], "accepted": COUNT["accepted"], "rejected": COUNT["rejected"],
            "escapes": COUNT["escapes"], "examples": list(ESCAPES), "per_mode": per_mode,
            "seconds": time.monotonic() - t_start}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    r = run_hypothesis(args.examples, args.seed)
    for e in r["examples"]:
        print(e)
    print(f"fuzzed {r['inputs']} JSON inputs in {r['seconds']:.1f} s ({r['inputs'] / r['seconds']:.0f}/s): "
          f"{r['accepted']} accepted, {r['rejected']} rejected with a FimoeError, {r['escapes']} escapes")
    return 1 if r["escapes"] else 0


if __name__ == "__main__":
    sys.exit(main())
