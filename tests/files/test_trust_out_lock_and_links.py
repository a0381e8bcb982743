"""The OUT lock, OUT spelled through links and `..`, and FIFOs, devices and links where a file belongs: each is
refused in one line naming the file, and nothing it points to is read or written."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability import child_env, cli, refused
from test_trust import interrupted_run

from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError, ValidationError
from fimoe_convert.files.names import MANIFEST_NAME
from fimoe_convert.files.output.lock import LOCK_NAME, OutLock

# ------------------------------------------------------------------------- 1. the OUT lock follows no link


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


# ---------------------------------------------------------------- 2. OUT compared on what the kernel resolves


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


# ------------------------------------------------------- 3. FIFOs, devices and links where a file belongs


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


@pytest.mark.parametrize("where, args, code, match", [  # a child process each: two in the fast tier
    f if f[0] in (None, "src/config.json") else pytest.param(*f, marks=pytest.mark.slow) for f in FIFOS],
    ids=[a[0] if w is None else w for w, a, _, _ in FIFOS])
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


@pytest.mark.slow
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
