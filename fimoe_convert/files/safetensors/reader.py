"""Reading tensor bytes from a safetensors file whose header was validated: one tensor by positional reads, or
many at once into one host buffer with parallel reads (pinned and copied on when the tensors go to a GPU)."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import InputError
from .header import TensorInfo, as_typed, read_header

READ_CHUNK = 16 * 2**20  # bytes per positional read when loading tensors in parallel
READ_THREADS = 8  # parallel reads: page-cache copies and NVMe queues both scale with them
TENSOR_ALIGN = 64  # bytes: each tensor's start in the shared host buffer, so any dtype can view it


def _pread_exact(fd: int, view: memoryview, path: Path, info: TensorInfo, first: int = 0) -> None:
    """Fill `view` with tensor `info`'s bytes from byte `first` of the tensor on (positional reads: parallel
    readers share one descriptor); a file that ends early is an InputError naming the tensor."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], info.start + first + got)
        if not n:
            raise InputError(f"{path}: tensor {info.name!r}: file ended after {first + got} of {info.nbytes} bytes; "
                             "it changed while being read or is truncated")
        got += n


def read_bytes(path: Path, info: TensorInfo, out=None):
    """The raw bytes of one tensor as a uint8 CPU tensor (into the torch tensor `out` when given)."""
    import torch

    buf = out if out is not None else torch.empty(info.nbytes, dtype=torch.uint8)
    view = memoryview(buf.numpy()).cast("B")
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            _pread_exact(fd, view[:info.nbytes], path, info)
        finally:
            os.close(fd)
    except OSError as e:
        raise InputError(f"{path}: tensor {info.name!r}: cannot read ({e.strerror}); the file changed or vanished "
                         "while being read, restore it and run the same command with --resume") from e
    return buf



def read_tensors(path: Path, names: list[str], device="cpu") -> dict:
    """Tensors `names` of one safetensors file, typed and shaped from its header, on `device`.

    All of them are read into one host buffer with parallel positional reads (pinned when `device` is
    CUDA, each chunk then copied to it without waiting, on the caller's stream): a load is bound by how
    fast bytes arrive, and a single reader thread leaves most of the page cache's and the disk's
    bandwidth unused."""
    import torch

    path = Path(path)
    header = read_header(path)
    missing = [n for n in names if n not in header.tensors]
    if missing:
        raise InputError(f"{path}: tensor {missing[0]!r} not found; the file and its index disagree, convert again")
    infos = [header.tensors[n] for n in names]
    places, total = [], 0
    for info in infos:
        places.append(total)
        total += -(-info.nbytes // TENSOR_ALIGN) * TENSOR_ALIGN
    cuda = torch.device(device).type == "cuda"
    buf = torch.empty(total, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(total, dtype=torch.uint8, device=device) if cuda else buf
    stream = torch.cuda.current_stream(dev.device) if cuda else None  # the caller's, which will use the tensors
    jobs = [(info, place + off, min(READ_CHUNK, info.nbytes - off), off)
            for info, place in zip(infos, places) for off in range(0, info.nbytes, READ_CHUNK)]
    view = memoryview(buf.numpy()) if total else memoryview(b"")

    def read(job) -> None:
        info, at, n, off = job
        _pread_exact(fd, view[at:at + n], path, info, off)
        if cuda:  # each chunk goes on to the device as soon as it has arrived, while others are read
            with torch.cuda.stream(stream):
                dev[at:at + n].copy_(buf[at:at + n], non_blocking=True)

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    try:
        if len(jobs) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(READ_THREADS, len(jobs)), thread_name_prefix="fimoe-load") as pool:
                list(pool.map(read, jobs))
        else:
            list(map(read, jobs))
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror}); the file changed while being read") from None
    finally:
        os.close(fd)
    return {info.name: as_typed(dev[place:place + info.nbytes], info.dtype, info.shape)
            for info, place in zip(infos, places)}

