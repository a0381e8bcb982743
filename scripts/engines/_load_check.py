"""Engine-independent checks around a model's own load_weights: sentinel fill, loader call tracing, summaries."""
import re
import traceback
from collections import Counter
from pathlib import Path

import torch
from _values import compare_all, load_file

SENTINEL_INT = 0x5A  # byte written into every element of integer / fp8-scale parameters before loading


def where(exc: BaseException) -> str:
    """file:line `code` of the innermost frames (engine path from its package root), plus the exception."""
    frames = [f"{_short(f.filename)}:{f.lineno} `{f.line}`" for f in traceback.extract_tb(exc.__traceback__)
              if f.name != "__torch_function__"][-4:]  # this script's tracing modes are not the engine's code
    return "\n    " + "\n    ".join(frames) + f"\n    -> {type(exc).__name__}: {exc}"


def _short(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts else Path(path).name


def kind(name: str) -> str:
    """Parameter / module name with layer and expert indices folded, so the summary has one row per kind."""
    return re.sub(r"\.\d+(?=\.|$)", ".N", name)


def quant_methods(model) -> dict:
    """Quant method class per module kind (routed experts, shared experts, attention linears, ...)."""
    seen = {}
    for name, mod in model.named_modules():
        qm = getattr(mod, "quant_method", None)
        if qm is not None:
            seen.setdefault(kind(name), f"{type(mod).__name__}: {type(qm).__name__}")
    return seen


def fill_sentinel(model) -> dict:
    """NaN into floating parameters (fp8 too), 0x5A bytes into integer ones; returns each one's sentinel element
    bytes."""
    pats = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if getattr(p, "_skip_weight_check", False):  # engine-set when no file has it: kept as constructed
                continue
            try:
                if p.dtype.is_floating_point:
                    p.data.fill_(float("nan"))
                else:
                    p.data.view(torch.uint8).fill_(SENTINEL_INT)
            except (RuntimeError, TypeError):  # fp8 fill_ missing on this build: the dtype's NaN byte
                p.data.view(torch.uint8).fill_(0xFF if p.dtype == torch.float8_e8m0fnu else 0x7F)
            pats[name] = p.data.reshape(-1)[:1].view(torch.uint8).clone()
    return pats


def unfilled(model, pats: dict) -> tuple[list, list]:
    """(parameters still wholly sentinel, parameters partly sentinel), compared byte for byte."""
    whole, part = [], []
    for name, p in model.named_parameters():
        if name not in pats:
            continue
        b = p.data.reshape(-1).view(torch.uint8).reshape(p.numel(), -1)
        hit = (b == pats[name]).all(dim=1)
        if hit.all():
            whole.append(name)
        elif hit.any():
            part.append(f"{name} ({int(hit.sum())}/{p.numel()})")
    return whole, part


class Trace:
    """Wraps every parameter's weight_loader and the weights iterator: which tensor fed which parameter."""

    def __init__(self, model, default_loader):
        self.current = None
        self.consumed, self.calls, self.mismatch, self.errors = set(), Counter(), [], {}
        self.origin, self.keep = {}, []  # storage address -> names of the checkpoint tensors it came from
        for pname, p in model.named_parameters():
            traced = self._wrap(pname, p, getattr(p, "weight_loader", default_loader))
            try:
                p.weight_loader = traced
            except AttributeError:  # SGLang's BasevLLMParameter: a read-only property over _weight_loader
                p._weight_loader = traced

    def _wrap(self, pname, param, loader):
        def traced(prm, loaded, *a, **k):
            # engines that batch, fuse or load on worker threads pass tensors made from earlier names
            names = sorted(self.origin.get(_storage(loaded)) or {self.current})
            if loaded.dtype != prm.dtype and loaded.dtype.itemsize != prm.dtype.itemsize:
                self.mismatch += [f"{n}: {loaded.dtype} -> {prm.dtype}" for n in names]
            try:
                out = loader(prm, loaded, *a, **k)
            except Exception as exc:  # noqa: BLE001  (kept per tensor so that loading goes on to the rest)
                self.errors.setdefault(kind(names[0]), [0, where(exc)])[0] += 1
                return False
            if out is not False:
                self.consumed.update(names)
                self.calls[kind(pname)] += 1
            return out
        return traced

    def weights(self, tensors: dict):
        for n, t in tensors.items():
            t = t.clone()  # a tensor of its own: the engine may write into it, and origins are by storage
            self.current = n
            self.origin[_storage(t)] = {n}
            self.keep.append(t)  # alive, so that no later tensor reuses its address
            yield n, t

    def derived(self):
        """Torch function mode: a tensor computed from traced checkpoint tensors (cat, dequantize, ...) is
        traced to their names."""
        trace = self

        class Derived(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if getattr(func, "__name__", "").endswith("_"):  # in place: the output is the destination
                    return out
                ins = [x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
                names = set().union(*(trace.origin.get(_storage(x), set()) for x in ins))
                for o in torch.utils._pytree.tree_leaves(out):
                    if names and isinstance(o, torch.Tensor) and _storage(o) not in trace.origin:
                        trace.origin[_storage(o)] = names
                        trace.keep.append(o)
                return out
        return Derived()


def _storage(t) -> int:
    return t.untyped_storage().data_ptr()


def report(model, names: list, pats: dict, tr: "Trace", returned, foreign) -> int:
    whole, part = unfilled(model, pats)
    params = dict(model.named_parameters())
    # the engine marks parameters a checkpoint may lack (SGLang's FP8 KV-cache k_scale / v_scale, -1.0 until its
    # post-load step sets 1.0 when absent); not sentinel-filled, reported apart
    optional = [n for n in params if n not in pats]
    unused = [n for n in names if n not in tr.consumed]
    print(f"tensors offered: {len(names)}; consumed (a weight_loader took them): {len(tr.consumed)}; "
          f"names load_weights returned: {len(returned) if returned is not None else '-'}")
    print(f"parameters: {len(params)} total, {len(params) - len(whole) - len(part) - len(optional)} filled, "
          f"{len(whole)} still all-sentinel, {len(part)} partly sentinel"
          + (f", {len(optional)} not in the checkpoint by the engine's design" if optional else ""))
    for k, (c, w) in sorted(tr.errors.items()):
        print(f"  weight_loader raised on {k} x{c}:{w}")
    other = [n for n in unused if foreign(n)]
    if other:  # the main model drops mtp.*, the MTP draft model all but mtp.*: the other model loads them
        print(f"  not consumed: x{len(other)} belonging to the other model (main / MTP draft) or another EP rank")
    not_consumed = [n for n in unused if not foreign(n)]
    for title, items in (("not consumed", not_consumed), ("still all-sentinel", whole), ("partly sentinel", part),
                         ("not in the checkpoint (engine-marked optional)", optional),
                         ("dtype converted by the loader (loaded -> param)", tr.mismatch)):
        ks = Counter(kind(i) for i in items)
        for k, c in sorted(ks.items()):
            print(f"  {title}: {k} x{c}")
    # a value conversion by the engine's own loader (e8m0 -> f32 scales) is reported, not a failure
    return int(bool(not_consumed or whole or part or tr.errors))


def load_and_report(model, out: str, weight_loader, built: str, check, corrupt=None, label="main",
                    after=None) -> dict:
    """The part both engines share once their model is built: quant method per layer kind, sentinel fill, the
    engine's own load_weights over every tensor of OUT (traced), then every parameter compared with the file.
    `check` holds source_of, casts, optional, rank/world (see compare_all). Returns the counts and the status."""
    print(f"[{label}] built on cpu{built}: {sum(1 for _ in model.named_parameters())} parameters")
    if corrupt is None:
        for k, v in quant_methods(model).items():
            print(f"  quant method {k}: {v}")
    ck = load_file(out, corrupt)  # the reference: what the file holds
    handed = ck if corrupt is None or corrupt.in_file else corrupt.apply(ck)
    handed = {n: t for n, t in handed.items() if check.get("offer", lambda n: True)(n)}
    pats = fill_sentinel(model)
    tr = Trace(model, weight_loader)
    names, returned, stopped = [], None, False
    try:
        with tr.derived():
            returned = model.load_weights((n, t) for n, t in tr.weights(handed) if not names.append(n))
    except Exception as exc:  # report where the engine's own code stops
        stopped = True
        print(f"STOP in load_weights (last tensor read: {tr.current}): {where(exc)}")
    if after is not None and not stopped:
        after(model)  # what the engine does next with this model (e.g. the MTP draft's shared weights)
    status = max(report(model, names, pats, tr, returned, check.get("foreign", lambda n: False)), int(stopped))
    equal, fails, covered = compare_all(model, ck, check, tag=f" [{label}]")
    n_params = sum(1 for _ in model.named_parameters())
    status = max(status, int(bool(fails)), int(equal == 0))
    return {"offered": len(names), "consumed": len(tr.consumed), "params": n_params, "equal": equal,
            "files_covered": len(covered), "status": status}


def result_line(engine: str, out: str, model: str, layout: str, rank: int, r: dict) -> str:
    """One machine-readable line per (engine, output, model, layout, rank); run.sh tabulates them."""
    return (f"RESULT engine={engine} output={Path(out).name} model={model} layout={layout} rank={rank} "
            f"offered={r['offered']} consumed={r['consumed']} params={r['params']} equal={r['equal']} "
            f"post={r.get('post', '-')} status={'ok' if r['status'] == 0 else 'FAIL'}")


def selftest(models: dict, checks: dict, out: str, weight_loader, corruptions: dict, after=None) -> int:
    """Load again with each corruption (main model, or MTP for the mtp_* ones): each must make the check fail.
    Returns 1 when one was not caught."""
    missed = []
    for c in corruptions.values():
        label = "mtp" if c.name.startswith("mtp_") else "main"
        print(f"--- self-test {c.name}: {c.doc}")
        r = load_and_report(models[label], out, weight_loader, "", checks[label], corrupt=c, label=label,
                            after=(after or {}).get(label))
        print(f"SELFTEST {c.name}: {'caught' if r['status'] else 'NOT CAUGHT'}")
        if not r["status"]:
            missed.append(c.name)
    print(f"SELFTEST summary: {len(corruptions) - len(missed)} of {len(corruptions)} corruptions caught"
          + (f"; not caught: {missed}" if missed else ""))
    return int(bool(missed))


CUDA_ONLY = ("CUDA-only", "NVIDIA driver", "not compiled with CUDA", "no CUDA GPUs", "CUDA driver", "libcuda",
             "cudaGetDevice", "CUDA error", "CUDA_HOME", "nvcc", "triton", "Triton",
             "from the 'CPU' backend")  # a torch op registered for CUDA only


def post_process(model, dtype, deferred=None) -> str:
    """Each module's quant_method.process_weights_after_loading (the loop of vLLM's model_loader/utils.py
    process_weights_after_loading and of SGLang's DefaultModelLoader.load_weights_and_postprocess), then
    the layers `deferred` picks (vLLM's attention layers) with their own process_weights_after_loading(dtype),
    then the model's own one if it has it; one module at a time so that one stop does not hide the rest. Prints
    per method how many modules ran and where each stop is. Returns "ok", "cuda-only" (every stop is a CUDA-only
    kernel or library) or "FAIL"."""
    runs, stops = Counter(), {}
    for name, mod in model.named_modules():
        qm = getattr(mod, "quant_method", None)
        steps = []
        if qm is not None and hasattr(qm, "process_weights_after_loading"):
            steps.append((type(qm).__name__, lambda qm=qm, mod=mod: qm.process_weights_after_loading(mod)))
        if deferred is not None and deferred(mod):
            steps.append((type(mod).__name__, lambda mod=mod: mod.process_weights_after_loading(dtype)))
        if mod is model and callable(getattr(model, "process_weights_after_loading", None)):
            steps.append((f"{type(mod).__name__} (model)", lambda: model.process_weights_after_loading()))
        for label, step in steps:
            try:
                with torch.no_grad():
                    step()
                runs[label] += 1
            except Exception as exc:  # noqa: BLE001  (reported per method, the rest still run)
                stops.setdefault(label, [0, kind(name), where(exc)])[0] += 1
    verdict = "ok"
    for label in sorted(set(runs) | set(stops)):
        print(f"  post-load {label}: {runs[label]} modules ran" + (f", {stops[label][0]} stopped" if label in stops
                                                                     else ""))
    for label, (_count, first, w) in sorted(stops.items()):
        cuda = any(k in w for k in CUDA_ONLY)
        print(f"  post-load {label} stops {'at a CUDA-only step' if cuda else 'UNEXPECTEDLY'} (first {first}):{w}")
        verdict = "FAIL" if not cuda else ("cuda-only" if verdict == "ok" else verdict)
    return verdict
