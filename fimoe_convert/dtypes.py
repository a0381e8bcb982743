"""safetensors dtype names and sizes (pure, no torch), and their torch dtypes (torch imported on first use)."""

from __future__ import annotations

import math
from collections.abc import Iterable

FP4_GROUP = 32  # values per E8M0 scale byte in DeepSeek's FP4 (MXFP4) weights

# safetensors dtype -> (bits per element, name of the torch dtype)
DTYPES: dict[str, tuple[int, str]] = {
    "BOOL": (8, "bool"),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "I16": (16, "int16"),
    "U16": (16, "uint16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "I32": (32, "int32"),
    "U32": (32, "uint32"),
    "F32": (32, "float32"),
    "I64": (64, "int64"),
    "U64": (64, "uint64"),
    "F64": (64, "float64"),
    "F4": (4, "float4_e2m1fn_x2"),
}
# float4_e2m1fn_x2 is one byte holding two codes: stored as U8 bytes, its torch dtype kept in the manifest.
_ST_OF_TORCH_NAME = {name: st for st, (_, name) in DTYPES.items()} | {"float4_e2m1fn_x2": "U8"}


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes of a tensor of `shape`; F4 counts elements (two per byte)."""
    bits = DTYPES[dtype][0] * math.prod(shape)
    return (bits + 7) // 8


def torch_dtype(st_dtype: str):
    """The torch dtype of a safetensors dtype name."""
    import torch

    return getattr(torch, DTYPES[st_dtype][1])


def st_dtype(dtype) -> str:
    """The safetensors dtype name a torch dtype is stored as."""
    return _ST_OF_TORCH_NAME[torch_dtype_name(dtype)]


def torch_dtype_name(dtype) -> str:
    """torch.float8_e8m0fnu -> 'float8_e8m0fnu'."""
    return str(dtype).removeprefix("torch.")


def torch_dtype_from_name(name: str):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype
