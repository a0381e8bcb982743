"""The streaming shard writer: same bytes with and without O_DIRECT, at every block-boundary size."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from safetensors import safe_open

from fimoe_convert.budget import IO_BLOCK
from fimoe_convert.errors import InputError
from fimoe_convert.files.names import TMP_SUFFIX
from fimoe_convert.files.safetensors import reader as st_reader, writer as st_writer
from fimoe_convert.files.safetensors.header import PlannedTensor, read_header
from fimoe_convert.files.safetensors.writer import write_file

SIZES = [0, 1, st_writer.DIRECT_ALIGN - 1, st_writer.DIRECT_ALIGN, IO_BLOCK - 100, IO_BLOCK + 5,
         pytest.param(3 * IO_BLOCK + 4097, marks=pytest.mark.slow)]


def _tensors(nbytes: int) -> list[tuple[PlannedTensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(nbytes)
    big = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    small = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    return [(PlannedTensor("big", "U8", (nbytes,)), big), (PlannedTensor("small", "F32", (2, 3)), small)]


@pytest.mark.parametrize("nbytes", SIZES)
def test_direct_and_buffered_write_the_same_file(tmp_path, monkeypatch, nbytes):
    tensors = _tensors(nbytes)
    direct = write_file(tmp_path / "direct.safetensors", tensors)
    monkeypatch.delattr(os, "O_DIRECT", raising=False)  # the buffered path, as on tmpfs or macOS
    buffered = write_file(tmp_path / "buffered.safetensors", tensors)
    a = (tmp_path / "direct.safetensors").read_bytes()
    b = (tmp_path / "buffered.safetensors").read_bytes()
    assert a == b
    assert direct == buffered
    assert direct.size == len(a) and direct.sha256 == hashlib.sha256(a).hexdigest()
    with safe_open(tmp_path / "direct.safetensors", "pt") as f:
        assert torch.equal(f.get_tensor("big"), tensors[0][1])
        assert torch.equal(f.get_tensor("small"), tensors[1][1])
    assert not list(tmp_path.glob("*" + TMP_SUFFIX))


def test_opener_uses_o_direct_where_the_file_system_takes_it(tmp_path):
    """On this machine's disk O_DIRECT is accepted (ext4/xfs); the writer must then use it."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    try:
        os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o666))
    except OSError:
        pytest.skip(f"{tmp_path} does not take O_DIRECT")
    with open(tmp_path / "x", "wb", buffering=0, opener=st_writer._direct_opener) as f:
        assert st_writer._is_direct(f)


def test_read_tensors_matches_safe_open(tmp_path):
    """Parallel positional reads into one buffer: odd sizes before wider dtypes, a tensor over several
    read chunks, a subset in another order; each equal to what safetensors itself reads."""
    g = torch.Generator().manual_seed(1)
    tensors = [
        (PlannedTensor("odd", "U8", (3,)), torch.tensor([1, 2, 3], dtype=torch.uint8)),
        (PlannedTensor("f32", "F32", (2, 3)), torch.randn(2, 3, generator=g)),
        (PlannedTensor("bf16", "BF16", (5,)), torch.randn(5, generator=g).to(torch.bfloat16)),
        (PlannedTensor("big", "I8", (st_reader.READ_CHUNK * 2 + 7,)),
         torch.randint(-128, 128, (st_reader.READ_CHUNK * 2 + 7,), dtype=torch.int8, generator=g)),
        (PlannedTensor("empty", "F32", (0, 4)), torch.empty(0, 4)),
    ]
    path = tmp_path / "t.safetensors"
    write_file(path, tensors)
    names = ["big", "bf16", "odd", "f32", "empty"]
    got = st_reader.read_tensors(path, names)
    assert list(got) == names
    with safe_open(path, "pt") as f:
        for n in names:
            want = f.get_tensor(n)
            assert got[n].dtype == want.dtype and got[n].shape == want.shape and torch.equal(got[n], want), n


def test_read_tensors_names_a_missing_tensor(tmp_path):
    path = tmp_path / "t.safetensors"
    write_file(path, _tensors(10))
    with pytest.raises(InputError, match=r"t\.safetensors: tensor 'nope' not found; the file and its index "
                                             r"disagree, convert again"):
        st_reader.read_tensors(path, ["big", "nope"])


def test_a_tensor_cut_short_after_its_header_was_read_names_the_tensor_and_the_bytes(tmp_path):
    """The file shrinks between validation and the read (the converter's case): one error naming the tensor
    and how many of its bytes arrived."""
    path = tmp_path / "t.safetensors"
    write_file(path, _tensors(1000))
    info = read_header(path).tensors["big"]
    with open(path, "r+b") as f:
        f.truncate(info.start + 100)
    with pytest.raises(InputError, match=r"t\.safetensors: tensor 'big': file ended after 100 of 1000 bytes; "
                                             r"it changed while being read or is truncated$"):
        st_reader.read_bytes(path, info)
