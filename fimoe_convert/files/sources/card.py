"""What SRC's own model card (README.md) says that a derived model's card carries on: its license."""

from __future__ import annotations

from pathlib import Path

CARD_MAX_BYTES = 1 * 2**20  # a model card is kilobytes; a larger README.md is read no further (no license taken)
LICENSE_KEYS = ("license", "license_name", "license_link")


def source_license(root: Path, extra_files: list[str]) -> dict[str, str]:
    """{license, license_name, license_link} as SRC's README.md header gives them (plain strings only); {} when it
    has no card, no header, or one that does not parse."""
    if "README.md" not in extra_files:
        return {}
    path = Path(root) / "README.md"
    try:
        with open(path, "rb") as f:
            text = f.read(CARD_MAX_BYTES + 1)
    except OSError:
        return {}
    if len(text) > CARD_MAX_BYTES:
        return {}
    from huggingface_hub import ModelCard

    try:
        data = ModelCard(text.decode("utf-8", "replace"), ignore_metadata_errors=True).data.to_dict()
    except Exception:  # a header that is no YAML mapping: the card says nothing we can carry on
        return {}
    return {k: data[k] for k in LICENSE_KEYS if isinstance(data.get(k), str) and 0 < len(data[k]) <= 200}
