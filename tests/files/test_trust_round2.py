"""Trust boundary, second pass: an output downloaded from the Hub is loaded by other people's servers, so its manifest
is attacker-controlled on the serving side too. One section per class: what the runtime rebuilds from a structure,
the OUT lock, OUT spelled through links, the input identity --resume trusts, Hub requests and signals, verify --deep
and a changed source. Every refusal is one line naming the file, and leaves the victim untouched."""

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_reliability import child_env, refused
from test_trust import interrupted_run

import fimoe_convert.cli as cli_mod
from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError, ValidationError, one_line
from fimoe_convert.files.names import MANIFEST_NAME
from fimoe_convert.files.output.lock import LOCK_NAME, OutLock
from fimoe_convert.kernels import BY_NAME, KERNELS
from fimoe_convert.numerics.structure_check import structure_problem

CAKE = "sm120_mxfp4_mxfp8_bf16_cake"
CAKE_CLASS = next(iter(BY_NAME[CAKE].structure_classes))


def cli(*args):
    return CliRunner().invoke(cli_mod.main, [str(a) for a in args])


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# ------------------------------------------------------------- 1. the runtime rebuilds only the kernel's own types


@pytest.fixture(scope="module")
def cake_out(tmp_path_factory):
    """A finished sm120 cake output (its structure is a FlashInfer dataclass with tensor and int/bool fields)."""
    pytest.importorskip("flashinfer")
    from fimoe_convert.testing import make_checkpoint

    base = tmp_path_factory.mktemp("cake")
    src = make_checkpoint(base / "src", "tiny", layers=1, hash_layers=0, mtp=0, extreme_scales=False)
    convert(str(src), str(base / "out"), CAKE)
    return base / "out"


def _set(path: list, value):
    """A change of the structure: the node at `path` (keys into the real structure) becomes `value`."""
    def change(s):
        node = s
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value(copy.deepcopy(node[path[-1]])) if callable(value) else value
        return s
    return change


SENTINEL = "/tmp/fimoe-trust-round2-pwned"
STRUCTURES = {
    # name: (change of the real structure, text of the one-line refusal)
    "os-system": (
        lambda s: {"dataclass": "flashinfer.jit:os.system", "fields": {"command": {"value": f"touch {SENTINEL}"}}},
        r"names the class 'flashinfer\.jit:os\.system', which is not one this target's kernel returns",
    ),
    "import-module": (
        lambda s: {"dataclass": "flashinfer:importlib.import_module", "fields": {"name": {"value": "os"}}},
        r"names the class 'flashinfer:importlib\.import_module', which is not one",
    ),
    "class-inside-a-tuple": (
        lambda s: {"tuple": [s, {"dataclass": "builtins:eval", "fields": {}}]},
        r"structure\[1\]: names the class 'builtins:eval'",
    ),
    "allowed-class-extra-field": (
        _set(["fields", "evil"], {"value": 1}),
        r"has the fields \[.*\], the structure gives",
    ),
    "allowed-class-missing-field": (
        lambda s: {**s, "fields": {k: v for k, v in s["fields"].items() if k != "w1_fp4"}},
        r"TransformedCakeMegaWeights has the fields",
    ),
    "value-for-a-tensor-field": (
        _set(["fields", "w1_fp4"], {"value": 3}),
        r"structure\.w1_fp4: a plain value where the kernel's object holds a tensor",
    ),
    "bool-for-an-int-field": (
        _set(["fields", "hidden_size"], {"value": True}),
        r"structure\.hidden_size: expected a plain int value",
    ),
    "tensor-for-an-int-field": (
        _set(["fields", "local_experts"], lambda n: {"tensor": "x", "dtype": "uint8", "shape": [1]}),
        r"structure\.local_experts: expected a plain int value",
    ),
    "none-for-a-tensor-field": (_set(["fields", "w2_sfb"], {"none": True}), r"structure\.w2_sfb: an empty slot here"),
    "unknown-dtype": (
        _set(["fields", "w1_fp4", "dtype"], "__class__"),
        r"structure\.w1_fp4: tensor node .* with "
        r"dtype '__class__'",
    ),
    "bytes-of-another-shape": (
        _set(["fields", "w1_fp4", "shape"], lambda sh: [sh[0] * 2, *sh[1:]]),
        r"holds \d+ bytes.*needs \d+",
    ),
    "negative-stride": (
        _set(["fields", "w2_fp4"], lambda n: {**n, "stride": [-1] * len(n["shape"])}),
        r"structure\.w2_fp4: tensor .* has stride",
    ),
    "extra-key": (
        _set(["fields", "w2_b8"], lambda n: {**n, "code": "print(1)"}),
        r"structure\.w2_b8: not a node "
        r"fimoe-convert writes",
    ),
    "plain-values-only": (
        lambda s: {"tuple": [{"value": 1}, {"value": "x"}]},
        r"structure\[0\]: a plain value where the kernel's object holds a tensor",
    ),
    "deep-nesting": (lambda s: json.loads('{"tuple": [' * 20 + "]}" * 20), r"more than 10000 nodes or 16 levels"),
    "not-an-object": (lambda s: ["tuple"], r"not a node fimoe-convert writes \(list\)|no structure object"),
}


@pytest.mark.parametrize("case", STRUCTURES)
def test_the_loader_and_verify_rebuild_only_the_kernels_declared_types(cake_out, tmp_path, case):
    from fimoe_convert.runtime import load_transformed_weights, mega_config

    change, match = STRUCTURES[case]
    out = tmp_path / "out"
    shutil.copytree(cake_out, out)
    edit_json(out / MANIFEST_NAME, lambda m: m["layers"]["layers.0"]["0"].update(
        structure=change(m["layers"]["layers.0"]["0"]["structure"])))
    with pytest.raises(InputError, match=match) as e:
        load_transformed_weights(out, "layers.0", 0)
    assert "\n" not in str(e.value) and "'layers.0'" in str(e.value) and str(e.value).startswith(str(out))
    with pytest.raises(Exception, match=match):
        mega_config(out, "layers.0", 0, device="cpu")
    problems = verify(str(out)).problems
    assert len(problems) == 1 and "block 'layers.0' rank 0" in problems[0], problems
    assert re.search(match, problems[0]), problems
    assert refused(cli("verify", out), match).startswith("error: ")
    assert not Path(SENTINEL).exists()


def test_an_untouched_structure_loads_and_verifies(cake_out):
    from fimoe_convert.runtime import load_transformed_weights

    obj = load_transformed_weights(cake_out, "layers.0", 0)
    assert type(obj).__module__ + ":" + type(obj).__qualname__ == CAKE_CLASS
    assert type(obj.hidden_size) is int and type(obj.has_shared_expert) is bool
    assert verify(str(cake_out)).problems == []


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k.structure_classes], ids=lambda k: k.name)
def test_the_kernel_tables_classes_are_flashinfers_with_those_fields(kernel):
    pytest.importorskip("flashinfer")
    from fimoe_convert.runtime.loader import structure_classes

    for name, cls in structure_classes(kernel).items():
        assert f"{cls.__module__}:{cls.__qualname__}" == name


TENSOR = {"tensor": "t", "dtype": "uint8", "shape": [2, 3]}
PURE = [  # (structure, classes, stored bytes, problem or None): the check alone, without FlashInfer
    ({"tuple": [TENSOR, {"none": True}]}, {}, {"t": 6}, None),
    ({"tuple": [TENSOR]}, {}, {"t": 7}, r"holds 7 bytes; its node \(uint8 \[2, 3\]\) needs 6"),
    ({"tuple": [TENSOR]}, {}, {}, r"'t' is not in the output"),
    ({**TENSOR, "dtype": "float4_e2m1fn_x2"}, {}, {"t": 6}, None),
    ({**TENSOR, "dtype": "bfloat16", "stride": [1, 2]}, {}, {"t": 12}, None),  # span 1+1*1+2*2 = 6 elements
    ({**TENSOR, "stride": [1]}, {}, {"t": 6}, r"has stride \[1\] for shape \[2, 3\]"),
    ({**TENSOR, "shape": [2**41]}, {}, None, r"a list of sizes"),
    ({**TENSOR, "shape": [True]}, {}, None, r"a list of sizes"),
    ({"none": True}, {}, None, r"structure: an empty slot here"),
    ({"value": 1}, {}, None, r"a plain value"),
    ({"dataclass": "m:C", "fields": {"a": {"value": 1.5}}}, {"m:C": {"a": "float"}}, None, None),
    ({"dataclass": "m:C", "fields": {"a": {"value": 1}}}, {"m:C": {"a": "float"}}, None, r"expected a plain float"),
    ({"dataclass": "m:D", "fields": {}}, {"m:C": {}}, None, r"names the class 'm:D'.*\(allowed: m:C\)"),
    ({"tuple": [{"tuple": []}] * 10_001}, {}, None, r"more than 10000 nodes"),
]


@pytest.mark.parametrize("node, classes, nbytes, problem", PURE)
def test_the_structure_check_alone(node, classes, nbytes, problem):
    got = structure_problem(node, classes, nbytes)
    if problem is None:
        assert got is None
    else:
        assert got is not None and re.search(problem, got), got


# ------------------------------------------------------------------------- 2. the OUT lock follows no link


def _plant(kind: str, out: Path, victim: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lock = out / LOCK_NAME
    {"symlink-to-src": lambda: os.symlink(victim, lock),
     "dangling-symlink": lambda: os.symlink(victim.parent / "created-by-the-lock", lock),
     "hard-link-to-src": lambda: os.link(victim, lock),
     "folder": lambda: lock.mkdir(),
     "fifo": lambda: os.mkfifo(lock)}[kind]()


LOCKS = [("symlink-to-src", r"is a symbolic link \(to '.*'\); .*remove the link: rm "),
         ("dangling-symlink", r"is a symbolic link .*remove the link: rm "),
         ("hard-link-to-src", r"has 2 hard links: it is also another file.*remove this name \(the other file stays\)"),
         ("folder", r"is a folder; .*move it out of OUT: mv "),
         ("fifo", r"is not a regular file \(a FIFO, socket or device\); .*remove it: rm ")]


@pytest.mark.parametrize("mode", ["", "--overwrite", "--resume"])
@pytest.mark.parametrize("kind, match", LOCKS, ids=[k for k, _ in LOCKS])
def test_a_planted_lock_is_refused_and_nothing_it_points_to_is_written(tiny_copy, tmp_path, kind, match, mode):
    victim = tiny_copy / "tokenizer.json"
    before = victim.read_bytes()
    out = tmp_path / "out"
    _plant(kind, out, victim)
    refused(cli(tiny_copy, out, "-q", *[mode] * bool(mode)), rf"^error: OUT {out}: {LOCK_NAME} " + match)
    assert victim.read_bytes() == before and os.stat(victim).st_nlink == (2 if kind.startswith("hard") else 1)
    assert not (tiny_copy / "created-by-the-lock").exists()


@pytest.mark.parametrize("kind", ["symlink-to-src", "hard-link-to-src", "folder", "fifo"])
def test_the_lock_remedy_works(tiny_copy, tmp_path, kind):
    """Doing what the line says (rm, or mv out of OUT) lets the next run take the lock."""
    out = tmp_path / "out"
    _plant(kind, out, tiny_copy / "tokenizer.json")
    with pytest.raises(InputError) as e:
        OutLock(out).acquire()
    if " mv " in str(e.value):
        (out / LOCK_NAME).rename(tmp_path / "moved")
    else:
        (out / LOCK_NAME).unlink()
    lock = OutLock(out)
    lock.acquire()
    assert (out / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} ")
    lock.release()


# ---------------------------------------------------------------- 3. OUT compared on what the kernel resolves


OUT_SPELLINGS = [  # (links to make: name -> target relative to tmp, OUT as typed relative to tmp, inside SRC)
    ({"inf": "src/inference"}, "inf/../out", True),
    ({"inf": "src/inference"}, "inf/../inference/../x/../y", True),
    ({"a": "src/inference", "b": "a"}, "b/../z", True),  # a chain of links
    ({"inf": "src/inference"}, "inf/../../elsewhere", False),  # .. twice: beside SRC, not in it
    ({"up": "."}, "up/src/../out", False),
    ({}, "src/../beside", False),
]


@pytest.mark.parametrize("links, spelled, inside", OUT_SPELLINGS, ids=[s for _, s, _ in OUT_SPELLINGS])
def test_out_through_links_and_dotdot_is_compared_as_the_kernel_resolves_it(tiny_ckpt, tmp_path, monkeypatch, links,
                                                                            spelled, inside):
    src = tmp_path / "src"
    shutil.copytree(tiny_ckpt, src)
    (src / "inference").mkdir()
    for name, target in links.items():
        os.symlink(tmp_path / target, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in src.iterdir())
    if inside:
        with pytest.raises(ValidationError, match=rf"^OUT {spelled}: lies inside SRC .*src"):
            convert(str(src), spelled, "bf16")
    else:
        convert(str(src), spelled, "bf16", dry_run=True)
    assert sorted(p.name for p in src.iterdir()) == before and not any((src / "inference").iterdir())


# ----------------------------------------------------------- 4. --resume and an input rewritten in place


def _rewrite_in_place(path: Path, chmod_only: bool = False) -> None:
    """Other bytes of the same size in the same inode, mtime set back (what `cp -p` of a same-size copy does)."""
    st = path.stat()
    if chmod_only:
        os.chmod(path, st.st_mode)  # changes nothing but ctime
    elif path.suffix == ".json":  # still valid JSON of the same size: one space becomes a tab
        data = path.read_bytes()
        assert b": " in data
        path.write_bytes(data.replace(b": ", b":\t", 1))
    else:
        with open(path, "r+b") as f:
            f.seek(st.st_size - 64)
            tail = f.read(64)
            f.seek(st.st_size - 64)
            f.write(bytes(b ^ 0x5A for b in tail))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


RESUMES = [  # (input, bytes changed, sha256 recorded, ctime in the manifest, refusal or None)
    ("model-00001-of-00004.safetensors", True, False, True, r"changed since .* \(written or its attributes changed"),
    ("config.json", True, False, True, r"changed since .* no sha256 was recorded"),
    ("model-00002-of-00004.safetensors", True, True, True, r"sha256 [0-9a-f]{16}\.\.\. differs from the"),
    ("model-00002-of-00004.safetensors", False, True, True, None),  # only ctime moved, bytes the same: kept
    ("model-00002-of-00004.safetensors", False, False, True, r"written or its attributes changed"),
    ("model-00003-of-00004.safetensors", False, False, False, r"its change time \(ctime\) was not recorded"),
    ("model-00003-of-00004.safetensors", False, True, False, None),  # an older manifest: hashed, and it matches
]


@pytest.mark.parametrize("rel, changed, hashed, ctime, refusal", RESUMES)
def test_resume_catches_an_input_rewritten_with_size_and_mtime_kept(tiny_copy, tmp_path, rel, changed, hashed, ctime,
                                                                    refusal):
    out = tmp_path / "out"
    interrupted_run(tiny_copy, out, hashed=True)

    def forget(m):
        rec = m["source"]["files"][rel]
        if not hashed:
            rec["sha256"] = None
        if not ctime:
            for r in m["source"]["files"].values():
                r.pop("ctime_ns")
    edit_json(out / MANIFEST_NAME, forget)
    _rewrite_in_place(tiny_copy / rel, chmod_only=not changed)
    r = cli(tiny_copy, out, "--shard-size", "1MB", "--resume", "-q")
    if refusal is None:
        assert r.exit_code == 0, r.output
        assert cli("verify", out).exit_code == 0
    else:
        refused(r, rf"^error: --resume: {tiny_copy / rel}: .*{refusal}.*run with --overwrite in place of --resume")
        assert json.loads((out / MANIFEST_NAME).read_text())["complete"] is False


# -------------------------------------------------------------- 5. Hub requests end, and signals end them


@pytest.mark.parametrize("chunks, limit, late, result", [
    ([b"ab", b"cd", b"ef"], 5, False, b"abcde"),
    ([b"a"] * 10, 3, False, b"aaa"),
    ([b"a"] * 10, 30, True, TimeoutError),  # a byte at a time, past the deadline
    ([b"abc"], 3, True, b"abc"),  # what was asked arrived: no timeout
])
def test_a_request_has_an_overall_deadline(chunks, limit, late, result):
    from fimoe_convert.files.sources.hub import _read_at_most

    deadline = time.monotonic() - 1 if late else time.monotonic() + 60
    if result is TimeoutError:
        with pytest.raises(TimeoutError, match=r"^1 of 30 bytes after 60 s, the most one request may take$"):
            _read_at_most(iter(chunks), limit, deadline)
    else:
        assert _read_at_most(iter(chunks), limit, deadline) == result


@pytest.mark.parametrize("signum, times", [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGINT, 2),
                                           (signal.SIGTERM, 3)])
def test_a_signal_ends_inspect_of_a_hub_repo_stuck_on_a_slow_server(tiny_ckpt, tmp_path, signum, times):
    from helpers.hub_files import HubFiles

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
                    time.sleep(0.2)
            except OSError:
                pass

    with Drip("org/tiny-v4", tiny_ckpt, "c" * 40) as hub:
        env = child_env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_DISABLE_TELEMETRY="1",
                        HF_TOKEN="", FIMOE_DEBUG="", HF_HUB_OFFLINE=None)
        proc = subprocess.Popen([sys.executable, "-m", "fimoe_convert", "inspect", "org/tiny-v4"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        t0 = time.monotonic()
        while not any(p.endswith(".safetensors") for _, p, _ in hub.requests) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        time.sleep(0.5)
        sent = time.monotonic()
        for _ in range(times):  # a second Ctrl-C during the clean-up changes nothing
            proc.send_signal(signum)
            time.sleep(0.02)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the run did not end within 10 s of the signal")
    assert time.monotonic() - sent < 5
    assert proc.returncode == 128 + signum, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"error: interrupted ({signal.Signals(signum).name})") and "Traceback" not in err, err


# ------------------------------------------------------------ 6. verify --deep blames a changed source


@pytest.mark.parametrize("rel", ["model-00001-of-00004.safetensors", "model-00004-of-00004.safetensors", "config.json",
                                 None])
def test_verify_deep_blames_a_source_rewritten_in_place(tiny_copy, tmp_path, rel):
    out = tmp_path / "out"
    convert(str(tiny_copy), str(out), "bf16", shard_size="1MB")
    if rel is None:
        assert verify(str(out), deep=True, src=str(tiny_copy)).problems == []
        return
    _rewrite_in_place(tiny_copy / rel)
    with pytest.raises(
        InputError,
        match=rf"^--src {tiny_copy}: is not the checkpoint {out} was converted from "
        rf"\({rel.replace('.', chr(92) + '.')}: \d+ bytes, sha256 [0-9a-f]{{16}}; the "
        r"output was converted from \d+ bytes, sha256 [0-9a-f]{16}\); pass the original",
    ):
        verify(str(out), deep=True, src=str(tiny_copy))
    refused(cli("verify", out, "--deep", "--src", tiny_copy), r"is not the checkpoint .* pass the original with --src")


# ------------------------------------------------------- 7. FIFOs, devices and links where a file belongs


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "fimoe_convert", *map(str, args)], capture_output=True, text=True,
                          env=child_env(FIMOE_DEBUG=""), timeout=timeout)


FIFOS = [  # (where the FIFO goes, command, exit code, the error line)
    ("src/config.json", ["inspect", "{src}"], 1, r"config\.json: cannot read it \(it is a FIFO, not a regular file\)"),
    ("src/model.safetensors.index.json", ["inspect", "{src}"], 1, r"index\.json: cannot read it \(it is a FIFO"),
    ("src/model-00002-of-00004.safetensors", ["inspect", "{src}"], 1, r"model-00002-of-00004\.safetensors: cannot "
                                                                     r"read \(it is a FIFO, not a regular file\)"),
    ("out/fimoe-manifest.json", ["verify", "{out}"], 1, r"fimoe-manifest\.json: cannot read it \(it is a FIFO"),
    ("preset.toml", ["{src}", "{out}", "--config", "{tmp}/preset.toml"], 2, r"--config .*preset\.toml: cannot read "
                                                                           r"it \(it is a FIFO, not a regular file\)"),
    (None, ["{src}", "{out}", "--config", "/dev/zero"], 2, r"--config /dev/zero: cannot read it \(it is a character "
                                                           r"device, not a regular file\)"),
]


@pytest.mark.parametrize("where, args, code, match", FIFOS, ids=[a[0] if w is None else w for w, a, _, _ in FIFOS])
def test_a_fifo_or_device_where_a_file_belongs_is_refused_not_waited_on(tiny_copy, bf16_out_of, tmp_path, where, args,
                                                                        code, match):
    out = tmp_path / "out"
    shutil.copytree(bf16_out_of("1MB"), out)
    if where:
        path = tmp_path / where if not where.startswith("src/") else tiny_copy / where[4:]
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    r = _run(*[a.format(src=tiny_copy, out=out, tmp=tmp_path) for a in args])
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(match, lines[0]), r.stderr


def test_a_status_file_that_is_a_fifo_only_means_its_shards_are_redone(tiny_copy, tmp_path):
    out = tmp_path / "out"
    interrupted_run(tiny_copy, out)
    os.mkfifo(out / "fimoe-status.rank0.json")
    r = _run(tiny_copy, out, "--shard-size", "1MB", "--resume", "-q")
    assert r.returncode == 0, r.stderr
    assert _run("verify", out).returncode == 0


@pytest.mark.parametrize("link", ["outside", "inside"])
def test_a_manifest_linked_out_of_out_is_not_read(bf16_out_of, tmp_path, link):
    out = tmp_path / "out"
    shutil.copytree(bf16_out_of("1MB"), out)
    real = (tmp_path if link == "outside" else out) / "elsewhere.json"
    (out / MANIFEST_NAME).rename(real)
    (out / MANIFEST_NAME).symlink_to(real)
    if link == "outside":
        refused(cli("verify", out), rf"fimoe-manifest\.json: manifest 'fimoe-manifest\.json' is a link to {real}, "
                                    r"outside OUT .*; refusing it; the manifest is damaged")
    else:
        assert verify(str(out)).files > 0


@pytest.mark.parametrize("name, ok", [
    ("layers.0.w", True),
    ("caf\u00e9.\U0001F600", True),  # a surrogate pair in JSON is one character: fine
    ("\\ud800", False),  # a lone surrogate
    ("a\\udfffb", False),
    ("a\\nb", False),  # a newline: one name would print as two lines
    ("\\u001b[31mred", False),  # an escape sequence
    ("\\u0000", False),
])
def test_a_tensor_name_must_be_valid_unicode_without_control_characters(tmp_path, name, ok):
    from fimoe_convert.files.safetensors.header import read_header

    header = ('{"' + name + '": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}').encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "x.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0")
    if ok:
        assert len(read_header(path).tensors) == 1
    else:
        with pytest.raises(InputError, match=r"x\.safetensors: tensor name .* holds a control character or a lone "
                                             r"surrogate"):
            read_header(path)


# -------------------------------------------------------------------------------- 8. exit codes and output


EXITS = [
    (["inspect", "{src}", "--ep-size", "0"], 2, r"^error: --ep-size 0: must be 1 or more"),
    (["inspect", "{src}", "--ep-size", "-3"], 2, r"^error: --ep-size -3: must be 1 or more"),
    (["inspect", "{src}", "--arch", "-1.-1"], 2, r"^error: --arch -1\.-1: expected a compute capability"),
    (["inspect", "{src}", "--arch", "1_0.0"], 2, r"^error: --arch 1_0\.0: expected"),
    (["{src}", "{tmp}/new", "--arch", "-1.-1", "--dry-run"], 2, r"^error: --arch -1\.-1: expected"),
    (["upload", "{out}", "org/x", "--revision", "../../x", "--dry-run"], 2, r"^error: --revision '\.\./\.\./x': not a "
                                                                            r"branch name"),
    (["upload", "{out}", "org/x", "--revision", "-rf", "--dry-run"], 2, r"^error: --revision '-rf': not a branch"),
    (["upload", "{out}", "org/x", "--revision", "a..b", "--dry-run"], 2, r"^error: --revision 'a\.\.b'"),
    (["upload", "{out}", "org/x", "--revision", "main.lock", "--dry-run"], 2, r"^error: --revision 'main\.lock'"),
    (["demo", "--workdir", "{tmp}/file"], 2, r"^error: --workdir .*file: is a file; expected a folder"),
    (["demo", "--workdir", "{tmp}/foreign"], 2, r"^error: --workdir .*foreign: holds files other than an earlier "
                                                r"demo's"),
]


@pytest.mark.parametrize("args, code, match", EXITS, ids=[" ".join(a[:1] + a[2:4]) for a, _, _ in EXITS])
def test_exit_codes_of_flags_checked_before_work(tiny_ckpt, bf16_out_of, tmp_path, args, code, match):
    (tmp_path / "file").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "thesis.tex").write_text("x")
    r = cli(*[a.format(src=tiny_ckpt, out=bf16_out_of("1MB"), tmp=tmp_path) for a in args])
    refused(r, match, code)
    assert (tmp_path / "file").read_text() == "x" and (tmp_path / "foreign" / "thesis.tex").exists()


def test_a_stray_single_file_checkpoint_beside_the_index_fails_verify(bf16_out_of, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(bf16_out_of("1MB"), out)
    assert verify(str(out)).problems == []
    shutil.copy(next(out.glob("model-*.safetensors")), out / "model.safetensors")
    assert verify(str(out)).problems == [f"{out / 'model.safetensors'}: not part of this output, and an engine "
                                            "that finds it beside the index may load it in place of the shards; move "
                                            f"it out of {out}"]


@pytest.mark.parametrize("name", ["a\nerror: fake", "b\x1b[2Jcleared", "c\rover"])
def test_names_from_files_print_on_one_line_without_escape_sequences(bf16_out_of, tmp_path, name):
    out = tmp_path / "out"
    shutil.copytree(bf16_out_of("1MB"), out)
    (out / name).write_text("x")
    r = cli("upload", out, "org/x", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\r" not in r.output and "error: fake" not in r.output.splitlines()
    assert f"  not uploaded (not in the manifest): {one_line(name)}" in r.output.splitlines()
    edit_json(out / MANIFEST_NAME, lambda m: m["source"].update(spec=name, revision="r\x1b[31m\nx"))
    r = cli("inspect", out)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\r" not in r.output and "error: fake" not in r.output.splitlines()


@pytest.mark.parametrize("old_output_bytes_count, ok", [(True, True), (False, False)])
def test_overwrite_counts_the_space_the_old_output_frees(tiny_ckpt, bf16_out_of, tmp_path, monkeypatch,
                                                         old_output_bytes_count, ok):
    """Free space is just short of what the run needs; the earlier conversion --overwrite removes makes up for it
    (and a hard-linked old shard frees nothing, so it does not count)."""
    import fimoe_convert.conversion as conv

    out = tmp_path / "out"
    shutil.copytree(bf16_out_of("1MB"), out)
    old = sum(p.stat().st_size for p in out.glob("model-*.safetensors"))
    if not old_output_bytes_count:
        for p in out.glob("model-*.safetensors"):
            os.link(p, tmp_path / p.name)  # a second name: removing this one frees nothing
    need = int(old * conv.DISK_HEADROOM)  # about what the same conversion writes again
    monkeypatch.setattr(conv, "free_disk", lambda o: (o, max(need - old // 2, 1)))
    r = cli(tiny_ckpt, out, "--shard-size", "1MB", "--overwrite", "-q")
    if ok:
        assert r.exit_code == 0, r.output
    else:
        refused(r, r"OUT .*: needs \d+ bytes \(shards and copied files\), \d+ free on")


@pytest.mark.parametrize("name, match", [
    ("t" * 250, r"file 't{250}': its name \(250 bytes\) cannot be copied into OUT, where it is written as "
                r"NAME\.fimoe-tmp \(at most 255 bytes"),
    (os.fsdecode(b"caf\xe9.txt"), r"file 'caf\\udce9\.txt': its name is not valid UTF-8"),
    ("a\x1bb.txt", r"file 'a\\x1bb\.txt': its name \(7 bytes, with a control character\)"),
    ("t" * 245, None),  # 245 + 10 = 255 bytes: fits
])
def test_a_file_name_of_src_that_cannot_be_copied_is_named_before_any_shard(tiny_copy, tmp_path, name, match):
    (tiny_copy / name).write_text("x")
    out = tmp_path / "out"
    if match is None:
        convert(str(tiny_copy), str(out), "bf16", dry_run=True)
        return
    with pytest.raises(ValidationError, match=rf"^{re.escape(str(tiny_copy))}: {match}"):
        convert(str(tiny_copy), str(out), "bf16")
    assert not out.exists()


@pytest.mark.parametrize("stored, node_dtype, shape, problem", [
    ("uint8", "uint8", [2, 3], None),
    ("uint8", "float4_e2m1fn_x2", [2, 3], None),  # stored as its bytes
    ("bfloat16", "float16", [2, 3], r"stored as bfloat16, its structure says float16"),
    ("uint8", "int8", [2, 3], r"stored as uint8, its structure says int8"),
    ("uint8", "uint8", [3, 3], r"holds 6 bytes, its structure \(uint8 \[3, 3\]\) needs 9"),
])
def test_the_loader_rebuilds_a_tensor_only_as_stored(stored, node_dtype, shape, problem):
    import torch

    from fimoe_convert.numerics.structure import unflatten

    node = {"tensor": "t", "dtype": node_dtype, "shape": shape}
    t = torch.zeros(6, dtype=getattr(torch, stored))
    if problem is None:
        assert unflatten(node, {"t": t}).shape == tuple(shape)
    else:
        with pytest.raises(ValueError, match=problem):
            unflatten(node, {"t": t})
