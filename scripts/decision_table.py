#!/usr/bin/env python3
"""python3 scripts/decision_table.py --print | --write | --check: the "which target, or none" table of
docs/TARGETS.md, made from the same data as `fimoe-convert recommend` (fimoe_convert/serving.py): print it,
rewrite the marked region, or report that it differs (exit 1).

The region runs from `<!-- generated: decision-table -->` to `<!-- end: decision-table -->`, as README.md's
example blocks are kept by scripts/readme_examples.py."""
import argparse
import os
import re
import sys
from pathlib import Path

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
    return REGION.sub(lambda m: f"{START}\n{table}{END}", text, count=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--print", action="store_true", help="print the table")
    mode.add_argument("--write", action="store_true", help="rewrite docs/TARGETS.md's region in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when the region differs")
    a = ap.parse_args(argv)
    table = generate()
    if a.print:
        print(table, end="")
        return 0
    text = DOC.read_text()
    if a.write and not differences(rewrite(text, table), table):
        tmp = DOC.with_name(DOC.name + ".tmp")
        tmp.write_text(rewrite(text, table))
        os.replace(tmp, DOC)
    problems = differences(DOC.read_text(), table)
    print("\n".join(problems) or "docs/TARGETS.md: the decision table matches fimoe_convert/serving.py")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
