"""Names read from files (tensor names, SRC file names) and printed back, the exit codes of flags checked before
any work, the free-space check of --overwrite, and a stray checkpoint beside the index."""

import os
import re
import shutil

import pytest
from test_reliability import cli, refused
from test_trust import edit_json

from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError, ValidationError, one_line
from fimoe_convert.files.names import MANIFEST_NAME

# ----------------------------------------------------------------------------------------------------------- 1. names


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


# -------------------------------------------------------------------------------- 2. exit codes and output


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
