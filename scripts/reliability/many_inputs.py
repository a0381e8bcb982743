#!/usr/bin/env python3
"""Seconds and manifest writes of a conversion of the tiny fixture plus N small extra files (each an input that is
hashed and recorded in the manifest):

    python3 scripts/reliability/many_inputs.py N WORKDIR
"""

import shutil
import sys
import time
from pathlib import Path
from unittest import mock

import fimoe_convert
import fimoe_convert.conversion as conv
from fimoe_convert import convert
from fimoe_convert.files.output import manifest as mf
from fimoe_convert.testing import make_checkpoint

n, base = int(sys.argv[1]), Path(sys.argv[2])
src = base / f"src{n}"
if not src.exists():
    make_checkpoint(src, "tiny")
    for i in range(n):
        (src / f"extra_{i:05d}.txt").write_text(f"file {i}\n")
out = base / f"out{n}"
shutil.rmtree(out, ignore_errors=True)
writes = []
real = mf.write_manifest


def counting(*a, **k):
    writes.append(1)
    return real(*a, **k)


with mock.patch.object(mf, "write_manifest", counting), mock.patch.object(conv, "write_manifest", counting):
    t0 = time.perf_counter()
    convert(str(src), str(out), "bf16")
    secs = time.perf_counter() - t0
inputs = len(mf.read_manifest(out).source.files)
print(f"package {Path(fimoe_convert.__file__).parent}: {n} extra files, {inputs} inputs: {secs:.1f} s, "
      f"{len(writes)} manifest writes")
