"""Print one pip requirement per NAME, with the version specifier the installed DIST itself declares for it (its
Requires-Dist, markers evaluated for this machine, extras dropped); a NAME the DIST does not declare is printed bare.
Usage: python _pins.py DIST NAME ...   (run inside the venv where DIST is installed)"""
import importlib.metadata as md
import re
import sys

from pip._vendor.packaging.requirements import Requirement  # pip's own copy: the venv needs nothing else


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(dist: str, names: list[str]) -> list[str]:
    declared = {}
    for line in md.requires(dist) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            declared[norm(req.name)] = f"{req.name}{req.specifier}"
    return [declared.get(norm(n), n) for n in names]


if __name__ == "__main__":
    print("\n".join(pins(sys.argv[1], sys.argv[2:])))
