"""--ep-size 2 and 4 shards proven on one GPU (scripts/gpu/ep_proof.py): each rank's shard runs alone with the
routes to other ranks' experts masked (-1); the ranks' outputs summed match the EP 1 output of the same source and
the FP32 reference, and two ranks' shards swapped fail (3x the error of the true layout, over the limit)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROOF = Path(__file__).parents[2] / "scripts" / "gpu" / "ep_proof.py"
pytestmark = pytest.mark.gpu

CASES = [("megamoe", "flashinfer.megamoe", []), ("moe_ep", "flashinfer.moe_ep", ["--target",
                                                                               "sm90_fp8_fp8_bf16_pull_cutedsl"])]


@pytest.mark.parametrize("kind, module, extra", CASES, ids=[c[0] for c in CASES])
def test_summed_ranks_match_ep1_and_the_reference_and_a_swap_fails(tmp_path, kind, module, extra):
    import torch

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the SM90 kernels need a Hopper GPU")
    pytest.importorskip(module)
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, str(PROOF), kind, *extra, "--ep-sizes", "1,2,4", "--work", str(tmp_path),
                        "--json", str(out)], capture_output=True, text=True, timeout=900)
    print(r.stdout[-6000:])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(out.read_text())
    rows = {(row["block"], row["ep_size"]): row for row in got["rows"]}
    assert sorted({ep for _, ep in rows}) == [1, 2, 4] and len({b for b, _ in rows}) == 2  # 1 layer + 1 MTP block
    for (block, ep), row in rows.items():
        assert row["ok"] and row["rel_l2"] < (3e-2 if kind == "megamoe" else 0.1), (block, ep, row)
        if ep > 1:
            assert row["vs_ep1"] < 1e-2 and row["swapped"] > 3 * row["rel_l2"], (block, ep, row)
