#!/usr/bin/env python3
"""python3 scripts/decision_table.py --print | --write | --check: the "which target, or none" table of
docs/TARGETS.md, made from the same data as `fimoe-convert recommend` (fimoe_convert/serving.py): print it,
rewrite the marked region, or report that it differs (exit 1).

The region runs from `<!-- generated: decision-table -->` to `<!-- end: decision-table -->`, as README.md's
example blocks are kept by scripts/readme_examples.py (the same main: scripts/_generated.py)."""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts' shared main (also when loaded by path)
import _generated  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "TARGETS.md"
START, END = "<!-- generated: decision-table -->", "<!-- end: decision-table -->"
REGION = re.compile(re.escape(START) + r"\n(.*?)" + re.escape(END), re.S)


def generate() -> str:
    sys.path.insert(0, str(REPO))
    from fimoe_convert.serving import decision_table

    return decision_table()


def differences(text: str, table: str) -> list[str]:
    """One line per problem: the markers missing or twice, or the region differing from the table."""
    found = REGION.findall(text)
    if len(found) != 1:
        return [f"docs/TARGETS.md: expected one region from {START} to {END}, found {len(found)}"]
    if found[0] != table:
        return [f"decision-table: docs/TARGETS.md shows\n{found[0]}but fimoe_convert/serving.py makes now\n{table}"]
    return []


def rewrite(text: str, table: str) -> str:
    """The region replaced by `table`; the text as it is unless it holds exactly one region."""
    if len(REGION.findall(text)) != 1:
        return text
    return REGION.sub(lambda m: f"{START}\n{table}{END}", text, count=1)


def main(argv: list[str] | None = None) -> int:
    matches = "docs/TARGETS.md: the decision table matches fimoe_convert/serving.py"
    return _generated.main(argv, __doc__.splitlines()[0], generate, lambda table: table,
                           [(DOC, rewrite, differences, matches)])


if __name__ == "__main__":
    sys.exit(main())
