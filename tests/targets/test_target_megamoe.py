"""megamoe_sm90_mxfp4: output loaded through the runtime loader is bit-identical to calling
FlashInfer's transform directly on inputs prepared by an independent reference."""

import json

import pytest
import torch
from reference import seed_dequant
from safetensors import safe_open

from fimoe_convert import convert, verify
from fimoe_convert.errors import ValidationError
from fimoe_convert.runtime import load_megamoe_weights
from fimoe_convert.testing import make_checkpoint

flashinfer_megamoe = pytest.importorskip("flashinfer.megamoe")

TARGET = "megamoe_sm90_mxfp4"


def ref_marlin(packed: torch.Tensor) -> torch.Tensor:
    """Reference Marlin order, element by element: byte j of each 4-byte word = K[j] << 4 | K[j+4]."""
    b = packed.view(torch.uint8)
    k = torch.empty(*b.shape[:-1], b.shape[-1] * 2, dtype=torch.uint8)
    k[..., 0::2], k[..., 1::2] = b & 0xF, b >> 4  # linear: K[2i] low nibble
    out = torch.empty_like(b)
    for word in range(b.shape[-1] // 4):
        for j in range(4):
            out[..., 4 * word + j] = (k[..., 8 * word + j] << 4) | k[..., 8 * word + j + 4]
    return out


def ref_shift(packed: torch.Tensor, scales: torch.Tensor) -> int:
    """The per-expert exponent the target must choose: 0 when the nonzero groups already sit in
    [122, 133], else the smallest move that puts them there."""
    b = packed.view(torch.uint8)
    nz = (((b & 7) != 0) | ((b & 0x70) != 0)).reshape(*b.shape[:-1], -1, 16).any(-1)
    s = scales.view(torch.uint8).int()[nz]
    lo, hi = int(s.min()), int(s.max())
    if lo >= 122 and hi <= 133:
        return 0
    return hi - 133 if hi > 133 else lo - 122


def read(folder, names):
    idx = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for n in names:
        with safe_open(str(folder / idx[n]), "pt") as f:
            out[n] = f.get_tensor(n)
    return out


@pytest.fixture(scope="module")
def megamoe_out(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("mm") / "out"
    convert(str(tiny_ckpt), str(out), TARGET, ep_size=2)
    return out


@pytest.mark.parametrize("block", ["layers.0", "layers.2", "mtp.0"])
@pytest.mark.parametrize("rank", [0, 1])
def test_loaded_weights_equal_flashinfer_transform(tiny_ckpt, megamoe_out, block, rank):
    experts = range(4 * rank, 4 * rank + 4)
    names = [f"{block}.ffn.experts.{j}.{leg}.{kind}" for j in experts for leg in ("w1", "w2", "w3")
             for kind in ("weight", "scale")]
    src = read(tiny_ckpt, names)
    l1p, l1s, l2p, l2s, g1, g2 = [], [], [], [], [], []
    for j in experts:
        e = f"{block}.ffn.experts.{j}"
        p1 = torch.cat([src[f"{e}.w1.weight"], src[f"{e}.w3.weight"]]).view(torch.uint8)
        s1 = torch.cat([src[f"{e}.w1.scale"], src[f"{e}.w3.scale"]]).view(torch.uint8)
        p2, s2 = src[f"{e}.w2.weight"].view(torch.uint8), src[f"{e}.w2.scale"].view(torch.uint8)
        a, b = ref_shift(p1, s1), ref_shift(p2, s2)
        l1p.append(ref_marlin(p1))
        l1s.append((s1.int() - a).clamp(122, 133).to(torch.uint8))
        l2p.append(ref_marlin(p2))
        l2s.append((s2.int() - b).clamp(122, 133).to(torch.uint8))
        g1.append(2.0 ** a)
        g2.append(2.0 ** b)
    want_l1, want_l2 = flashinfer_megamoe.transform_mxfp4_weights_for_mega_moe(
        (torch.stack(l1p), torch.stack(l1s)), (torch.stack(l2p), torch.stack(l2s)))
    l1, l2, gs1, gs2 = load_megamoe_weights(megamoe_out, block, rank)
    assert l1.dtype == want_l1.dtype and l1.shape == want_l1.shape and torch.equal(l1, want_l1)
    assert l2.dtype == want_l2.dtype and l2.shape == want_l2.shape and torch.equal(l2, want_l2)
    assert torch.equal(gs1, torch.tensor(g1)) and torch.equal(gs2, torch.tensor(g2))
    if block == "layers.0" and rank == 0:  # extreme experts: scale bytes 1..9 and 246..254 need global scales
        assert gs1[0] == 2.0 ** -121 and gs1[1] == 2.0 ** 121


def folder_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def megamoe_small_shards(tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("mm-shards") / "out"
    convert(str(tiny_ckpt), str(out), TARGET, ep_size=2, shard_size="100KB", writers=1)
    return out


# Per expert, l1 is 69632 bytes of tiles + 4 of global scale, l2 34816 + 4; a rank holds 4 experts.
@pytest.mark.parametrize("max_memory, writers, l1_chunks, l2_chunks", [
    pytest.param("4MiB", 1, 4, 2, marks=pytest.mark.slow),  # units of 128 KiB: l1 one expert per unit, l2 three (3 + 1)
    ("6MiB", 3, 2, 1),  # 192 KiB: l1 two experts, l2 all four
    pytest.param("8GiB", 2, 1, 1, marks=pytest.mark.slow),  # 64 MiB: one unit per leg
])
def test_expert_chunks_give_the_bytes_of_whole_ranks(tiny_ckpt, megamoe_out, megamoe_small_shards, tmp_path,
                                                     max_memory, writers, l1_chunks, l2_chunks):
    """--max-memory sizes the units (chunks of one leg's experts, FlashInfer's transform per leg): any
    chunking and any number of writers give the folder of one unit per rank."""
    from fimoe_convert.files.sources.local import open_source
    from fimoe_convert.targets import TargetOptions, get_kernel, make_target

    unit_bytes = min(64 << 20, int(max_memory[:-3]) << {"MiB": 20, "GiB": 30}[max_memory[-3:]] >> 5)
    units = make_target(
        get_kernel(TARGET), open_source(str(tiny_ckpt)).model, TargetOptions(ep_size=2, unit_bytes=unit_bytes)
    ).units()
    per_rank = {leg: sum(1 for u in units if u.block == "layers.0" and u.rank == 0 and u.leg == leg)
                for leg in ("l1", "l2")}
    assert per_rank == {"l1": l1_chunks, "l2": l2_chunks}
    out = tmp_path / "out"
    convert(str(tiny_ckpt), str(out), TARGET, ep_size=2, max_memory=max_memory, writers=writers, shard_size="100KB")
    assert folder_bytes(out) == folder_bytes(megamoe_small_shards)
    for rank in (0, 1):
        for block in ("layers.0", "mtp.0"):
            for got, want in zip(
                load_megamoe_weights(out, block, rank), load_megamoe_weights(megamoe_out, block, rank)
            ):
                assert got.dtype == want.dtype and torch.equal(got, want)
    assert verify(str(out), deep=True, samples=100, src=str(tiny_ckpt)).problems == []


def test_leg_transform_matches_flashinfer_public_function_with_and_without_the_helper(monkeypatch):
    """`transform_leg` gives, per leg, the bytes of `transform_mxfp4_weights_for_mega_moe` on both legs; without
    FlashInfer's per-leg helper it falls back to the public function with a zero partner leg."""
    from fimoe_convert.targets import megamoe as mm

    g = torch.Generator().manual_seed(5)
    e, h, i = 3, 256, 128
    l1 = (torch.randint(0, 256, (e, 2 * i, h // 2), generator=g, dtype=torch.uint8),
          torch.randint(122, 134, (e, 2 * i, h // 32), generator=g, dtype=torch.uint8))
    l2 = (torch.randint(0, 256, (e, h, i // 2), generator=g, dtype=torch.uint8),
          torch.randint(122, 134, (e, h, i // 32), generator=g, dtype=torch.uint8))
    want = flashinfer_megamoe.transform_mxfp4_weights_for_mega_moe(l1, l2)
    assert mm._leg_transform() is not None  # FlashInfer 0.7.4 has it
    for helper in (True, False):
        if not helper:
            monkeypatch.setattr(mm, "_leg_transform", lambda: None)
        for leg, (p, s), w in (("l1", l1, want[0]), ("l2", l2, want[1])):
            got = mm.transform_leg(leg, p, s)
            assert got.dtype == w.dtype and got.shape == w.shape and torch.equal(got, w), (leg, helper)


def test_repack_is_exact_in_values(tiny_ckpt, megamoe_out):
    """Dequantizing the windowed inputs times the global scale gives the seed dequant of the source."""
    from fimoe_convert.numerics.mxfp4 import linear_to_marlin, marlin_to_linear, window_scales
    src = read(tiny_ckpt, ["layers.1.ffn.experts.2.w2.weight", "layers.1.ffn.experts.2.w2.scale"])
    p, s = src["layers.1.ffn.experts.2.w2.weight"][None], src["layers.1.ffn.experts.2.w2.scale"][None]
    newp, news, g, rep, bad = window_scales(p, s, allow_lossy=False)
    assert not bad and rep.clamped_groups == 0
    assert torch.equal(marlin_to_linear(linear_to_marlin(newp)), newp.view(torch.uint8))
    got = seed_dequant(newp, news).float() * torch.exp2(g.float()).view(-1, 1, 1)
    assert torch.equal(got, seed_dequant(p, s).float())


def test_manifest_ranges_and_verify(megamoe_out, tiny_ckpt):
    m = json.loads((megamoe_out / "fimoe-manifest.json").read_text())
    assert m["ep"] == {"world_size": 2, "expert_ranges": [[0, 4], [4, 8]]}
    assert m["target"]["kernel_name"] == TARGET and m["target"]["capabilities"] == ["9.0"]
    assert set(m["layers"]) == {"layers.0", "layers.1", "layers.2", "mtp.0"}
    assert verify(str(megamoe_out), deep=True, src=str(tiny_ckpt)).problems == []
    idx = json.loads((megamoe_out / "model.safetensors.index.json").read_text())["weight_map"]
    r0 = {s for n, s in idx.items() if ".ep0." in n}
    r1 = {s for n, s in idx.items() if ".ep1." in n}
    assert r0 and r1 and not r0 & r1


def test_wide_scale_span_is_refused_then_reported_with_allow_lossy(tmp_path):
    src = make_checkpoint(tmp_path / "src", "tiny", layers=1, mtp=0, hash_layers=0)
    shard_of = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    name = "layers.0.ffn.experts.3.w2.scale"
    from fimoe_convert.files.safetensors.header import read_header
    info = read_header(src / shard_of[name]).tensors[name]
    data = bytearray((src / shard_of[name]).read_bytes())
    data[info.start] = 100  # one group 20 steps below the rest: the window cannot hold both
    (src / shard_of[name]).write_bytes(bytes(data))
    with pytest.raises(Exception, match=r"layers\.0 experts 3 \(down\): scale bytes span more than the 12 exponents"):
        convert(str(src), str(tmp_path / "a"), TARGET)
    res = convert(str(src), str(tmp_path / "b"), TARGET, allow_lossy=True)
    rep = res.report.mxfp4_window
    assert rep.lossy_experts == 1 and rep.clamped_groups == 1 and 0 < rep.worst_rel_l2 < 0.1


@pytest.mark.parametrize("overrides, opts, match", [
    ({"hidden": 128, "inter": 128}, {}, r"hidden_size 128 must be a multiple of 256"),
    ({"inter": 96}, {}, r"moe_intermediate_size 96 must be a multiple of 128"),
    ({}, {"ep_size": 8, "arch": "10.0"}, r"--arch 10\.0: --target megamoe_sm90_mxfp4 runs on compute capability 9\.0"),
    ({"experts": 12}, {"ep_size": 3}, r"--ep-size 3: megamoe_sm90_mxfp4 runs on a power-of-two number of ranks"),
    ({"expert_dtype": "fp8"}, {},
     r"--target megamoe_sm90_mxfp4: consumes FP4 experts, but this checkpoint's experts are FP8"),
])
def test_validation_before_reading(tmp_path, overrides, opts, match):
    src = make_checkpoint(tmp_path / "src", "tiny", layers=1, mtp=0, hash_layers=0, **overrides)
    with pytest.raises(ValidationError, match=match):
        convert(str(src), str(tmp_path / "out"), TARGET, **opts)
    assert not (tmp_path / "out").exists()
