"""Error types. Every message names the flag, file or tensor, what was seen, what was expected
and the next step; the CLI prints them as they are (exit 2 for usage, 1 for input/failure)."""

from __future__ import annotations


class FimoeError(Exception):
    """Base class; `exit_code` is what the CLI returns."""

    exit_code = 1

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems) if problems else [message]
        super().__init__(message)


class UsageError(FimoeError):
    """A flag or argument is wrong (exit 2)."""

    exit_code = 2


class InputError(FimoeError):
    """The checkpoint, OUT folder or environment is not what it must be (exit 1)."""


class ValidationError(FimoeError):
    """Several problems found before any tensor was read; all are reported at once."""

    def __init__(self, problems: list[str], exit_code: int = 1):
        self.exit_code = exit_code
        n = len(problems)
        head = problems[0] if n == 1 else f"{n} problems:\n  - " + "\n  - ".join(problems)
        super().__init__(head, problems)


class CorruptTensorError(InputError):
    """Tensor data that cannot be right (scale byte 255, ...)."""


def raise_all(problems: list[str], usage: bool = False) -> None:
    """Raise one ValidationError listing every problem, or return when there are none."""
    if problems:
        raise ValidationError(problems, exit_code=2 if usage else 1)
