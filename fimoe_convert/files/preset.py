"""Conversion presets (`--config NAME|FILE`): TOML files whose keys are `convert()`'s keyword arguments; `model` is
the DeepSeek V4 variant the preset is made for. The recommended ones are the top-level configs/ folder, which the
wheel ships as the package data `fimoe_convert.configs`; `--config NAME` picks one by its file name."""

from __future__ import annotations

import difflib
import importlib.resources
import tomllib
from pathlib import Path

from ..errors import UsageError
from .safe_open import open_regular

# Every key but `model` is a keyword argument of convert() and a flag of `convert`, whose own type converts it
# (the CLI puts the values into click's default_map); `params` (--param KEY=VALUE) is a table of strings.
KEYS = ("model", "target", "revision", "ep_size", "device", "arch", "max_memory", "shard_size", "allow_lossy",
        "params", "writers")
MAX_BYTES = 64 * 1024  # a preset is a few lines; anything larger is not one


def _presets_dir() -> Path:
    """The shipped presets: the package data `fimoe_convert.configs` of an installed wheel, else configs/ of the source
    tree this package is imported from (run in place, or installed with `pip install -e .`)."""
    installed = importlib.resources.files("fimoe_convert") / "configs"  # a Path: the package is a folder on disk
    tree = Path(__file__).resolve().parents[2]  # fimoe_convert/files/preset.py -> the tree's root
    if not installed.is_dir() and (tree / "pyproject.toml").is_file():
        return tree / "configs"
    return Path(str(installed))


PRESETS_DIR = _presets_dir()
REPO_DIR = "configs"  # the presets' folder in the repository: configs/NAME.toml names a preset from anywhere


def preset_names() -> list[str]:
    """The names of the presets shipped with the package (--config NAME)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def close_names(word: str, names: list[str]) -> list[str]:
    """Names that `word` may have meant: a prefix or part of one (difflib's ratio misses those), else similar."""
    w = word.lower().replace("-", "_")
    part = [n for n in names if w and (n.lower().startswith(w) or w in n.lower())]
    return part[:3] or difflib.get_close_matches(w, names, n=3, cutoff=0.6)


def preset_path(config: str | Path) -> Path:
    """--config's file: an existing path, else a shipped preset by name (a path to NAME.toml that does not exist, such
    as configs/NAME.toml outside a source tree, also finds it); an unknown name is a UsageError with the names it may
    have meant."""
    path = Path(config)
    if path.exists() and not path.is_dir():  # any file that exists: its reader refuses a FIFO or a device itself
        return path
    names = preset_names()
    name = path.stem if path.suffix == ".toml" else path.name
    bare = len(path.parts) == 1 or path.parent.as_posix() == REPO_DIR
    if name in names and bare:
        return PRESETS_DIR / f"{name}.toml"
    if name in names:  # a path that names a missing file is no preset name: say so, not load another file
        raise UsageError(f"--config {config}: no such file; the shipped preset of that name is --config {name}")
    close = close_names(name, names)
    raise UsageError(f"--config {config}: no such preset or file; "
                     + (f"did you mean {' or '.join(close)}? " if close else "")
                     + f"the presets are {', '.join(names)} (fimoe-convert targets lists them)")


def load_preset(path: str | Path) -> dict:
    """The preset's settings, by convert() keyword; every problem names the file and the key (the values of
    flags are converted, and their problems reported, by the CLI)."""
    path = preset_path(path)
    try:
        with open_regular(path) as f:  # a FIFO or /dev/zero: refused, and never more than MAX_BYTES + 1 read
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise UsageError(f"--config {path}: more than {MAX_BYTES} bytes, more than a preset has; "
                             "pass a preset name or file (fimoe-convert targets lists the presets)")
        data = tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--config {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"--config {path}: not valid TOML ({e})") from None
    except RecursionError:  # tables or arrays nested thousands deep: no preset is
        raise UsageError(f"--config {path}: nested deeper than Python's parser goes; a preset is a flat list of "
                         "keys (fimoe-convert targets lists the presets)") from None
    problems = []
    for key, value in data.items():
        if key not in KEYS:
            problems.append(f"--config {path}: unknown key {key!r}; expected some of {', '.join(KEYS)}")
        elif key in ("model", "params") and not (isinstance(value, str) if key == "model" else (
                isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))):
            problems.append(f"--config {path}: {key} is {_short(value)}; expected a "
                            + ("string" if key == "model" else "table of strings (--param KEY=VALUE)"))
    if problems:
        raise UsageError("; ".join(problems), problems)
    return data


def _short(value) -> str:
    """A value read from a preset, shown in at most a line (its repr may be nested thousands deep)."""
    try:
        text = repr(value)
    except RecursionError:
        return "(nested too deep to show)"
    return text if len(text) <= 80 else text[:77] + "..."
