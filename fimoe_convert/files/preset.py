"""Conversion presets (`--config FILE`): TOML files whose keys are `convert()`'s keyword arguments, plus `model`,
the DeepSeek V4 variant the preset is made for (configs/convert/ holds the recommended ones)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import UsageError
from .safe_open import open_regular

# key -> type of its value; every key is a keyword argument of convert() but `model`
KEYS: dict[str, type] = {"model": str, "target": str, "ep_size": int, "device": str, "arch": str, "max_memory": str,
                         "shard_size": str, "allow_lossy": bool, "params": dict, "writers": int, "revision": str}
MAX_BYTES = 64 * 1024  # a preset is a few lines; anything larger is not one


def load_preset(path: str | Path) -> dict:
    """The preset's settings, by convert() keyword; every problem names the file and the key."""
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
        want = KEYS.get(key)
        if want is None:
            problems.append(f"--config {path}: unknown key {key!r}; expected some of {', '.join(KEYS)}")
        elif type(value) is not want or (want is dict and not all(isinstance(v, str) for v in value.values())):
            problems.append(f"--config {path}: {key} is {value!r}; expected a {want.__name__}"
                            + (" of strings (--param KEY=VALUE)" if want is dict else ""))
    if problems:
        raise UsageError("; ".join(problems), problems)
    return data
