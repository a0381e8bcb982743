"""docs/TARGETS.md's targets table is `fimoe-convert targets` less its `here` column, as the kernel table makes it now
(scripts/readme_examples.py writes the block; `--write` repairs it)."""
import dataclasses
import importlib.util
from pathlib import Path

import pytest

from fimoe_convert.cli import targets_lines
from fimoe_convert.inspection import list_targets

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_examples", REPO / "scripts" / "readme_examples.py")
rx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rx)

DOC = "docs/TARGETS.md"
TEXT = (REPO / DOC).read_text()


@pytest.fixture(scope="module")
def generated():
    return rx.generate(["targets"])


def test_the_block_matches_the_table(generated):
    assert rx.differences(TEXT, generated, DOC) == [], (
        f"{DOC}'s targets table is stale; run `python3 scripts/readme_examples.py --write`")


def test_the_block_says_nothing_of_the_machine():
    block = rx.readme_blocks(TEXT, DOC)["targets"]
    assert block.splitlines()[0].split() == ["target", "arch", "weights", "nvshmem", "notes"]
    for word in ("here", "not installed", "CUDA device"):
        assert word not in block


def test_the_block_is_the_commands_table_less_one_column():
    """With every target available, `targets`' lines less the `here` field are the document's lines."""
    rows = [dataclasses.replace(r, available_here=True, why="") for r in list_targets()]
    start = len(f"{'target':34} {'arch':10} {'weights':9} {'nvshmem':7} ")
    table = {"target"} | {r.name for r in rows}  # the header and the targets' rows; not the lines below them
    cut = [line[:start] + line[start + 5:] if line.split(" ")[0] in table else line for line in targets_lines(rows)]
    assert [line.rstrip() for line in cut] == targets_lines(rows, here=False)


@pytest.mark.parametrize("edit, reported", [
    (lambda t: t.replace("sm120_mxfp4_mxfp8_bf16_cake        12.0", "sm120_mxfp4_mxfp8_bf16_cake        12.1", 1),
     "targets: docs/TARGETS.md shows"),
    (lambda t: t.replace("  v4_pro_bf16 ", "  v4_pro_bf17 ", 1), "targets: docs/TARGETS.md shows"),
    (lambda t: t.replace("<!-- example: targets -->\n", ""), "targets: no `<!-- example: targets -->` marker"),
    (lambda t: t.replace("<!-- example: targets -->", "<!-- example: demo -->"),
     "demo: docs/TARGETS.md marks an example"),
], ids=["arch-changed", "preset-renamed", "marker-deleted", "another-documents-marker"])
def test_a_changed_block_is_reported_and_rewritten(generated, edit, reported):
    changed = edit(TEXT)
    assert changed != TEXT
    problems = rx.differences(changed, generated, DOC)
    assert any(p.startswith(reported) for p in problems), problems
    if "shows" in reported:
        assert rx.differences(rx.rewrite(changed, generated), generated, DOC) == []
