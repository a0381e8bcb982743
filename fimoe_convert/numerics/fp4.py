"""FP4 (E2M1, two codes per byte, element 2i in the low nibble) with one E8M0 scale per 32 values.

`dequant_fp4_to_bf16` is bit-identical to the seed formula (vLLM's `_dequant_fp4_ue8m0_gran32`:
float32 LUT with -0.0 for code 8, scale `(s << 23)` as float32, product cast to BF16) for every
scale byte: an E2M1 value times a power of two is exact, so a table of BF16 pairs indexed by
(scale byte, code byte) reproduces it without float arithmetic on the hot path.

CPU path: the 64K-entry int32 table (256 KiB, stays in L2) is gathered with `index_select` and an
int32 index built in place (`codes | scale << 8`), row chunk by row chunk, straight into the output.
`index_select` is single-threaded in ATen and releases the GIL, so the chunks are spread over
`torch.get_num_threads()` threads (the caller's thread plus a small private pool).
CUDA path: a fused Triton kernel (`fp4_triton.py`) doing integer exponent arithmetic; without
Triton, the same table gather in plain torch ops.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import torch

from ..dtypes import FP4_GROUP
from .fp4_args import checked_args, scale_bytes

SCALE_NAN_BYTE = 255  # E8M0 NaN; corrupt input
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

_PAIR_TABLES: dict[torch.device, torch.Tensor] = {}

# Code bytes per work item: 2 MiB of int32 indices, 4 MiB of BF16 out. Measured on the 2-core dev
# machine at V4-Flash geometry: 128K..1M all within ~10%; smaller chunks pay per-op overhead.
_CHUNK_BYTES = 1 << 19
# Below this many code bytes a second thread costs more than it saves.
_PARALLEL_MIN_BYTES = 1 << 20

_POOL: ThreadPoolExecutor | None = None
_POOL_KEY: tuple[int, int] = (0, 0)  # (pid, workers): a fork or a larger thread count makes a new pool
_POOL_LOCK = threading.Lock()


def find_nan_scales(scales: torch.Tensor) -> int:
    """How many scale bytes are 255 (NaN in E8M0)."""
    sb = scale_bytes(scales)
    if sb.device.type == "cpu":  # numpy, single-threaded: torch's intra-op pool costs ~15 ms per call on a busy host
        return int(np.count_nonzero(sb.contiguous().numpy() == SCALE_NAN_BYTE))
    return int((sb == SCALE_NAN_BYTE).sum())


def _pair_table(device: torch.device) -> torch.Tensor:
    """int32 [256 * 256]: entry (s << 8 | b) holds the two BF16 values of code byte b at scale byte s,
    the low nibble's value in the half that comes first in memory (so the int32 output viewed as BF16
    is element 2i, 2i+1). Built with the seed formula itself, so it matches it for all 256 scale bytes."""
    table = _PAIR_TABLES.get(device)
    if table is None:
        lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        scale = (torch.arange(256, dtype=torch.int32) << 23).view(torch.float32)  # 2**(s-127), as the seed
        byte = torch.arange(256)
        lo = (lut[byte & 0xF][None, :] * scale[:, None]).to(torch.bfloat16).view(torch.int16).to(torch.int32)
        hi = (lut[byte >> 4][None, :] * scale[:, None]).to(torch.bfloat16).view(torch.int16).to(torch.int32)
        if sys.byteorder == "big":
            lo, hi = hi, lo
        table = ((lo & 0xFFFF) | (hi << 16)).reshape(-1).contiguous().to(device)
        _PAIR_TABLES[device] = table
    return table


def _pool(workers: int) -> ThreadPoolExecutor:
    """A private pool with at least `workers` threads (recreated after a fork)."""
    global _POOL, _POOL_KEY
    with _POOL_LOCK:
        pid, have = _POOL_KEY
        if _POOL is None or pid != os.getpid() or have < workers:
            # no shutdown() of a smaller pool: a concurrent caller may still submit to it; its idle
            # threads exit once the last reference to it goes
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fimoe-fp4")
            _POOL_KEY = (os.getpid(), workers)
        return _POOL


def _dequant_cpu(codes: torch.Tensor, sb: torch.Tensor, out: torch.Tensor) -> None:
    """codes uint8 [rows, K/2], sb uint8 [rows, K/32] -> out BF16 [rows, K] (contiguous), in place."""
    rows, k_half = codes.shape
    groups = sb.shape[1]
    table = _pair_table(codes.device)
    out32 = out.view(torch.int32)  # [rows, K/2]: one int32 = the BF16 pair of one code byte
    shifted = sb.to(torch.int32).bitwise_left_shift_(8)  # [rows, groups]
    chunk_rows = max(1, _CHUNK_BYTES // k_half)

    def chunk(r0: int, r1: int, index: torch.Tensor) -> None:
        n = r1 - r0
        idx = index[: n * k_half]
        idx.view(n, k_half).copy_(codes[r0:r1])
        idx.view(n, groups, FP4_GROUP // 2).bitwise_or_(shifted[r0:r1].unsqueeze(-1))
        torch.index_select(table, 0, idx, out=out32[r0:r1].view(-1))

    run_chunks(rows, chunk_rows, chunk, min(chunk_rows, rows) * k_half, codes.device, torch.get_num_threads(),
               codes.numel())


def run_chunks(rows: int, step: int, chunk: Callable[[int, int, torch.Tensor], None], index_numel: int,
               device: torch.device, threads: int, nbytes: int) -> None:
    """`chunk(r0, r1, index)` for every `step` rows of `rows`, on up to `threads` threads (this one included; this
    one alone below _PARALLEL_MIN_BYTES of input), each with its own int32 scratch `index` of `index_numel`
    elements. Returns when every thread has finished, raising the first error."""
    starts = iter(range(0, rows, step))
    lock = threading.Lock()
    failed = False

    def work() -> None:
        nonlocal failed
        index = torch.empty(index_numel, dtype=torch.int32, device=device)
        try:
            while True:
                with lock:
                    r0 = None if failed else next(starts, None)
                if r0 is None:
                    return
                chunk(r0, min(rows, r0 + step), index)
        except BaseException:
            failed = True  # the other threads stop at their next chunk
            raise

    threads = min(threads, -(-rows // step))
    if threads <= 1 or nbytes < _PARALLEL_MIN_BYTES:
        work()
        return
    pool = _pool(threads - 1)
    futures = [pool.submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        wait(futures)  # never return (or raise) while a worker still writes into the outputs
    for f in futures:
        f.result()


def _dequant_torch(codes: torch.Tensor, sb: torch.Tensor, out: torch.Tensor) -> None:
    """Any device (CUDA without Triton, MPS, ...): one table gather in plain torch ops."""
    rows, k_half = codes.shape
    index = codes.to(torch.int32, memory_format=torch.contiguous_format).view(rows, sb.shape[1], FP4_GROUP // 2)
    index.bitwise_or_((sb.to(torch.int32) << 8).unsqueeze(-1))
    torch.index_select(_pair_table(codes.device), 0, index.reshape(-1), out=out.view(torch.int32).view(-1))


def dequant_fp4_to_bf16(packed: torch.Tensor, scales: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """[..., K/2] int8/uint8 codes and [..., K/32] uint8/float8_e8m0fnu scales -> BF16 [..., K].

    Bit-identical to the seed formula. `out`, if given, must be a contiguous BF16 tensor of the result's
    shape on the codes' device; it is filled and returned."""
    sb, out = checked_args(packed, scales, out)
    k_half = packed.shape[-1]
    if out.numel() == 0:
        return out
    if packed.device.type == "cuda":
        from . import fp4_triton

        if fp4_triton.triton_available():
            return fp4_triton.dequant_checked(packed, sb, out)
    codes = packed.view(torch.uint8).reshape(-1, k_half)
    sb2 = sb.reshape(-1, sb.shape[-1])
    out2 = out.view(-1, k_half * 2)
    if packed.device.type == "cpu":
        _dequant_cpu(codes, sb2, out2)
    else:
        _dequant_torch(codes, sb2, out2)
    return out


def dequant_fp8_block_to_bf16(weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """FP8 E4M3 [out, in] with one F32 scale per `block` tile (Base checkpoints) -> BF16 [out, in]."""
    rows, cols = block
    out, inp = weight.shape
    s = scales.float().repeat_interleave(rows, 0)[:out].repeat_interleave(cols, 1)[:, :inp]
    return (weight.float() * s).to(torch.bfloat16)
