"""README.md's example blocks equal what their commands print now (scripts/readme_examples.py makes them)."""
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_examples", REPO / "scripts" / "readme_examples.py")
rx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rx)

README_TEXT = (REPO / "README.md").read_text()
EXPECTED = ["demo", "inspect-verify", "recommend", "upload-dry-run"]  # sorted


@pytest.fixture(scope="module")
def generated():
    return rx.generate(EXPECTED)  # one demo run (seconds) for every test here


def test_readme_marks_every_example():
    blocks = rx.readme_blocks(README_TEXT)
    assert sorted(blocks) == sorted(n for n, (doc, _, _) in rx.EXAMPLES.items() if doc == "README.md") == EXPECTED
    assert len(blocks) >= 3 and all(b.strip() for b in blocks.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_readme_block_matches_command_output(generated, name):
    shown = rx.readme_blocks(README_TEXT)[name]
    assert rx.normalize(shown) == rx.normalize(generated[name]), (
        f"README.md's `{name}` example is stale; run `python3 scripts/readme_examples.py --write`")


def _edit_block(text, name, old, new):
    blocks = rx.readme_blocks(text)
    assert old in blocks[name], f"{old!r} not in the {name} block"
    return text.replace(blocks[name], blocks[name].replace(old, new, 1), 1)


@pytest.mark.slow
@pytest.mark.parametrize("edit, reported", [
    (lambda t: _edit_block(t, "upload-dry-run", "bytes", "octets"), "upload-dry-run: README.md shows"),
    (lambda t: _edit_block(t, "inspect-verify", "ok: 7 files", "ok: 6 files"), "inspect-verify: README.md shows"),
    (lambda t: _edit_block(t, "demo", "made tiny", "made small"), "demo: README.md shows"),
    (lambda t: t.replace("<!-- example: demo -->\n", ""), "demo: no `<!-- example: demo -->` marker"),
    (lambda t: t.replace("<!-- example: demo -->", "<!-- example: gone -->"), "gone: README.md marks an example"),
], ids=["upload-byte-word", "verify-count", "demo-word", "marker-deleted", "marker-renamed"])
def test_a_changed_readme_is_reported_and_rewritten(generated, edit, reported):
    changed = edit(README_TEXT)
    assert changed != README_TEXT
    problems = rx.differences(changed, generated)
    assert any(p.startswith(reported) for p in problems), problems
    if "shows" in reported:  # a stale block is what --write repairs
        assert rx.differences(rx.rewrite(changed, generated), generated) == []


@pytest.mark.slow
def test_timings_alone_are_not_a_difference(generated):
    block = rx.readme_blocks(README_TEXT)["demo"]
    assert re.search(r"in \d+(\.\d+)? s", block)
    retimed = README_TEXT.replace(block, re.sub(r"in \d+(\.\d+)? s", "in 99.9 s", block), 1)
    assert rx.differences(retimed, generated) == []
    assert rx.rewrite(retimed, generated) == retimed  # --write leaves it alone: no churn


@pytest.mark.parametrize("raw, workdir, expected", [
    ("converted 8.50 MB in 3.34 s; demo passed in 27 s\n", None, "converted 8.50 MB in N s; demo passed in N s\n"),
    ("verifying: 9.50 MB, 67.38 MB/s  \n\n", None, "verifying: 9.50 MB, N B/s\n"),
    ("disk: 120.5 GB free\n", None, "disk: N B free\n"),
    ("made /tmp/x-1/demo-out/src\n", "/tmp/x-1", "made demo-out/src\n"),
    ("9 files, 3.91 MB\n", None, "9 files, 3.91 MB\n"),
])
def test_normalize(raw, workdir, expected):
    assert rx.normalize(raw, workdir) == expected
