"""Every `flashinfer.moe_ep` megakernel target, driven by its row of the kernel table.

Each kernel's weights are produced by FlashInfer itself, on the path `MegaConfig(preprocess_weights=True)`
takes at load time: the registry builds the kernel backend from its config, and
`backend.preprocess_weights(MoEWeightPack, FleetParams)` returns the transformed weights. This module
only builds the pack (the FP4 checkpoint verbatim, or its exact BF16 dequant) and stores the result
faithfully (numerics.structure). Output shapes are asked of FlashInfer by preprocessing one and two
all-zero experts (every leaf dimension is linear in the expert count). A leaf of the same shape for one and two
experts (SM90 FP8's per-tensor activation scales) is expert-invariant: where units are chunks of a rank's experts,
the rank's first chunk writes it and every other chunk must give the same bytes."""

from __future__ import annotations

import dataclasses
import functools
import threading

import torch

from ..budget import UNIT_BYTES_MAX
from ..checkpoint import EXPERT_LEGS, ModelSpec, expert_name
from ..dtypes import st_dtype, tensor_nbytes
from ..numerics import dequant_fp4_to_bf16, dequant_fp8_block_to_bf16
from ..numerics.structure import flatten
from ..plan import OutTensor, Unit
from ..records import Block, RankLayer, read_node
from .base import Target, check_scales, kernel_target_config, prefix
from .families import kernel_config

PROBE_TOKENS = 128  # FleetParams.max_tokens_per_rank for preprocessing; the layouts do not depend on it
LEG_NAMES = ("fc1", "fc2")
PROBE_PREFIX = "PROBE"


def _moe_ep():
    import flashinfer.moe_ep as me

    return me


class MoeEpTarget(Target):
    """A `flashinfer.moe_ep` megakernel: one unit per MoE block and EP rank."""

    def __init__(self, *args):
        super().__init__(*args)
        self._probes: dict[int, tuple[dict, dict]] = {}
        self._invariant: dict[str, torch.Tensor] = {}  # leaf name -> the bytes the first chunk to run gave
        self._lock = threading.Lock()  # lanes run units on threads of their own

    # FlashInfer calls ------------------------------------------------------------------------------

    def kernel_config(self, model: ModelSpec):
        cls = getattr(_moe_ep(), self.kernel.config_class)
        return kernel_config(cls, (model.moe_intermediate_size, model.num_experts_per_tok), self.opts.params)

    def preprocess(self, model: ModelSpec, pack_tensors: tuple, n_experts: int):
        me = _moe_ep()
        from flashinfer.moe_ep.core.kernel import registry

        backend = registry.create_mega_kernel(self.kernel_config(model))
        backend.bind_ep_bootstrap(me.BootstrapConfig(world_size=1, rank=0))
        fleet = me.FleetParams(num_experts=n_experts, max_tokens_per_rank=PROBE_TOKENS,
                               token_hidden_size=model.hidden_size)
        return backend.preprocess_weights(me.MoEWeightPack(*pack_tensors), fleet)

    def build_pack(self, w1, w3, w2, s1, s3, s2, model: ModelSpec) -> tuple:
        """MoEWeightPack tensors from stacked per-expert tensors [E, out, in/2] (+ scales)."""
        device = self.opts.device
        if self.kernel.pack_format == "bf16":
            if model.expert_dtype == "fp8":
                deq = functools.partial(dequant_fp8_block_to_bf16, block=model.weight_block_size)
                w13 = torch.cat([torch.stack([deq(a, b) for a, b in zip(w1, s1)]),
                                 torch.stack([deq(a, b) for a, b in zip(w3, s3)])], dim=1)
                return w13.to(device), torch.stack([deq(a, b) for a, b in zip(w2, s2)]).to(device)
            w1, w3, w2, s1, s3, s2 = (t.to(device) for t in (w1, w3, w2, s1, s3, s2))
            w13 = torch.cat([dequant_fp4_to_bf16(w1, s1), dequant_fp4_to_bf16(w3, s3)], dim=1)  # gate rows, then up
            return w13, dequant_fp4_to_bf16(w2, s2)
        sdtype = torch.float8_e8m0fnu if self.kernel.pack_format == "fp4_e8m0" else torch.uint8
        w13 = torch.cat([w1, w3], dim=1).view(torch.uint8)
        s13 = torch.cat([s1, s3], dim=1).view(torch.uint8).view(sdtype)
        return tuple(t.contiguous().to(device)
                     for t in (w13, w2.view(torch.uint8), s13, s2.view(torch.uint8).view(sdtype)))

    # Planning ---------------------------------------------------------------------------------------

    def _probe(self, n: int) -> tuple[dict, dict]:
        """(structure, {leaf: [dtype, stored shape]}) of FlashInfer's output for `n` all-zero experts."""
        if n not in self._probes:
            h, i = self.model.hidden_size, self.model.moe_intermediate_size
            z = functools.partial(torch.zeros, dtype=torch.uint8)
            zs = functools.partial(torch.full, fill_value=127, dtype=torch.uint8)
            spec = dataclasses.replace(self.model, expert_dtype="fp4")
            pack = self.build_pack(z(n, i, h // 2), z(n, i, h // 2), z(n, h, i // 2), zs((n, i, h // 32)),
                                   zs((n, i, h // 32)), zs((n, h, i // 32)), spec)
            structure, tensors = flatten(self.preprocess(spec, pack, n), PROBE_PREFIX, LEG_NAMES)
            self._probes[n] = structure, {k: [st_dtype(t.dtype), list(t.shape)] for k, t in tensors.items()}
        return self._probes[n]

    def planned(self, n: int, prefix: str) -> tuple[dict, dict]:
        """Structure and stored leaf shapes for `n` experts under `prefix`: every integer of the probes
        at one and two experts extended linearly (layouts are per expert); `run` checks the real output."""
        structure, leaves = _extrapolate(self._probe(1), self._probe(2), n)
        rename = lambda name: prefix + name.removeprefix(PROBE_PREFIX)  # noqa: E731
        return _renamed(structure, rename), {rename(k): (d, tuple(sh)) for k, (d, sh) in leaves.items()}

    def chunks(self) -> bool:
        """Whether units may be chunks of a rank's experts (the kernel table says; tests check it)."""
        return self.kernel.expert_chunks

    def invariant_leaves(self, prefix: str) -> set[str]:
        """Leaves under `prefix` whose shape does not grow with the experts (same for one and two)."""
        one, two = self._probe(1)[1], self._probe(2)[1]
        return {prefix + k.removeprefix(PROBE_PREFIX) for k in one if one[k] == two[k]}

    def units(self) -> list[Unit]:
        """One unit per MoE block and EP rank, or, where the layout allows it, per chunk of the rank's experts of
        about `opts.unit_bytes` of output (its rows of every tensor of the rank)."""
        units = []
        per_expert = sum(tensor_nbytes(d, s) for d, s in self.planned(1, "x")[1].values())
        for block in self.model.moe_blocks:
            for rank, (lo, hi) in enumerate(self.ranks()):
                pre = prefix(block, rank)
                step = max(1, (self.opts.unit_bytes or UNIT_BYTES_MAX) // per_expert) if self.chunks() else hi - lo
                once = self.invariant_leaves(pre)
                for a in range(lo, hi, step):
                    b = min(hi, a + step)
                    key = pre if (a, b) == (lo, hi) else f"{pre}.{a}-{b}"
                    outs = tuple(OutTensor(k, d, s, key, rank) for k, (d, s) in self.planned(b - a, pre)[1].items()
                                 if a == lo or k not in once)  # an invariant leaf: written by the first chunk
                    ins = tuple(expert_name(block, j, leg, kind) for j in range(a, b)
                                for leg in EXPERT_LEGS for kind in ("weight", "scale"))
                    units.append(Unit(key, block, rank, (a, b), ins, outs))
        return units

    # Conversion -------------------------------------------------------------------------------------

    def run(self, unit: Unit, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        check_scales(inputs)
        lo, hi = unit.experts

        def stack(leg, kind):  # on the device: pinned inputs copy without waiting, and the stack is a device copy
            return torch.stack([inputs[expert_name(unit.block, j, leg, kind)].to(self.opts.device, non_blocking=True)
                                for j in range(lo, hi)])

        pack = self.build_pack(stack("w1", "weight"), stack("w3", "weight"), stack("w2", "weight"),
                               stack("w1", "scale"), stack("w3", "scale"), stack("w2", "scale"), self.model)
        pre = prefix(unit.block, unit.rank)
        structure, tensors = flatten(self.preprocess(self.model, pack, hi - lo), pre, LEG_NAMES)
        want, _ = self.planned(hi - lo, pre)
        if structure != want:
            raise AssertionError(f"{unit.key}: FlashInfer's output structure differs from the planned one")
        once = self.invariant_leaves(pre)
        if unit.key != pre:  # a chunk: its invariant leaves must be those of every other chunk of the rank
            for name in sorted(tensors.keys() & once):
                self._same_in_every_chunk(unit, name, tensors[name])
        out = {}
        for t in unit.outputs:
            v = tensors.pop(t.name, None)
            if v is None or tuple(v.shape) != t.shape or st_dtype(v.dtype) != t.dtype:
                got = None if v is None else (st_dtype(v.dtype), tuple(v.shape))
                raise AssertionError(f"{t.name}: FlashInfer returned {got}, planned {(t.dtype, t.shape)}")
            out[t.name] = self.output(v)
        for name in tensors.keys() & once:  # checked above, written by the first chunk
            del tensors[name]
        if tensors:
            raise AssertionError(f"{unit.key}: FlashInfer returned unplanned tensors {sorted(tensors)}")
        return out

    def _same_in_every_chunk(self, unit: Unit, name: str, value: torch.Tensor) -> None:
        """An invariant leaf must have the same bytes in every chunk of a rank (the first writes it); otherwise
        the layout does not split by expert, and the kernel table must say so."""
        got = value.detach().cpu().contiguous().view(torch.uint8).reshape(-1)
        with self._lock:
            first = self._invariant.setdefault(name, got)
        if not torch.equal(first, got):
            raise AssertionError(f"{unit.key}: {name} differs between chunks of the rank's experts; "
                                 f"{self.kernel.name} does not split by expert: set expert_chunks=False in its row "
                                 "of the kernel table")

    def layers_record(self, units: list[Unit]) -> dict[str, Block]:
        rec: dict[str, dict] = {}
        for block in self.model.moe_blocks:
            for rank, (lo, hi) in enumerate(self.ranks()):
                structure, _ = self.planned(hi - lo, prefix(block, rank))  # flatten's JSON, as the manifest holds it
                rec.setdefault(block, {})[str(rank)] = RankLayer(experts=(lo, hi), structure=read_node(structure))
        return rec

    def update_config(self, config: dict) -> dict:
        return kernel_target_config(self, config)


def _extrapolate(one, two, n: int):
    """Walk two JSON-like probes of equal shape; ints that differ are extended linearly to `n`."""
    if isinstance(one, dict):
        return {k: _extrapolate(one[k], two[k], n) for k in one}
    if isinstance(one, (list, tuple)):
        return type(one)(_extrapolate(a, b, n) for a, b in zip(one, two))
    if type(one) is int and type(two) is int:
        return one + (two - one) * (n - 1)
    return one


def _renamed(node, rename):
    if isinstance(node, dict):
        return {k: (rename(v) if k == "tensor" else _renamed(v, rename)) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v, rename) for v in node]
    return node
