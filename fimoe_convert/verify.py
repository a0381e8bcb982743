"""`verify OUT [--deep]`: every file against the manifest; with `deep`, a sample of units re-derived from the
source and compared bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from .files.output import read_manifest, read_output_tensors, verify_files
from .files.source import open_source
from .options import parse_arch
from .plan import piece_rows
from .targets import TargetOptions, make_target


def verify(out: str, deep: bool = False, samples: int = 8, src: str | None = None) -> dict:
    """Re-hash every output file against the manifest and check index, manifest and headers agree.
    With `deep`, re-derive `samples` converted units from the source and compare them bit for bit."""
    out_dir = Path(out)
    manifest = read_manifest(out_dir)
    res = verify_files(out_dir, manifest)
    report = {"files": res.files, "bytes": res.bytes, "problems": res.problems, "deep_checked": 0}
    if res.problems or not deep:
        return report
    source = open_source(src or manifest["source"]["spec"], revision=manifest["source"]["revision"], offline=True)
    o = manifest["options"]
    opts = TargetOptions(ep_size=o["ep_size"], arch=parse_arch(o["arch"]), device="cpu",
                         allow_lossy=o["allow_lossy"], params=o["params"])
    tgt = make_target(manifest["target"]["name"], source.model, opts)
    units = tgt.all_units(source.non_expert_tensors())
    rows = piece_rows(units)  # a unit may write only some rows of a tensor
    step = max(1, len(units) // samples)
    for unit in units[::step][:samples]:
        want = tgt.run(unit, {n: source.read(n) for n in unit.inputs})
        got = read_output_tensors(out_dir, list(want))
        for name, w in want.items():
            lo, hi = rows[(unit.key, name)]
            g = got[name] if (lo, hi) == (0, got[name].shape[0]) else got[name][lo:hi]
            if g.shape != w.shape or not torch.equal(g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)):
                report["problems"].append(f"{out_dir}: tensor {name!r} differs from a fresh conversion of the source; "
                                          "the output is damaged, convert again with --overwrite")
        report["deep_checked"] += 1
        if report["problems"]:
            break
    return report
