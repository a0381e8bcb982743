"""safetensors dtype names, their sizes and torch dtypes (pure; shared by planning and file I/O)."""

from __future__ import annotations

import math
from typing import Iterable

import torch

# safetensors dtype -> (bits per element, torch dtype)
DTYPES: dict[str, tuple[int, torch.dtype]] = {
    "BOOL": (8, torch.bool),
    "U8": (8, torch.uint8),
    "I8": (8, torch.int8),
    "F8_E4M3": (8, torch.float8_e4m3fn),
    "F8_E5M2": (8, torch.float8_e5m2),
    "F8_E8M0": (8, torch.float8_e8m0fnu),
    "I16": (16, torch.int16),
    "U16": (16, torch.uint16),
    "F16": (16, torch.float16),
    "BF16": (16, torch.bfloat16),
    "I32": (32, torch.int32),
    "U32": (32, torch.uint32),
    "F32": (32, torch.float32),
    "I64": (64, torch.int64),
    "U64": (64, torch.uint64),
    "F64": (64, torch.float64),
    "F4": (4, torch.float4_e2m1fn_x2),
}
TORCH_TO_ST: dict[torch.dtype, str] = {v[1]: k for k, v in DTYPES.items()}
# float4_e2m1fn_x2 is one byte holding two codes; stored as U8 bytes, its torch dtype kept in the manifest.
TORCH_TO_ST[torch.float4_e2m1fn_x2] = "U8"


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes of a tensor of `shape`; F4 counts elements (two per byte)."""
    bits = DTYPES[dtype][0] * math.prod(shape)
    return (bits + 7) // 8


def torch_dtype_name(dtype: torch.dtype) -> str:
    """'torch.float8_e8m0fnu' -> 'float8_e8m0fnu'."""
    return str(dtype).removeprefix("torch.")


def torch_dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype
