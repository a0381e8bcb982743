"""Run the Dockerfile's conversion step here, without a container builder: both ways it reads MODEL (streamed
from a local Hub, and from a Hugging Face cache offline) on the tiny fixture, then compare the two outputs byte
for byte. The step's shell text is taken from the Dockerfile as it is; its absolute paths (/hf-cache, /layer,
/tmp/hf-small-files) are moved under a work folder.

usage: PYTHONPATH=. python3 scripts/prebake/convert_step.py [WORK]   (fimoe-convert on PATH)"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL, COMMIT = "fimoe-fixtures/DeepSeek-V4-Tiny", "c0ffee" * 6 + "c0ff"


def conversion_step() -> str:
    """The shell of the RUN that converts (continuation lines joined, its --mount flag dropped)."""
    text = (REPO / "scripts" / "prebake" / "Dockerfile").read_text()
    m = re.search(r"^RUN --mount=type=bind,from=hf-cache,target=/hf-cache ((?:.*\\\n)*.*)$", text, re.M)
    return re.sub(r"\\\n", " ", m.group(1))


def main() -> None:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fimoe-convert-step").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sys.path.insert(0, str(REPO))
    from fimoe_convert.testing import make_checkpoint, seed_hub_cache

    seed_hub_cache(make_checkpoint(work / "ckpt", "tiny"), work / "hf-cache", MODEL, COMMIT)
    hub = subprocess.Popen([sys.executable, str(REPO / "scripts" / "bench" / "bench_stream.py"), "--serve",
                            str(work / "ckpt"), "--repo", MODEL, "--commit", COMMIT, "--rate", "1GB"],
                           stdout=subprocess.PIPE, text=True)
    url = hub.stdout.readline().strip()
    print(f"local Hub {url} serves {MODEL}@{COMMIT}")
    digests = {}
    try:
        for way, cache in (("streamed", work / "no-cache"), ("from the cache", work / "hf-cache")):
            cache.mkdir(exist_ok=True)
            layer = work / f"layer-{way.split()[-1]}"
            step = (conversion_step().replace("/hf-cache", str(cache)).replace("/layer", str(layer))
                    .replace("/tmp/hf-small-files", str(work / "small-files")))
            env = {**os.environ, "MODEL": MODEL, "REVISION": COMMIT, "TARGET": "bf16", "PARAMS": "", "EP_SIZE": "1",
                   "ARCH": "", "DEVICE": "cpu", "ENGINE": "none",
                   "CONVERT_ARGS": "-q", "HF_ENDPOINT": url if way == "streamed" else ""}
            r = subprocess.run(["bash", "-c", step], env=env, capture_output=True, text=True)
            print(f"-- {way}: exit {r.returncode}\n{r.stdout.strip()}")
            if r.returncode:
                sys.exit(f"error: the conversion step ({way}) failed: {r.stderr[-2000:]}")
            out = layer / "models" / "out"
            digests[way] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}
            for name, digest in digests[way].items():
                print(f"   {digest[:16]}  {name}")
            print(f"   small-files cache left behind: {(work / 'small-files').exists()}")
    finally:
        hub.terminate()
    same = digests["streamed"] == digests["from the cache"]
    print(f"outputs byte-identical: {same} ({len(digests['streamed'])} files)")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
