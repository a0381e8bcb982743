#!/usr/bin/env python3
"""Fuzz the safetensors header parser/validator: only the tool's own errors (FimoeError) may escape.

    python3 scripts/reliability/fuzz_headers.py [--examples 100000] [--seed 0]          # hypothesis
    python3 scripts/reliability/fuzz_headers.py --engine atheris [--examples 100000]    # coverage-guided (libFuzzer)

Targets: `fimoe_convert.files.safetensors.header.parse_header` on in-memory files (the bulk), `read_header` on
real temporary files (a subset), and the path rule `paths.name_problem` (path safety).
Hypothesis strategies, each with a share of the examples:

- structured: headers built from dtypes/shapes/offsets that are valid, then perturbed (a wrong
  dtype, a negative/bool/float/huge dimension, shifted/overlapping/holey offsets, extra/missing keys,
  bad __metadata__), with length prefixes exact or near the limits (0, 7, n +/- 1, 100 MB +/- 1,
  2**64 - 1) and data sections exact, short or long;
- mutated: a valid header's bytes with random byte flips, insertions and deletions;
- json: arbitrary JSON values as the header (deep nesting, 5000-digit ints, odd unicode);
- raw: arbitrary bytes as the whole file;
- file: the structured/raw inputs written to a temporary file and read back with `read_header`;
- paths: random index shard names (`..`, absolute, backslashes, drive letters, NUL, links) for
  `name_problem`: accepted names must resolve inside the checkpoint folder.

For accepted headers it also checks the promises: tensors contiguous from the data start to the end
of the file, inside it, and bytes == shape x dtype. Prints the number of inputs and the duration.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's package, wherever the installed one points

COUNT = {"n": 0, "accepted": 0, "rejected": 0}


def _check_accepted(h, file_size: int) -> None:
    from fimoe_convert.dtypes import DTYPES, tensor_nbytes

    cursor = h.data_start
    for t in sorted(h.tensors.values(), key=lambda t: (t.start, t.end)):
        assert t.dtype in DTYPES, t
        assert t.start == cursor and t.end >= t.start, (t, cursor)
        assert t.end - t.start == tensor_nbytes(t.dtype, t.shape), t
        cursor = t.end
    assert cursor == file_size, (cursor, file_size)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in h.metadata.items())


def parse_one(raw: bytes, file_size: int | None = None) -> str:
    """Run parse_header on the in-memory file `raw` (its size may be claimed larger than `raw`)."""
    from fimoe_convert.errors import FimoeError
    from fimoe_convert.files.safetensors.header import parse_header

    size = len(raw) if file_size is None else file_size
    COUNT["n"] += 1
    try:
        h = parse_header(raw[:8], lambda n: raw[8:8 + n], size, "fuzz.safetensors")
    except FimoeError as e:
        assert str(e) and "\n" not in str(e), repr(e)  # one line naming the file
        assert str(e).startswith("fuzz.safetensors: "), str(e)[:200]
        COUNT["rejected"] += 1
        return "rejected"
    _check_accepted(h, size)
    COUNT["accepted"] += 1
    return "accepted"


def read_one(raw: bytes, folder: Path) -> str:
    """Write `raw` to a temporary file and run read_header on it."""
    from fimoe_convert.errors import FimoeError
    from fimoe_convert.files.safetensors.header import read_header

    path = folder / "x.safetensors"
    path.write_bytes(raw)
    COUNT["n"] += 1
    try:
        h = read_header(path)
    except FimoeError as e:
        assert str(path) in str(e) and "\n" not in str(e), repr(e)
        COUNT["rejected"] += 1
        return "rejected"
    _check_accepted(h, len(raw))
    COUNT["accepted"] += 1
    return "accepted"


def path_one(rel: str, root: Path, allowed: Path) -> str:
    from fimoe_convert.files.paths import name_problem

    COUNT["n"] += 1
    problem = name_problem(rel, root, "index", "shard", "the checkpoint", allowed)
    if problem is None:
        assert (root / rel).resolve().is_relative_to(allowed), rel
        assert not os.path.isabs(rel) and ".." not in rel.split("/"), rel
        COUNT["accepted"] += 1
        return "accepted"
    assert "\n" not in problem
    COUNT["rejected"] += 1
    return "rejected"


# ----------------------------------------------------------------------------------------- hypothesis


def _strategies():
    from hypothesis import strategies as st

    from fimoe_convert.dtypes import DTYPES, tensor_nbytes
    from fimoe_convert.files.safetensors.header import MAX_HEADER_BYTES

    dtypes = st.sampled_from(sorted(DTYPES))
    bad_dtypes = st.sampled_from(["F8", "f32", "", "BF16 ", "Q4_0", "F4\0", 17, None, ["F32"]])
    dims = st.lists(st.integers(0, 9), max_size=4)
    bad_dims = st.one_of(
        st.lists(st.one_of(st.integers(-3, -1), st.booleans(), st.floats(allow_nan=True), st.just(2**70),
                           st.text(max_size=2), st.none()), min_size=1, max_size=3),
        st.just("3"), st.none(), st.integers(), st.just({"a": 1}))

    @st.composite
    def structured(draw):
        n_t = draw(st.integers(0, 6))
        names = draw(st.lists(st.text(min_size=0, max_size=12), min_size=n_t, max_size=n_t, unique=True))
        header: dict = {}
        offset = 0
        for name in names:
            dtype = draw(dtypes)
            shape = draw(dims)
            nbytes = tensor_nbytes(dtype, shape)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        data_len = offset
        # perturbations
        for _ in range(draw(st.integers(0, 2))):
            if not names:
                break
            name = draw(st.sampled_from(names))
            e = header[name]
            if not isinstance(e, dict):
                continue
            what = draw(st.sampled_from(["dtype", "shape", "offsets", "shift", "extra", "missing", "entry"]))
            if what == "dtype":
                e["dtype"] = draw(bad_dtypes)
            elif what == "shape":
                e["shape"] = draw(bad_dims)
            elif what == "offsets":
                e["data_offsets"] = draw(st.one_of(
                    st.lists(st.integers(-5, data_len + 5), min_size=0, max_size=3),
                    st.tuples(st.floats(), st.floats()).map(list), st.just([True, 1]), st.just("0,1"),
                    st.just([2**64, 2**64 + 1])))
            elif what == "shift":
                d = draw(st.integers(-3, 3))
                offs = e.get("data_offsets")
                if isinstance(offs, list) and all(type(o) is int for o in offs):
                    e["data_offsets"] = [o + d for o in offs]
            elif what == "extra":
                e[draw(st.text(max_size=5))] = draw(st.integers())
            elif what == "missing":
                e.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])), None)
            else:
                header[name] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.none())))
        if draw(st.booleans()):
            header["__metadata__"] = draw(st.one_of(
                st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
                st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.none()), min_size=1, max_size=2),
                st.lists(st.text()), st.text(max_size=3), st.none(), st.just({})))
        body = json.dumps(header, ensure_ascii=draw(st.booleans())).encode()
        pad = draw(st.sampled_from([-len(body) % 8, 0, 1, 7]))
        body += draw(st.sampled_from([b" ", b"\0", b"\n", b"x"])) * pad
        n = len(body)
        length = draw(st.one_of(
            st.just(n), st.just(n), st.just(n),
            st.sampled_from([0, 1, 7, n - 1, n + 1, n + 8, MAX_HEADER_BYTES - 1, MAX_HEADER_BYTES,
                             MAX_HEADER_BYTES + 1, 2**32, 2**63, 2**64 - 1]).filter(lambda v: 0 <= v < 2**64),
            st.integers(0, 2**64 - 1)))
        data_delta = draw(st.sampled_from([0, 0, 0, 0, -1, 1, -8, 8]))
        data = b"\x00" * max(0, min(data_len + data_delta, 1 << 16))
        raw = struct.pack("<Q", length) + body + data
        # Claimed size: the real bytes, or a larger file whose extra bytes are never read (near the limits).
        claim = draw(st.one_of(st.none(), st.none(), st.none(),
                               st.sampled_from([8 + length, 8 + length + data_len, 7, 0, MAX_HEADER_BYTES + 8])))
        if claim is not None and claim < len(raw):
            claim = None
        return raw, claim

    @st.composite
    def mutated(draw):
        raw, _ = draw(structured())
        b = bytearray(raw)
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
            if not b:
                break
            at = draw(st.integers(0, len(b) - 1))
            if op == "flip":
                b[at] ^= 1 << draw(st.integers(0, 7))
            elif op == "set":
                b[at] = draw(st.sampled_from([0, 0x22, 0x5B, 0x7B, 0x7D, 0x2C, 0x3A, 0xFF, 0x80, 0x5C]))
            elif op == "insert":
                b[at:at] = draw(st.binary(min_size=1, max_size=4))
            else:
                del b[at:at + draw(st.integers(1, 4))]
        # keep the length prefix consistent half the time, so mutations reach the JSON and offset checks
        if len(b) >= 8 and draw(st.booleans()):
            old = struct.unpack("<Q", raw[:8])[0]
            new = max(0, min(old + (len(b) - len(raw)), len(b) - 8))
            b[:8] = struct.pack("<Q", new)
        return bytes(b)

    json_values = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6)),
        lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=4), kids, max_size=4)),
        max_leaves=20)

    @st.composite
    def json_header(draw):
        kind = draw(st.sampled_from(["value", "value", "deep", "bigint", "dupkeys", "text"]))
        if kind == "value":
            body = json.dumps(draw(json_values)).encode()
        elif kind == "deep":
            d = draw(st.sampled_from([10, 500, 999, 1000, 5000, 100_000]))
            inner = draw(st.sampled_from(["[", '{"a":']))
            body = (inner * d).encode() + draw(st.sampled_from([b"", b"1" + (b"]" if inner == "[" else b"}") * d]))
            body = b'{"t":' + body + b"}" if draw(st.booleans()) else body
        elif kind == "bigint":
            digits = draw(st.sampled_from([4300, 4301, 5000, 20000]))
            where = draw(st.sampled_from(["top", "shape", "offset"]))
            big = "9" * digits
            body = {"top": big,
                    "shape": f'{{"t":{{"dtype":"U8","shape":[{big}],"data_offsets":[0,1]}}}}',
                    "offset": f'{{"t":{{"dtype":"U8","shape":[1],"data_offsets":[0,{big}]}}}}'}[where].encode()
        elif kind == "dupkeys":
            body = (
                b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                b'"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
            )
        else:
            body = draw(st.text(max_size=40)).encode("utf-8", "surrogatepass")
        enc = draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "utf-32", "latin-1"]))
        try:
            body = body.decode("utf-8", "surrogatepass").encode(enc, "surrogatepass")
        except (UnicodeError, LookupError):
            pass
        data = b"\x00" * draw(st.integers(0, 16))
        return struct.pack("<Q", len(body)) + body + data

    raw_files = st.one_of(
        st.binary(max_size=64),
        st.tuples(st.sampled_from([0, 1, 2, 8, 100, MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1, 2**64 - 1]),
                  st.binary(max_size=64)).map(lambda t: struct.pack("<Q", t[0]) + t[1]))

    rel_paths = st.one_of(
        st.text(max_size=24),
        st.lists(st.sampled_from(["..", ".", "", "a", "b.safetensors", "/", "\\", "C:", "~", "\0", "link",
                                  "loop", "out", "x/../..", "%2e%2e"]), min_size=1, max_size=5).map("/".join),
        st.sampled_from(["../x.safetensors", "/etc/passwd", "a/../../b", "\\\\server\\share", "C:\\x",
                         "link/../../x", "link/x.safetensors", "out/x.safetensors", "loop/x", "ok.safetensors"]))
    return structured, mutated, json_header, raw_files, rel_paths


def run_hypothesis(examples: int, seed: int, log=print) -> dict:
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

    structured, mutated, json_header, raw_files, rel_paths = _strategies()
    shares = {"structured": 0.40, "mutated": 0.25, "json": 0.12, "raw": 0.12, "file": 0.06, "paths": 0.05}
    cfg = dict(deadline=None, database=None, derandomize=False, print_blob=True,
               suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    per_mode: dict[str, int] = {}
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fimoe-fuzz-"))
    try:
        root = tmp / "ckpt"
        root.mkdir()
        (root / "ok.safetensors").write_bytes(b"")
        os.symlink(tmp, root / "link")      # leaves the checkpoint
        os.symlink(root / "loop", root / "loop")  # a link loop
        (tmp / "out").mkdir()
        os.symlink(tmp / "out", root / "out")
        allowed = root.resolve()
        files_dir = tmp / "files"
        files_dir.mkdir()

        @given(structured())
        def t_structured(x):
            raw, claim = x
            parse_one(raw, claim)

        @given(mutated())
        def t_mutated(raw):
            parse_one(raw)

        @given(json_header())
        def t_json(raw):
            parse_one(raw)

        @given(raw_files)
        def t_raw(raw):
            parse_one(raw)

        from hypothesis import strategies as st

        @given(st.one_of(structured().map(lambda x: x[0]), mutated(), raw_files))
        def t_file(raw):
            read_one(raw, files_dir)

        @given(rel_paths)
        def t_paths(rel):
            path_one(rel, root, allowed)

        tests = {"structured": t_structured, "mutated": t_mutated, "json": t_json, "raw": t_raw,
                 "file": t_file, "paths": t_paths}
        for i, (mode, share) in enumerate(shares.items()):
            want = max(1, round(examples * share))
            before = COUNT["n"]
            # hypothesis stops a run early once it has seen every distinct input of a small space;
            # repeat with new seeds until this mode has had its share
            rounds = 0
            while COUNT["n"] - before < want and rounds < 50:
                left = want - (COUNT["n"] - before)
                fn = settings(max_examples=left, **cfg)(tests[mode])
                hseed(seed * 1000 + i * 100 + rounds)(fn)()
                rounds += 1
            per_mode[mode] = COUNT["n"] - before
            log(f"  {mode:10s} {per_mode[mode]:7d} inputs  ({time.monotonic() - t_start:6.1f} s so far)")
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return {"inputs": COUNT["n"], "accepted": COUNT["accepted"], "rejected": COUNT["rejected"],
            "per_mode": per_mode, "seconds": time.monotonic() - t_start}


# -------------------------------------------------------------------------------------------- atheris


def run_atheris(examples: int, seed: int) -> None:
    import atheris
    import torch  # noqa: F401  (heavy, imported uninstrumented)

    import fimoe_convert.dtypes as dt
    import fimoe_convert.files.safetensors.header as sio

    # instrument_imports misses modules loaded through the editable-install finder: instrument by function
    sio.parse_header = atheris.instrument_func(sio.parse_header)
    dt.tensor_nbytes = atheris.instrument_func(dt.tensor_nbytes)

    t0 = time.monotonic()

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        mode = fdp.ConsumeIntInRange(0, 3)
        if mode == 0:  # raw file
            parse_one(fdp.ConsumeBytes(fdp.remaining_bytes()))
        else:  # a body with a consistent length prefix (reaches the JSON and offset checks), maybe extra data
            body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096))
            extra = fdp.ConsumeIntInRange(0, 64) if mode == 2 else 0
            length = len(body) if mode != 3 else fdp.ConsumeIntInRange(0, 2**64 - 1)
            parse_one(struct.pack("<Q", length) + body + b"\0" * extra)
        if COUNT["n"] % 20000 == 0:
            print(f"  atheris: {COUNT['n']} inputs, {time.monotonic() - t0:.1f} s, "
                  f"{COUNT['accepted']} accepted", flush=True)

    seeds = Path(tempfile.gettempdir()) / "fimoe-atheris-corpus"  # libFuzzer's corpus, kept between runs
    seeds.mkdir(exist_ok=True)
    valid = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}}'
    for mode in (1, 2):  # FuzzedDataProvider reads the ints it consumes from the END of the input
        (seeds / f"valid{mode}").write_bytes(valid + b"\0" * 8 + bytes([0, len(valid), 8, mode]))
    (seeds / "raw").write_bytes(struct.pack("<Q", len(valid)) + valid + b"\0" * 8 + b"\0")
    from fimoe_convert.dtypes import DTYPES

    tokens = ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '":"', '{"', '"}', '":[', '],"', ":{",
              "}}", "[0,", ",0]", "[]", "1e9", "-1", "18446744073709551616", *[f'"{d}"' for d in DTYPES]]
    (seeds.parent / f"{seeds.name}.dict").write_text("".join(f"{json.dumps(t)}\n" for t in tokens))
    atheris.Setup([sys.argv[0], f"-runs={examples}", f"-seed={seed or 1}", "-max_len=8192",
                   f"-dict={seeds.parent / (seeds.name + '.dict')}", str(seeds)], one_input)
    atheris.Fuzz()  # libFuzzer prints "Done N runs in S second(s)" and exits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine", choices=["hypothesis", "atheris"], default="hypothesis")
    args = ap.parse_args()
    if args.engine == "atheris":
        run_atheris(args.examples, args.seed)
        return 0
    r = run_hypothesis(args.examples, args.seed)
    print(f"fuzzed {r['inputs']} inputs in {r['seconds']:.1f} s ({r['inputs'] / r['seconds']:.0f}/s): "
          f"{r['accepted']} accepted, {r['rejected']} rejected with a FimoeError, 0 other exceptions escaped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
