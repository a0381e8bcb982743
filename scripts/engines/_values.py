"""Every engine parameter against the file tensors it comes from (bytes, or a documented value-preserving cast),
per rank of a tensor- or expert-parallel layout; and the self-test corruptions each of which must fail the check."""
import re
from pathlib import Path

import torch


class Source:
    """Where one engine parameter comes from: rows of checkpoint names, each row concatenated along dim 0; with
    `stack`, the rows are stacked into a new leading (expert) dim. `pad_to` zero-pads dim `pad_dim` of each part
    up to a multiple (an engine's documented padding); `transform(tensor, param shape)` maps the combined file
    tensor (a documented load-time conversion: padding, dequantization)."""

    def __init__(self, rows, stack=False, pad_dim=None, pad_to=None, transform=None, extra=(), whole_first=False):
        self.rows, self.stack, self.pad_dim, self.pad_to, self.transform = rows, stack, pad_dim, pad_to, transform
        self.whole_first = whole_first  # transform each whole file tensor, then slice (a dequantization)
        self.extra = list(extra)  # file tensors the transform reads too (a dequantization's scale)

    def names(self):
        return [n for r in self.rows for n in r] + self.extra


def load_file(folder: str, corrupt=None) -> dict:
    """Every tensor of the output folder, in file order (a file-level self-test corruption applied)."""
    from safetensors import safe_open
    ck = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for n in f.keys():  # noqa: SIM118 - safe_open is no dict
                ck[n] = f.get_tensor(n)
    if corrupt is not None and corrupt.in_file:
        ck = corrupt.apply(ck)
    return ck


def _row(ck, row, src: Source, rank: int, world: int, dim):
    """One row's tensors (padded), each cut to this rank's 1/world along dim; None when dim does not divide."""
    parts = []
    for n in row:
        t = ck[n] if not src.whole_first else src.transform(ck[n], None)
        if src.pad_dim is not None and src.pad_to:
            pad = -t.shape[src.pad_dim] % src.pad_to
            if pad:
                shape = list(t.shape)
                shape[src.pad_dim] = pad
                t = torch.cat([t, t.new_zeros(shape)], dim=src.pad_dim)
        if dim is not None:
            if t.shape[dim] % world:
                return None
            t = t.chunk(world, dim=dim)[rank]
        parts.append(t)
    return parts


def expected(ck: dict, src: Source, shape, rank=0, world=1, ep_rank=0, ep_world=1):
    """(the tensor the parameter must hold, None) or (None, why). Rows are combined as `src` says; with world > 1
    the slice dim is the one at which this rank's share has the parameter's shape (each fused part sliced by
    itself, as the engines' merged column-parallel loaders do); a replicated parameter takes the whole tensor."""
    rows = src.rows
    if src.stack and ep_world > 1:  # expert parallel: this rank's contiguous block of experts
        per = len(rows) // ep_world
        rows = rows[ep_rank * per:(ep_rank + 1) * per]
    # a rank's slice first: a padding transform could otherwise make the whole tensor fit a sliced parameter
    dims = (list(range(len(shape) - (1 if src.stack else 0))) if world > 1 else []) + [None]
    first = None
    for dim in dims:
        try:
            built = [_row(ck, r, src, rank, world, dim) for r in rows]
            if any(b is None for b in built):
                continue
            dtypes = {t.dtype for b in built for t in b}
            if len(dtypes) > 1:
                return None, f"file tensors of mixed dtypes {sorted(map(str, dtypes))}"
            cat = [torch.cat(b, dim=0) for b in built]
            want = torch.stack(cat) if src.stack else cat[0]
        except RuntimeError as exc:  # parts of unequal shapes
            return None, f"file tensors do not combine: {exc}"
        if src.transform is not None and not src.whole_first:
            want = src.transform(want, shape)
        if tuple(want.shape) == tuple(shape):
            return want, None
        first = want if first is None else first
    return (first, None) if first is not None else (None, "no slice of the file tensors has the parameter's shape")


def pad_to_shape(value: float):
    """Transform: pad dim 0 up to the parameter's length with `value` (e.g. vLLM's -inf attention-sink heads)."""
    def fn(t, shape):
        if t.dim() != 1 or t.shape[0] >= shape[0]:
            return t
        return torch.cat([t, t.new_full((shape[0] - t.shape[0],), value)])
    return fn


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def compare_param(name: str, got: torch.Tensor, want: torch.Tensor, casts: dict):
    """None when equal (bytes, or a documented value-preserving cast that round-trips exactly), else why not.
    casts: {(file dtype, parameter dtype): (regex the parameter name must match, why)}."""
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} != file {tuple(want.shape)} (adapted by the engine)"
    if got.dtype != want.dtype:
        pattern, why = casts.get((want.dtype, got.dtype), (None, None))
        if why is None or not re.search(pattern, name):
            return f"dtype {got.dtype} != file {want.dtype} (cast by the engine; no documented conversion)"
        if not torch.equal(_bytes(want.to(got.dtype)), _bytes(got)) or \
                not torch.equal(_bytes(got.to(want.dtype)), _bytes(want)):
            return f"{want.dtype} -> {got.dtype} ({why}) does not hold the file's values"
        return None
    if not torch.equal(_bytes(got), _bytes(want)):
        return f"{int((_bytes(got) != _bytes(want)).sum())} of {want.numel() * want.element_size()} bytes differ"
    return None


def compare_all(model, ck: dict, check: dict, tag=""):
    """Every parameter of the model against its file source. check["source_of"](param name) -> Source, or a
    string saying why it has none ("engine-set: ..." for ones the engine fills itself, else a failure);
    check["casts"]: see compare_param. Returns (equal, failures, file names covered)."""
    equal, fails, covered, skipped = 0, [], set(), []
    for name, p in model.named_parameters():
        src = check["source_of"](name)
        if isinstance(src, str):
            (skipped if src.startswith("engine-set:") else fails).append(f"{name}: {src}")
            continue
        missing = [n for n in src.names() if n not in ck]
        if missing:
            fails.append(f"{name}: the file lacks {missing[:3]}")
            continue
        want, why = expected(ck, src, p.shape, check.get("rank", 0), check.get("world", 1),
                             check.get("ep_rank", 0), check.get("ep_world", 1))
        why = why or compare_param(name, p.data, want, check["casts"])
        names = src.names()
        if why:
            fails.append(f"{name} <- {names[:2]}{'...' if len(names) > 2 else ''}: {why}")
        else:
            equal += 1
            covered.update(names)
    print(f"values{tag}: {equal} of {equal + len(fails) + len(skipped)} parameters equal to their file tensors; "
          f"{len(fails)} differ; {len(skipped)} set by the engine itself (no file source)")
    for f in fails[:40]:
        print(f"  DIFFERS: {f}")
    for s in skipped:
        print(f"  no file source: {s}")
    return equal, fails, covered


class Corruption:
    """A change to the tensors: in_file ones are what a broken output would hold (the reference holds them too:
    caught only where the engine adapts them); the others change only what the engine is handed (an engine that
    loads wrong)."""

    def __init__(self, name, in_file, fn, doc):
        self.name, self.in_file, self.fn, self.doc = name, in_file, fn, doc

    def apply(self, ck: dict) -> dict:
        ck = dict(ck)
        self.fn(ck)
        return ck


def _first(ck, pred):
    return next(n for n in sorted(ck) if pred(n, ck[n]))


def _main(n):
    return not n.startswith("mtp.")


def _w2_half(ck):
    n = _first(ck, lambda n, t: _main(n) and ".ffn.experts." in n and n.endswith(".w2.weight"))
    ck[n] = ck[n][:, : ck[n].shape[1] // 2].contiguous()


def _fp8_as_f32(ck):
    n = _first(ck, lambda n, t: _main(n) and t.dtype == torch.float8_e4m3fn)
    ck[n] = ck[n].float()


def _bf16_as_f32(ck):
    n = _first(ck, lambda n, t: _main(n) and n.endswith("attn_norm.weight"))
    ck[n] = ck[n].float()


def _unsqueeze(ck):
    n = _first(ck, lambda n, t: _main(n) and n.endswith("ffn_norm.weight"))
    ck[n] = ck[n][None]


def _drop(ck):
    del ck[_first(ck, lambda n, t: _main(n) and n.endswith("ffn_norm.weight"))]


def _swap_w13(ck):
    a = _first(ck, lambda n, t: _main(n) and ".ffn.experts." in n and n.endswith(".w1.weight"))
    b = a.replace(".w1.", ".w3.")
    ck[a], ck[b] = ck[b], ck[a]


def _flip(prefix_ok, suffix):
    def fn(ck):
        n = _first(ck, lambda n, t: prefix_ok(n) and n.endswith(suffix))
        t = ck[n].clone()
        t.view(torch.uint8).view(-1)[0] ^= 0x01
        ck[n] = t
    return fn


CORRUPTIONS = {c.name: c for c in [
    Corruption("w2_half", True, _w2_half, "file: one routed expert's w2 cut to half width"),
    Corruption("fp8_as_f32", True, _fp8_as_f32, "file: one FP8 weight stored as float32 (same values)"),
    Corruption("bf16_as_f32", True, _bf16_as_f32, "file: one BF16 norm stored as float32 (same values)"),
    Corruption("unsqueeze", True, _unsqueeze, "file: one norm weight [N] stored as [1, N]"),
    Corruption("drop", True, _drop, "file: one norm weight missing"),
    Corruption("swap_w13", False, _swap_w13, "engine handed w3 for w1 and w1 for w3 of one expert"),
    Corruption("flip_one", False, _flip(_main, "wo_b.weight"), "engine handed one bit changed in attention wo_b"),
    Corruption("mtp_flip", False, _flip(lambda n: n.startswith("mtp."), "e_proj.weight"),
               "engine handed one bit changed in the MTP block's e_proj"),
]}


def other_ranks_expert(name: str, ep_rank: int, ep_world: int, n_experts: int) -> bool:
    """A routed expert's tensor that expert parallelism places on another rank (contiguous blocks of experts)."""
    m = re.search(r"\.experts\.(\d+)\.", name)
    if m is None or ep_world == 1:
        return False
    per = n_experts // ep_world
    return not ep_rank * per <= int(m.group(1)) < (ep_rank + 1) * per
