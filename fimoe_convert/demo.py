"""The embedded default job: make a tiny real-format V4 checkpoint, convert it to BF16 and to a
FlashInfer megakernel layout, verify both, and summarize."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .console import plural
from .conversion import convert
from .errors import UsageError
from .records import DEMO_WORKDIR
from .sizes import human
from .testing import folder_bytes, fresh_folder, make_checkpoint
from .testing.fixtures import work_folder_problem
from .verification import verify

DEMO_TARGETS = ("bf16", "megamoe_sm90_mxfp4")


def run_demo(workdir: str | Path = DEMO_WORKDIR, log: Callable[[str], None] | None = None) -> dict:
    """Returns a summary dict; `log` gets one line per step."""
    say = log or (lambda _s: None)
    problem = work_folder_problem(Path(workdir), {"src", *(f"out-{t}" for t in DEMO_TARGETS)})
    if problem:
        raise UsageError(f"--workdir {problem}")
    work = fresh_folder(workdir)
    t0 = time.perf_counter()
    # Expert scales within the MXFP4 window of the megamoe kernel, so both targets convert losslessly.
    src = make_checkpoint(work / "src", "tiny", extreme_scales=False)
    say(f"made tiny DeepSeek V4 checkpoint {src} ({human(folder_bytes(src))})")
    rows = []
    for target in DEMO_TARGETS:
        out = work / f"out-{target}"
        res = convert(str(src), str(out), target, ep_size=2 if target != "bf16" else 1)
        ver = verify(str(out), deep=True, src=str(src))
        status = "ok" if not ver.problems else "FAILED: " + ver.problems[0]
        say(f"converted to {target}: {plural(res.shards, 'shard')}, {human(res.bytes_written)} in {res.seconds:.2f} s; "
            f"verify --deep: {status} ({plural(ver.files, 'file')}, {plural(ver.deep_checked, 'unit')} re-derived)")
        rows.append({"target": target, "out": str(out), "shards": res.shards, "bytes": res.bytes_written,
                     "seconds": round(res.seconds, 3), "verify": status})
    ok = all(r["verify"] == "ok" for r in rows)
    summary = (f"demo {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s: "
               + "; ".join(f"{r['target']} -> {r['out']} ({r['verify']})" for r in rows))
    return {"ok": ok, "targets": rows, "summary": summary}
