"""The file names SRC and OUT share: Hugging Face's, and the tool's own in OUT (never read from SRC nor copied)."""

from __future__ import annotations

import fnmatch

from ..records import MANIFEST_NAME

INDEX_NAME = "model.safetensors.index.json"  # Hugging Face's name for a sharded checkpoint's index
SINGLE_NAME = "model.safetensors"  # an unsharded checkpoint's one file
LOCK_NAME = ".fimoe-lock"
TMP_SUFFIX = ".fimoe-tmp"
RANK_STATUS = "fimoe-status.rank{rank}.json"


def is_tool_name(name: str) -> bool:
    """A file name this tool writes into OUT for its own bookkeeping (never copied from SRC)."""
    return (name in (MANIFEST_NAME, LOCK_NAME) or name.endswith(TMP_SUFFIX)
            or fnmatch.fnmatchcase(name, RANK_STATUS.format(rank="*")))
