"""Faithful storage of the objects FlashInfer's preprocess functions return: nested tuples/lists of
tensors, None slots and plain values. `flatten` gives a JSON structure plus the tensors to store;
`unflatten` rebuilds the same object: same nesting, dtypes, shapes, strides and bytes.

A non-contiguous tensor is stored as the span of its storage that it covers, and rebuilt as an
`as_strided` view of that span (never `.contiguous()`-ed), so K-major layouts stay K-major.
Dtypes safetensors lacks (float4_e2m1fn_x2) are stored as their bytes and viewed back."""

from __future__ import annotations

import dataclasses

import torch

from ..dtypes import torch_dtype_from_name, torch_dtype_name
from ..records import DataclassNode, ListNode, Node, NoneNode, TupleNode, ValueNode

# the check that comes before unflatten
from .structure_check import as_node, stored_nbytes, structure_problem, tensor_node_names  # noqa: F401

_STORED_AS_BYTES = {torch.float4_e2m1fn_x2}


def _span(t: torch.Tensor) -> int:
    """Elements of storage a strided tensor reaches, from its first element."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def flatten(obj, prefix: str, top_names: tuple[str, ...] = ()) -> tuple[dict, dict[str, torch.Tensor]]:
    """(structure, {name: contiguous tensor to store}); tensor names are `prefix.<path>`, where a path
    step is a tuple index (the outermost named by `top_names`, e.g. fc1/fc2) or a dataclass field."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(x, path: str):
        if x is None:
            return {"none": True}
        if isinstance(x, (tuple, list)):
            names = top_names if path == prefix and top_names and len(top_names) == len(x) else range(len(x))
            return {"tuple" if isinstance(x, tuple) else "list": [walk(v, f"{path}.{n}") for n, v in zip(names, x)]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            cls = type(x)
            return {"dataclass": f"{cls.__module__}:{cls.__qualname__}",
                    "fields": {f.name: walk(getattr(x, f.name), f"{path}.{f.name}")
                               for f in dataclasses.fields(x) if f.init}}
        if isinstance(x, torch.Tensor):
            name = path
            node = {"tensor": name, "dtype": torch_dtype_name(x.dtype), "shape": list(x.shape)}
            if x.is_contiguous():
                stored = x.detach()
            else:
                stored = torch.as_strided(x.detach(), (_span(x),), (1,), x.storage_offset()).clone()
                node["stride"] = list(x.stride())
            if x.dtype in _STORED_AS_BYTES:
                stored = stored.view(torch.uint8)
            tensors[name] = stored.contiguous()
            return node
        if isinstance(x, (bool, int, float, str)):
            return {"value": x}
        raise TypeError(f"{path}: cannot store a {type(x).__name__} from FlashInfer's output")

    return walk(obj, prefix), tensors


def unflatten(node, tensors: dict[str, torch.Tensor], classes: dict[str, type] | None = None):
    """Rebuild what `flatten` stored (its nodes, or their JSON), from the stored tensors by name (on any device).
    `classes`: the dataclasses the structure may name, {"module:qualname": class} resolved by the caller from its
    own table; a name comes from the file and is only looked up there, never imported. Check the node first
    (`structure_problem`)."""
    return _rebuild(as_node(node), tensors, classes or {})


def _rebuild(node: Node, tensors: dict[str, torch.Tensor], classes: dict[str, type]):
    if isinstance(node, NoneNode):
        return None
    if isinstance(node, TupleNode):
        return tuple(_rebuild(n, tensors, classes) for n in node.items)
    if isinstance(node, ListNode):
        return [_rebuild(n, tensors, classes) for n in node.items]
    if isinstance(node, ValueNode):
        return node.value
    if isinstance(node, DataclassNode):
        cls = classes.get(node.dataclass)
        if cls is None:
            raise ValueError(f"dataclass {node.dataclass!r} is not one this target's kernel returns")
        return cls(**{k: _rebuild(v, tensors, classes) for k, v in node.fields.items()})
    t = tensors[node.tensor]
    dtype = torch_dtype_from_name(node.dtype)
    want = stored_nbytes(node)
    if t.dtype != dtype and not (dtype in _STORED_AS_BYTES and t.dtype == torch.uint8):
        raise ValueError(f"tensor {node.tensor!r} is stored as {torch_dtype_name(t.dtype)}, its structure says "
                         f"{node.dtype}")
    if t.numel() * t.element_size() != want:
        raise ValueError(f"tensor {node.tensor!r} holds {t.numel() * t.element_size()} bytes, its structure "
                         f"({node.dtype} {list(node.shape)}) needs {want}")
    if t.dtype != dtype:
        t = t.view(dtype)
    if node.stride is not None:  # t may be a view into a shared buffer
        return t.as_strided(node.shape, node.stride, t.storage_offset())
    return t.reshape(node.shape)


def tensor_names(node) -> list[str]:
    """Every stored tensor name in a structure, in order."""
    return tensor_node_names(node)


def same_object(a, b) -> bool:
    """Structure, dtypes, shapes, strides and bytes all equal (what the tests call bit-identical)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same_object(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same_object(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride()
                and torch.equal(_bytes(a), _bytes(b)))
    return a == b


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor in row-major order; reshape(-1) first: a size-1 last dimension may carry any stride,
    and viewing such a tensor as bytes fails."""
    return t.cpu().contiguous().reshape(-1).view(torch.uint8)
