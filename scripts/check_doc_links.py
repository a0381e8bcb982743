#!/usr/bin/env python3
"""python3 scripts/check_doc_links.py [REPO]: check every relative link and image in README.md, docs/*.md and
benchmarks/results/README.md: the file exists in the repo (tracked or about to be), and a #fragment names a heading
of the target file. Links outside the repository are reported too."""
import re
import sys
from pathlib import Path

repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
files = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
files += [p for p in [repo / "benchmarks" / "results" / "README.md"] if p.exists()]
link = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")

def anchors(md: Path) -> set[str]:
    out = set()
    for line in md.read_text().splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            t = m.group(1).strip().lower()
            t = re.sub(r"[^\w\- ]", "", t).replace(" ", "-")
            out.add(t)
    return out

bad = ok = external = 0
for f in files:
    text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)  # links in code blocks are not links
    for m in link.finditer(text):
        target = m.group(2)
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            external += 1
            print(f"EXTERNAL {f.relative_to(repo)}: {target}")
            continue
        path, _, frag = target.partition("#")
        dest = (f.parent / path).resolve() if path else f
        problems = []
        if not dest.exists():
            problems.append("no such file")
        elif repo not in dest.parents and dest != repo:
            problems.append("outside the repository")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            problems.append(f"no heading #{frag}")
        if problems:
            bad += 1
            print(f"BROKEN {f.relative_to(repo)}: {target}: {', '.join(problems)}")
        else:
            ok += 1
print(f"{len(files)} files, {ok} relative links resolve, {bad} broken, {external} external")
sys.exit(1 if bad or external else 0)
