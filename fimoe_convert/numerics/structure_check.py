"""The check of a stored structure before anything is rebuilt from it (pure: no torch, no FlashInfer). A structure
comes from a manifest anyone may have written (an output downloaded from the Hub): it may name only the dataclasses
the target's kernel returns (the kernel table's `structure_classes`, exact names, each field a tensor or one plain
type), and every tensor node a known dtype and a shape whose bytes the stored tensor holds."""

from __future__ import annotations

import math

from ..dtypes import DTYPES

# torch dtype name -> bytes per element (float4_e2m1fn_x2 is one byte holding two codes)
ITEMSIZE: dict[str, int] = {name: max(1, bits // 8) for bits, name in DTYPES.values()}
MAX_NODES = 10_000  # a kernel's structure has tens of nodes; more is not ours
MAX_DEPTH = 16  # nesting levels (FlashInfer's are 3 or 4)
MAX_DIM = 2**40  # elements along one dimension, and a stride: larger is not a tensor this tool writes
PLAIN = {"int": int, "bool": bool, "float": float, "str": str}
_KINDS = ({"none"}, {"tuple"}, {"list"}, {"value"}, {"dataclass", "fields"}, {"tensor", "dtype", "shape"},
          {"tensor", "dtype", "shape", "stride"})


def _dims(x) -> bool:
    return isinstance(x, list) and len(x) <= MAX_DEPTH and all(type(n) is int and 0 <= n <= MAX_DIM for n in x)


def stored_nbytes(node: dict) -> int:
    """Bytes the stored tensor of a (checked) tensor node holds: its shape's, or for a strided view the span of
    storage it reaches."""
    shape, stride = node["shape"], node.get("stride")
    if stride is None:
        count = math.prod(shape)
    else:
        count = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    return count * ITEMSIZE[node["dtype"]]


STORED_AS_BYTES = {"float4_e2m1fn_x2"}  # torch dtypes a shard stores as uint8 bytes


def structure_problem(node, classes: dict[str, dict[str, str]], nbytes: dict[str, int] | None = None,
                      dtypes: dict[str, str] | None = None, shards: dict[str, tuple[str, int]] | None = None
                      ) -> str | None:
    """Why `node` may not be rebuilt, naming the node by its path, or None. `classes`: {"module:qualname":
    {field: "tensor" | "int" | "bool" | "float" | "str"}} of the kernel; `nbytes`: {tensor name: stored bytes},
    when known (verify and the loader read them from the shard headers), checked against each tensor node, as are
    `dtypes` ({tensor name: stored torch dtype name}); `shards` ({tensor name: (its shard, the tensor bytes that
    shard holds)}): the bytes of all tensor nodes together may not exceed those of the shards they name (a tensor
    named over and over would be rebuilt as many times)."""
    count = [0]
    mentioned = [0]

    def walk(n, path: str, depth: int, kind: str | None) -> str | None:
        count[0] += 1
        if count[0] > MAX_NODES or depth > MAX_DEPTH:
            return f"{path}: more than {MAX_NODES} nodes or {MAX_DEPTH} levels"
        if not isinstance(n, dict) or set(n) not in _KINDS:
            keys = sorted(n)[:6] if isinstance(n, dict) else type(n).__name__
            return f"{path}: not a node fimoe-convert writes ({keys})"
        if kind in PLAIN:
            if "value" not in n or type(n["value"]) is not PLAIN[kind]:
                return f"{path}: expected a plain {kind} value for this field"
            return None
        if "value" in n:
            return f"{path}: a plain value where the kernel's object holds a tensor"
        if "none" in n:
            return None if n["none"] is True and kind is None and depth > 0 else f"{path}: an empty slot here"
        if "tuple" in n or "list" in n:
            items = n.get("tuple", n.get("list"))
            if not isinstance(items, list) or kind == "tensor":
                return f"{path}: a sequence where a tensor belongs" if kind else f"{path}: not a list of nodes"
            return next((p for i, c in enumerate(items) if (p := walk(c, f"{path}[{i}]", depth + 1, None))), None)
        if "dataclass" in n:
            return dataclass_node(n, path, depth, kind)
        return tensor_node(n, path)

    def dataclass_node(n: dict, path: str, depth: int, kind: str | None) -> str | None:
        name, fields = n["dataclass"], n["fields"]
        if kind == "tensor" or not isinstance(name, str) or name not in classes:
            known = ", ".join(classes) or "none"
            return (f"{path}: names the class {str(name)[:120]!r}, which is not one this target's kernel returns "
                    f"(allowed: {known}); nothing a file names is imported or run")
        want = classes[name]
        if not isinstance(fields, dict) or set(fields) != set(want):
            got = sorted(fields)[:8] if isinstance(fields, dict) else type(fields).__name__
            return f"{path}: {name.rsplit(':', 1)[-1]} has the fields {sorted(want)}, the structure gives {got}"
        return next((p for f in sorted(want) if (p := walk(fields[f], f"{path}.{f}", depth + 1, want[f]))), None)

    def tensor_node(n: dict, path: str) -> str | None:
        if not isinstance(n["tensor"], str) or n["dtype"] not in ITEMSIZE or not _dims(n["shape"]):
            return (f"{path}: tensor node {str(n['tensor'])[:120]!r} with dtype {str(n['dtype'])[:40]!r} and shape "
                    f"{str(n['shape'])[:80]}: expected a name, a dtype of {', '.join(ITEMSIZE)} and a list of sizes")
        if "stride" in n and not (_dims(n["stride"]) and len(n["stride"]) == len(n["shape"])):
            return f"{path}: tensor {n['tensor']!r} has stride {str(n['stride'])[:80]} for shape {n['shape']}"
        want = stored_nbytes(n)
        mentioned[0] += want
        if nbytes is not None:
            have = nbytes.get(n["tensor"])
            if have != want:
                held = "is not in the output" if have is None else f"holds {have} bytes"
                return f"{path}: tensor {n['tensor']!r} {held}; its node ({n['dtype']} {n['shape']}) needs {want}"
        stored = (dtypes or {}).get(n["tensor"])
        if stored is not None and stored != n["dtype"] and not (n["dtype"] in STORED_AS_BYTES and stored == "uint8"):
            return f"{path}: tensor {n['tensor']!r} is stored as {stored}, its node says {n['dtype']}"
        return None

    bad = walk(node, "structure", 0, None)
    if bad is None and shards is not None:
        held = {shards[name] for name in tensor_node_names(node) if name in shards}
        budget = sum(size for _, size in held)
        if mentioned[0] > budget:
            return (f"structure: its tensor nodes come to {mentioned[0]} bytes, more than the {budget} tensor bytes of "
                    f"the {len(held)} shard(s) they name; a tensor is named over and over")
    return bad


def tensor_node_names(node: dict) -> list[str]:
    """Every tensor name a (checked) structure mentions, in order, repeats included."""
    if "tensor" in node:
        return [node["tensor"]]
    children = node.get("tuple") or node.get("list") or list(node.get("fields", {}).values())
    return [n for child in children for n in tensor_node_names(child)]
