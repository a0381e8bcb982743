"""JSON that costs far more memory than its bytes: items are bounded from the bytes before a file is parsed,
for the JSON files and for a safetensors header."""

import json
import re

import pytest

from fimoe_convert.errors import InputError

# ------------------------------------------------------------- 1. JSON that costs far more memory than its bytes


def _items(value) -> int:
    """The keys, values and containers in a parsed JSON value (what count_items bounds from above)."""
    if isinstance(value, dict):
        return 1 + sum(1 + _items(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_items(v) for v in value)
    return 1


@pytest.mark.parametrize("item, n, refused", [
    (b"{}", 600, True),  # each `{}` counts twice (`{` and `,`): the bound is conservative for containers
    (b"[]", 600, True),
    (b'"ab"', 1100, True),
    (b"1.5", 1100, True),
    (b"[[[1]]]", 300, True),
    (b'"ab"', 990, False),  # just under the limit: read
    (b'{"k":1}', 300, False),
])
def test_json_with_too_many_items_is_refused_before_it_is_built(tmp_path, monkeypatch, item, n, refused):
    from fimoe_convert.files import jsonfile

    monkeypatch.setattr(jsonfile, "MAX_ITEMS", 1000)
    path = tmp_path / "fimoe-manifest.json"
    path.write_bytes(b"[" + b",".join([item] * n) + b"]")
    built = []
    monkeypatch.setattr(jsonfile.json, "loads", lambda *a, **k: built.append(1) or [])
    if refused:
        with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: about \d+ JSON items \(keys, values and "
                                             r"containers\), more than the 1000 such a file may hold \(reading them "
                                             r"would take ~[\d.]+ kB\); redo$"):
            jsonfile.read_json(path, "manifest", fix="redo")
        assert built == []
    else:
        jsonfile.read_json(path, "manifest", fix="redo")
        assert built == [1]


@pytest.mark.parametrize("text", [
    b"[]", b'{"a": [1, 2, {"b": null}], "c": "x,y:[{"}', b'[[[[[]]]]]', b'{"a": {}, "b": []}',
    b'[1e5, -2, true, false, null, "\\u00e9"]',
])
def test_the_item_count_bounds_the_parsed_items(text):
    from fimoe_convert.files.jsonfile import count_items

    assert count_items(text) >= _items(json.loads(text))


@pytest.mark.slow
def test_the_largest_real_files_fit_the_limits(tiny_ckpt):
    """V4-Pro's index (145,116 tensors) within a fifth of the byte and item limits; so are the tiny files."""
    from fimoe_convert.files.jsonfile import MAX_BYTES, MAX_ITEMS, count_items

    names = [f"layers.{i % 61}.ffn.experts.{i % 384}.w{i % 3 + 1}.weight_{i}" for i in range(145_116)]
    index = json.dumps({"metadata": {"total_size": 1 << 40}, "weight_map": {
        n: f"model-{i % 64 + 1:05d}-of-00064.safetensors" for i, n in enumerate(names)}}, indent=2).encode()
    assert len(index) * 5 < MAX_BYTES["index"] and count_items(index) * 5 < MAX_ITEMS
    for f in tiny_ckpt.glob("*.json"):
        assert count_items(f.read_bytes()) * 1000 < MAX_ITEMS


def test_a_safetensors_header_with_too_many_items_is_refused(tmp_path, monkeypatch):
    import struct

    from fimoe_convert.files.safetensors import header as st_header

    monkeypatch.setattr(st_header, "MAX_HEADER_ITEMS", 1000)
    header = b'{"__metadata__": {}, "a": {"dtype": "U8", "shape": [' + b",".join([b"1"] * 2000) + b"]}}"
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: header: about 20\d\d JSON items .* more than the "
                                         r"1000 such a file may hold .*; the file is corrupt or not safetensors$"):
        st_header.read_header(path)
