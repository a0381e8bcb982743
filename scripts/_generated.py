"""The one `--print | --write | --check` main of the scripts that keep generated text in the documents
(scripts/readme_examples.py, scripts/decision_table.py)."""
import argparse
import os
from collections.abc import Callable
from pathlib import Path


def main(argv: list[str] | None, description: str, generate: Callable[[], object], show: Callable[[object], str],
         documents: list[tuple[Path, Callable, Callable, str]]) -> int:
    """`generate()` once, then --print: `show(generated)`; --write: each document's text replaced by
    `rewrite(text, generated)` where that changes it (atomically); --write and --check: print each document's
    `differences(text, generated)` (one line per problem) or its `matches` line. `documents`: (path, rewrite,
    differences, matches). Exit 1 when a document differs."""
    ap = argparse.ArgumentParser(description=description)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--print", action="store_true", help="print the generated text")
    mode.add_argument("--write", action="store_true", help="rewrite the documents' stale regions in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a region differs")
    a = ap.parse_args(argv)
    generated = generate()
    if a.print:
        print(show(generated), end="")
        return 0
    problems = []
    for path, rewrite, differences, matches in documents:
        text = path.read_text()
        if a.write:
            new = rewrite(text, generated)
            if new != text:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(new)
                os.replace(tmp, path)
        found = differences(path.read_text(), generated)
        problems += found
        print("\n".join(found) or matches)
    return 1 if problems else 0
