"""The check of a stored structure before anything is rebuilt from it (pure: no torch, no FlashInfer). A structure
comes from a manifest anyone may have written (an output downloaded from the Hub): records.py's reader has made it
nodes of the known kinds; here it may name only the dataclasses the target's kernel returns (the kernel table's
`structure_classes`, exact names, each field a tensor or one plain type), and every tensor node a known dtype and a
shape whose bytes the stored tensor holds."""

from __future__ import annotations

import math

from ..dtypes import DTYPES
from ..errors import InputError
from ..records import (
    MAX_DIM,  # noqa: F401  (the limit of a size, as the reader checks it)
    DataclassNode,
    ListNode,
    Node,
    NoneNode,
    TensorNode,
    TupleNode,
    ValueNode,
    read_node,
)

# torch dtype name -> bytes per element (float4_e2m1fn_x2 is one byte holding two codes)
ITEMSIZE: dict[str, int] = {name: max(1, bits // 8) for bits, name in DTYPES.values()}
MAX_NODES = 10_000  # a kernel's structure has tens of nodes; more is not ours
MAX_DEPTH = 16  # nesting levels (FlashInfer's are 3 or 4)
MAX_SHAPE = MAX_DEPTH  # dimensions of one tensor
PLAIN = {"int": int, "bool": bool, "float": float, "str": str}


def stored_nbytes(node: TensorNode) -> int:
    """Bytes the stored tensor of a (checked) tensor node holds: its shape's, or for a strided view the span of
    storage it reaches."""
    if node.stride is None:
        count = math.prod(node.shape)
    else:
        count = 0 if 0 in node.shape else 1 + sum((n - 1) * s for n, s in zip(node.shape, node.stride))
    return count * ITEMSIZE[node.dtype]


STORED_AS_BYTES = {"float4_e2m1fn_x2"}  # torch dtypes a shard stores as uint8 bytes


def as_node(node) -> Node:
    """A structure as nodes: given so, or as its JSON (read by records.py's reader: an InputError naming the node)."""
    return read_node(node) if isinstance(node, (dict, list)) or node is None else node


def structure_problem(node, classes: dict[str, dict[str, str]], nbytes: dict[str, int] | None = None,
                      dtypes: dict[str, str] | None = None, shards: dict[str, tuple[str, int]] | None = None
                      ) -> str | None:
    """Why `node` (nodes, or their JSON) may not be rebuilt, naming the node by its path, or None. `classes`:
    {"module:qualname": {field: "tensor" | "int" | "bool" | "float" | "str"}} of the kernel; `nbytes`: {tensor
    name: stored bytes}, when known (verify and the loader read them from the shard headers), checked against each
    tensor node, as are `dtypes` ({tensor name: stored torch dtype name}); `shards` ({tensor name: (its shard, the
    tensor bytes that shard holds)}): the bytes of all tensor nodes together may not exceed those of the shards
    they name (a tensor named over and over would be rebuilt as many times)."""
    try:
        node = as_node(node)
    except InputError as e:
        return str(e)
    count = [0]
    mentioned = [0]

    def walk(n: Node, path: str, depth: int, kind: str | None) -> str | None:
        count[0] += 1
        if count[0] > MAX_NODES or depth > MAX_DEPTH:
            return f"{path}: more than {MAX_NODES} nodes or {MAX_DEPTH} levels"
        if kind in PLAIN:
            if not isinstance(n, ValueNode) or type(n.value) is not PLAIN[kind]:
                return f"{path}: expected a plain {kind} value for this field"
            return None
        if isinstance(n, ValueNode):
            return f"{path}: a plain value where the kernel's object holds a tensor"
        if isinstance(n, NoneNode):
            return None if n.none is True and kind is None and depth > 0 else f"{path}: an empty slot here"
        if isinstance(n, (TupleNode, ListNode)):
            if kind == "tensor":
                return f"{path}: a sequence where a tensor belongs"
            return next((p for i, c in enumerate(n.items) if (p := walk(c, f"{path}[{i}]", depth + 1, None))), None)
        if isinstance(n, DataclassNode):
            return dataclass_node(n, path, depth, kind)
        return tensor_node(n, path)

    def dataclass_node(n: DataclassNode, path: str, depth: int, kind: str | None) -> str | None:
        if kind == "tensor" or n.dataclass not in classes:
            known = ", ".join(classes) or "none"
            return (f"{path}: names the class {n.dataclass[:120]!r}, which is not one this target's kernel returns "
                    f"(allowed: {known}); nothing a file names is imported or run")
        want = classes[n.dataclass]
        if set(n.fields) != set(want):
            return (f"{path}: {n.dataclass.rsplit(':', 1)[-1]} has the fields {sorted(want)}, the structure gives "
                    f"{sorted(n.fields)[:8]}")
        return next((p for f in sorted(want) if (p := walk(n.fields[f], f"{path}.{f}", depth + 1, want[f]))), None)

    def tensor_node(n: TensorNode, path: str) -> str | None:
        if n.dtype not in ITEMSIZE or len(n.shape) > MAX_SHAPE:
            return (f"{path}: tensor node {n.tensor[:120]!r} with dtype {n.dtype[:40]!r} and shape "
                    f"{str(list(n.shape))[:80]}: expected a dtype of {', '.join(ITEMSIZE)} and at most {MAX_SHAPE} "
                    "sizes")
        if n.stride is not None and len(n.stride) != len(n.shape):
            return f"{path}: tensor {n.tensor!r} has stride {str(list(n.stride))[:80]} for shape {list(n.shape)}"
        want = stored_nbytes(n)
        mentioned[0] += want
        if nbytes is not None:
            have = nbytes.get(n.tensor)
            if have != want:
                held = "is not in the output" if have is None else f"holds {have} bytes"
                return f"{path}: tensor {n.tensor!r} {held}; its node ({n.dtype} {list(n.shape)}) needs {want}"
        stored = (dtypes or {}).get(n.tensor)
        if stored is not None and stored != n.dtype and not (n.dtype in STORED_AS_BYTES and stored == "uint8"):
            return f"{path}: tensor {n.tensor!r} is stored as {stored}, its node says {n.dtype}"
        return None

    bad = walk(node, "structure", 0, None)
    if bad is None and shards is not None:
        held = {shards[name] for name in tensor_node_names(node) if name in shards}
        budget = sum(size for _, size in held)
        if mentioned[0] > budget:
            return (f"structure: its tensor nodes come to {mentioned[0]} bytes, more than the {budget} tensor bytes of "
                    f"the {len(held)} shard(s) they name; a tensor is named over and over")
    return bad


def tensor_node_names(node) -> list[str]:
    """Every tensor name a (checked) structure mentions, in order, repeats included."""
    node = as_node(node)
    if isinstance(node, TensorNode):
        return [node.tensor]
    if isinstance(node, (TupleNode, ListNode)):
        children = node.items
    elif isinstance(node, DataclassNode):
        children = tuple(node.fields.values())
    else:
        children = ()
    return [n for child in children for n in tensor_node_names(child)]
