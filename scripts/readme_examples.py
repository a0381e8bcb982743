#!/usr/bin/env python3
"""python3 scripts/readme_examples.py --print | --write | --check: run the example commands of README.md (on the demo
checkpoint) and docs/TARGETS.md (the targets table) and print them, rewrite the documents' marked blocks, or report
the blocks that differ (exit 1).

A block is marked by `<!-- example: NAME -->` on the line just before its fence. Blocks are compared after
`normalize()` (timings, rates, the temporary folder), so `--write` leaves a block alone when only those differ."""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts' shared main (also when loaded by path)
import _generated  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# `fimoe-convert targets` less its `here` column, which depends on the machine: the listing of docs/TARGETS.md
TARGETS_TABLE = ["-c", "from fimoe_convert.cli import targets_lines; from fimoe_convert.inspection import "
                       "list_targets; print('\\n'.join(targets_lines(list_targets(), here=False)))"]

# name -> (document, commands: the arguments after `fimoe-convert`, or `-c CODE` for Python; whether the block
# shows the commands as `$ ...` lines)
EXAMPLES = {
    "recommend": ("README.md", [["recommend", "--engine", "vllm", "--gpu", "H200"]], True),
    "demo": ("README.md", [["demo"]], False),
    "inspect-verify": ("README.md", [["inspect", "demo-out/out-megamoe_sm90_mxfp4"], ["verify", "demo-out/out-bf16"]],
                       True),
    "upload-dry-run": ("README.md", [["upload", "demo-out/out-bf16", "your-name/DeepSeek-V4-Tiny-bf16", "--dry-run"]],
                       True),
    "targets": ("docs/TARGETS.md", [TARGETS_TABLE], False),
}
DOCUMENTS = sorted({doc for doc, _, _ in EXAMPLES.values()})
MARKER = re.compile(r"<!-- example: ([\w-]+) -->\n(```[^\n]*\n)(.*?)(```)", re.S)
VARYING = [  # (pattern, replacement): what changes between runs and machines
    (re.compile(r"\bin \d+(?:\.\d+)? s\b"), "in N s"),
    (re.compile(r"\d+(?:\.\d+)? [kMGT]?B/s\b"), "N B/s"),
    (re.compile(r"\d+(?:\.\d+)? [kMGT]?B free\b"), "N B free"),
]


def normalize(text: str, workdir: str | None = None) -> str:
    if workdir:
        text = text.replace(workdir.rstrip("/") + "/", "")
    for pattern, replacement in VARYING:
        text = pattern.sub(replacement, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def _run(args: list[str], cwd: str, env: dict) -> str:
    cmd = [sys.executable, *args] if args[0] == "-c" else [sys.executable, "-m", "fimoe_convert", *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"`fimoe-convert {' '.join(args)}` exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def generate(names: list[str] | None = None) -> dict[str, str]:
    """Run every example (or those named) in a fresh folder; return each block's text (raw, temporary paths made
    relative)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="readme-examples-") as tmp:
        # the repo's package, no Hub token or stored login, so the upload listing says the same on every machine
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   HF_HOME=str(Path(tmp) / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
        for name, (_, commands, prompt) in EXAMPLES.items():
            if names is not None and name not in names:
                continue
            text = ""
            for args in commands:
                text += f"$ fimoe-convert {' '.join(args)}\n" if prompt else ""
                text += _run(args, tmp, env)
            out[name] = text.replace(tmp.rstrip("/") + "/", "").rstrip("\n") + "\n"
    return out


def readme_blocks(text: str, doc: str = "README.md") -> dict[str, str]:
    """Each marked block's content, by name; a name marked twice is an error."""
    blocks: dict[str, str] = {}
    for m in MARKER.finditer(text):
        if m.group(1) in blocks:
            raise ValueError(f"{doc} marks the example {m.group(1)!r} twice; keep one marker per block")
        blocks[m.group(1)] = m.group(3)
    return blocks


def differences(text: str, generated: dict[str, str], doc: str = "README.md") -> list[str]:
    """One line per problem of the document `doc`: a missing or unknown marker, or a block whose normalized text
    differs (the examples of the other documents are left out)."""
    blocks = readme_blocks(text, doc)
    generated = {n: g for n, g in generated.items() if EXAMPLES[n][0] == doc}
    problems = [f"{n}: no `<!-- example: {n} -->` marker before a fenced block in {doc}"
                for n in generated if n not in blocks]
    problems += [f"{n}: {doc} marks an example this script does not generate" for n in blocks
                 if n not in EXAMPLES or EXAMPLES[n][0] != doc]
    for name in generated:
        if name in blocks and normalize(blocks[name]) != normalize(generated[name]):
            problems.append(f"{name}: {doc} shows\n{normalize(blocks[name])}but the command prints now\n"
                            f"{normalize(generated[name])}")
    return problems


def rewrite(text: str, generated: dict[str, str]) -> str:
    """README text with each stale marked block replaced; a block equal after normalize() is kept as is."""
    def sub(m: re.Match) -> str:
        new = generated.get(m.group(1))
        if new is None or normalize(m.group(3)) == normalize(new):
            return m.group(0)
        return f"<!-- example: {m.group(1)} -->\n{m.group(2)}{new}{m.group(4)}"
    return MARKER.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    def matches(doc: str) -> str:
        mine = sum(1 for d, _, _ in EXAMPLES.values() if d == doc)
        return f"{doc}: {mine} example {'block matches' if mine == 1 else 'blocks match'}"

    def show(blocks: dict[str, str]) -> str:
        return "".join(f"<!-- example: {name} -->\n```text\n{block}```\n\n" for name, block in blocks.items())

    documents = [(REPO / doc, rewrite, lambda text, gen, doc=doc: differences(text, gen, doc), matches(doc))
                 for doc in DOCUMENTS]
    return _generated.main(argv, __doc__.splitlines()[0], generate, show, documents)


if __name__ == "__main__":
    sys.exit(main())
