"""Conversion presets (`--config FILE`): TOML files whose keys are `convert()`'s keyword arguments, plus `model`,
the DeepSeek V4 variant the preset is made for (configs/convert/ holds the recommended ones)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import UsageError
from .safe_open import open_regular

# Every key but `model` is a keyword argument of convert() and a flag of `convert`, whose own type converts it
# (the CLI puts the values into click's default_map); `params` (--param KEY=VALUE) is a table of strings.
KEYS = ("model", "target", "revision", "ep_size", "device", "arch", "max_memory", "shard_size", "allow_lossy",
        "params", "writers")
MAX_BYTES = 64 * 1024  # a preset is a few lines; anything larger is not one


def load_preset(path: str | Path) -> dict:
    """The preset's settings, by convert() keyword; every problem names the file and the key (the values of
    flags are converted, and their problems reported, by the CLI)."""
    path = Path(path)
    try:
        with open_regular(path) as f:  # a FIFO or /dev/zero: refused, and never more than MAX_BYTES + 1 read
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise UsageError(f"--config {path}: more than {MAX_BYTES} bytes, more than a preset has; "
                             "pass a preset file (configs/convert/*.toml)")
        data = tomllib.loads(raw.decode())
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file; the presets are in configs/convert/") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--config {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"--config {path}: not valid TOML ({e})") from None
    problems = []
    for key, value in data.items():
        if key not in KEYS:
            problems.append(f"--config {path}: unknown key {key!r}; expected some of {', '.join(KEYS)}")
        elif key in ("model", "params") and not (isinstance(value, str) if key == "model" else (
                isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))):
            problems.append(f"--config {path}: {key} is {value!r}; expected a "
                            + ("string" if key == "model" else "table of strings (--param KEY=VALUE)"))
    if problems:
        raise UsageError("; ".join(problems), problems)
    return data
