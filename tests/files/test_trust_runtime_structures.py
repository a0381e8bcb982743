"""What the runtime rebuilds from a manifest's structure: only the dataclasses the kernel table declares for its
target, with the declared kind of each field, and a tensor only as stored. A downloaded output's manifest is
written by whoever published it, so every other structure is refused in one line naming the node."""

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
from test_reliability import cli, refused
from test_trust import edit_json

from fimoe_convert import convert, verify
from fimoe_convert.errors import InputError
from fimoe_convert.files.names import MANIFEST_NAME
from fimoe_convert.kernels import BY_NAME, KERNELS
from fimoe_convert.numerics.structure_check import structure_problem

CAKE = "sm120_mxfp4_mxfp8_bf16_cake"
CAKE_CLASS = next(iter(BY_NAME[CAKE].structure_classes))




# ------------------------------------------------------------- 1. the runtime rebuilds only the kernel's own types


@pytest.fixture(scope="module")
def cake_out(tmp_path_factory):
    """A finished sm120 cake output (its structure is a FlashInfer dataclass with tensor and int/bool fields)."""
    pytest.importorskip("flashinfer")
    from fimoe_convert.testing import make_checkpoint

    base = tmp_path_factory.mktemp("cake")
    src = make_checkpoint(base / "src", "tiny", layers=1, hash_layers=0, mtp=0, extreme_scales=False)
    convert(str(src), str(base / "out"), CAKE)
    return base / "out"


def _set(path: list, value):
    """A change of the structure: the node at `path` (keys into the real structure) becomes `value`."""
    def change(s):
        node = s
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value(copy.deepcopy(node[path[-1]])) if callable(value) else value
        return s
    return change


SENTINEL = "/tmp/fimoe-structure-check-pwned"
STRUCTURES = {
    # name: (change of the real structure, text of the one-line refusal)
    "os-system": (
        lambda s: {"dataclass": "flashinfer.jit:os.system", "fields": {"command": {"value": f"touch {SENTINEL}"}}},
        r"names the class 'flashinfer\.jit:os\.system', which is not one this target's kernel returns",
    ),
    "import-module": (
        lambda s: {"dataclass": "flashinfer:importlib.import_module", "fields": {"name": {"value": "os"}}},
        r"names the class 'flashinfer:importlib\.import_module', which is not one",
    ),
    "class-inside-a-tuple": (
        lambda s: {"tuple": [s, {"dataclass": "builtins:eval", "fields": {}}]},
        r"structure\[1\]: names the class 'builtins:eval'",
    ),
    "allowed-class-extra-field": (
        _set(["fields", "evil"], {"value": 1}),
        r"has the fields \[.*\], the structure gives",
    ),
    "allowed-class-missing-field": (
        lambda s: {**s, "fields": {k: v for k, v in s["fields"].items() if k != "w1_fp4"}},
        r"TransformedCakeMegaWeights has the fields",
    ),
    "value-for-a-tensor-field": (
        _set(["fields", "w1_fp4"], {"value": 3}),
        r"structure\.w1_fp4: a plain value where the kernel's object holds a tensor",
    ),
    "bool-for-an-int-field": (
        _set(["fields", "hidden_size"], {"value": True}),
        r"structure\.hidden_size: expected a plain int value",
    ),
    "tensor-for-an-int-field": (
        _set(["fields", "local_experts"], lambda n: {"tensor": "x", "dtype": "uint8", "shape": [1]}),
        r"structure\.local_experts: expected a plain int value",
    ),
    "none-for-a-tensor-field": (_set(["fields", "w2_sfb"], {"none": True}), r"structure\.w2_sfb: an empty slot here"),
    "unknown-dtype": (
        _set(["fields", "w1_fp4", "dtype"], "__class__"),
        r"structure\.w1_fp4: tensor node .* with "
        r"dtype '__class__'",
    ),
    "bytes-of-another-shape": (
        _set(["fields", "w1_fp4", "shape"], lambda sh: [sh[0] * 2, *sh[1:]]),
        r"holds \d+ bytes.*needs \d+",
    ),
    "negative-stride": (
        _set(["fields", "w2_fp4"], lambda n: {**n, "stride": [-1] * len(n["shape"])}),
        r"structure\.fields\.w2_fp4\.stride\[0\] is -1; expected an integer 0\.\.1099511627776",
    ),
    "extra-key": (
        _set(["fields", "w2_b8"], lambda n: {**n, "code": "print(1)"}),
        r"structure\.fields\.w2_b8\.code is 'print\(1\)', a key it does not have; expected only tensor, dtype, "
        r"shape, stride",
    ),
    "plain-values-only": (
        lambda s: {"tuple": [{"value": 1}, {"value": "x"}]},
        r"structure\[0\]: a plain value where the kernel's object holds a tensor",
    ),
    "deep-nesting": (lambda s: json.loads('{"tuple": [' * 20 + "]}" * 20), r"more than 10000 nodes or 16 levels"),
    "not-an-object": (lambda s: ["tuple"], r"structure is a list \(1 items\); expected an object with the keys none \| "
                                           r"tuple \| list \| value \| dataclass, fields \| tensor, dtype, shape"),
    "no-structure": (lambda s: None, r"structure is None; expected an object with the keys"),
    "shape-not-a-list": (_set(["fields", "w2_fp4"], lambda n: {**n, "shape": "7"}),
                         r"structure\.fields\.w2_fp4\.shape is '7'; expected a list"),
}


@pytest.mark.parametrize("case", STRUCTURES)
def test_the_loader_and_verify_rebuild_only_the_kernels_declared_types(cake_out, tmp_path, case):
    from fimoe_convert.runtime import load_transformed_weights, mega_config

    change, match = STRUCTURES[case]
    out = tmp_path / "out"
    shutil.copytree(cake_out, out)
    edit_json(out / MANIFEST_NAME, lambda m: m["layers"]["layers.0"]["0"].update(
        structure=change(m["layers"]["layers.0"]["0"]["structure"])))
    with pytest.raises(InputError, match=match) as e:
        load_transformed_weights(out, "layers.0", 0)
    assert "\n" not in str(e.value) and "'layers.0'" in str(e.value) and str(e.value).startswith(str(out))
    with pytest.raises(Exception, match=match):
        mega_config(out, "layers.0", 0, device="cpu")
    problems = verify(str(out)).problems
    assert len(problems) == 1 and "block 'layers.0' rank 0" in problems[0], problems
    assert re.search(match, problems[0]), problems
    assert refused(cli("verify", out), match).startswith("error: ")
    assert not Path(SENTINEL).exists()


def test_an_untouched_structure_loads_and_verifies(cake_out):
    from fimoe_convert.runtime import load_transformed_weights

    obj = load_transformed_weights(cake_out, "layers.0", 0)
    assert type(obj).__module__ + ":" + type(obj).__qualname__ == CAKE_CLASS
    assert type(obj.hidden_size) is int and type(obj.has_shared_expert) is bool
    assert verify(str(cake_out)).problems == []


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k.structure_classes], ids=lambda k: k.name)
def test_the_kernel_tables_classes_are_flashinfers_with_those_fields(kernel):
    pytest.importorskip("flashinfer")
    from fimoe_convert.runtime.loader import structure_classes

    for name, cls in structure_classes(kernel).items():
        assert f"{cls.__module__}:{cls.__qualname__}" == name


TENSOR = {"tensor": "t", "dtype": "uint8", "shape": [2, 3]}
PURE = [  # (structure, classes, stored bytes, problem or None): the check alone, without FlashInfer
    ({"tuple": [TENSOR, {"none": True}]}, {}, {"t": 6}, None),
    ({"tuple": [TENSOR]}, {}, {"t": 7}, r"holds 7 bytes; its node \(uint8 \[2, 3\]\) needs 6"),
    ({"tuple": [TENSOR]}, {}, {}, r"'t' is not in the output"),
    ({**TENSOR, "dtype": "float4_e2m1fn_x2"}, {}, {"t": 6}, None),
    ({**TENSOR, "dtype": "bfloat16", "stride": [1, 2]}, {}, {"t": 12}, None),  # span 1+1*1+2*2 = 6 elements
    ({**TENSOR, "stride": [1]}, {}, {"t": 6}, r"has stride \[1\] for shape \[2, 3\]"),
    ({**TENSOR, "shape": [2**41]}, {}, None, r"structure\.shape\[0\] is 2199023255552; expected an integer 0\.\."),
    ({**TENSOR, "shape": [True]}, {}, None, r"structure\.shape\[0\] is True; expected an integer 0\.\."),
    ({**TENSOR, "dtype": "complex32"}, {}, None, r"with dtype 'complex32' and shape \[2, 3\]: expected a dtype of"),
    ({**TENSOR, "shape": [1] * 17}, {}, None, r"expected a dtype of .* and at most 16 sizes"),
    ({"none": True}, {}, None, r"structure: an empty slot here"),
    ({"value": 1}, {}, None, r"a plain value"),
    ({"dataclass": "m:C", "fields": {"a": {"value": 1.5}}}, {"m:C": {"a": "float"}}, None, None),
    ({"dataclass": "m:C", "fields": {"a": {"value": 1}}}, {"m:C": {"a": "float"}}, None, r"expected a plain float"),
    ({"dataclass": "m:D", "fields": {}}, {"m:C": {}}, None, r"names the class 'm:D'.*\(allowed: m:C\)"),
    ({"tuple": [{"tuple": []}] * 10_001}, {}, None, r"more than 10000 nodes"),
]


@pytest.mark.parametrize("node, classes, nbytes, problem", PURE)
def test_the_structure_check_alone(node, classes, nbytes, problem):
    got = structure_problem(node, classes, nbytes)
    if problem is None:
        assert got is None
    else:
        assert got is not None and re.search(problem, got), got


@pytest.mark.parametrize("stored, node_dtype, shape, problem", [
    ("uint8", "uint8", [2, 3], None),
    ("uint8", "float4_e2m1fn_x2", [2, 3], None),  # stored as its bytes
    ("bfloat16", "float16", [2, 3], r"stored as bfloat16, its structure says float16"),
    ("uint8", "int8", [2, 3], r"stored as uint8, its structure says int8"),
    ("uint8", "uint8", [3, 3], r"holds 6 bytes, its structure \(uint8 \[3, 3\]\) needs 9"),
])
def test_the_loader_rebuilds_a_tensor_only_as_stored(stored, node_dtype, shape, problem):
    import torch

    from fimoe_convert.numerics.structure import unflatten

    node = {"tensor": "t", "dtype": node_dtype, "shape": shape}
    t = torch.zeros(6, dtype=getattr(torch, stored))
    if problem is None:
        assert unflatten(node, {"t": t}).shape == tuple(shape)
    else:
        with pytest.raises(ValueError, match=problem):
            unflatten(node, {"t": t})
