"""Error types. Every message names the flag, file or tensor, what was seen, what was expected and the
next step; the CLI prints them as they are (exit 2 for usage, 1 for bad input or failure)."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # NUL, newline, escape...: in no name of a checkpoint or an output


_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{8,}")  # Hugging Face user and org tokens


def redact(text: str, token: str | None = None) -> str:
    """`text` without `token` nor anything shaped like a Hugging Face token: a server may echo the Authorization
    header in an error, and every error is printed."""
    if token:
        text = text.replace(token, "<token>")
    return _TOKEN_RE.sub("hf_<token>", text)


def one_line(text: str) -> str:
    """`text` with control characters (a newline in a flag's value or a file name) escaped: one problem, one line."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def format_problems(problems: list[str]) -> str:
    """One problem as it is; several as 'N problems:' and one indented line each."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems:\n  - " + "\n  - ".join(problems)


class FimoeError(Exception):
    """Base class; `exit_code` is what the CLI returns, `problems` every line it reports."""

    exit_code = 1

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems) if problems else [message]
        super().__init__(message)


class UsageError(FimoeError):
    """A flag or argument is wrong (exit 2)."""

    exit_code = 2


class InputError(FimoeError):
    """The checkpoint, the OUT folder or the environment is not what it must be (exit 1)."""


class ValidationError(FimoeError):
    """Several problems found before any tensor was read; all are reported at once. A problem that starts with a
    flag ("--ep-size 3: ...") is a usage problem: exit 2 when every problem is one, else 1 (bad input)."""

    def __init__(self, problems: list[str]):
        self.exit_code = 2 if all(p.startswith("--") for p in problems) else 1
        super().__init__(format_problems(problems), problems)


class CorruptTensorError(InputError):
    """Tensor data that cannot be right (an E8M0 scale byte 255, ...)."""


class LossyRepackError(InputError):
    """A target's layout cannot hold the source's values exactly and --allow-lossy was not given."""
