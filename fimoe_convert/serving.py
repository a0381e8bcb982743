"""What to convert (or not) for an engine on a GPU, with the serve command and how each fact was checked, as data.

`recommend(engine, gpu)` answers `fimoe-convert recommend`; `decision_table()` is the table in docs/TARGETS.md
(scripts/decision_table.py keeps it in step). The facts come from docs/ENGINES.md (each engine's loader, read at a
cited commit or run on a CPU), docs/GPU_CHECKS.md (kernel targets run on an H200) and the kernel table
(kernels.suggested). Pure data: no torch, so the command answers in a fraction of a second."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field

from .errors import UsageError
from .kernels import BY_NAME, suggested

ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "transformers": "transformers", "flashinfer": "FlashInfer directly"}
ENGINE_ALIASES = {"hf": "transformers", "huggingface": "transformers", "flashinferdirect": "flashinfer",
                  "flashinfer_direct": "flashinfer"}

# Common name -> compute capability; a capability is also accepted as 9.0, 90, sm90 or sm_90.
GPUS = {"H100": "9.0", "H200": "9.0", "H800": "9.0", "H20": "9.0", "GH200": "9.0",
        "B200": "10.0", "GB200": "10.0", "B300": "10.3", "GB300": "10.3",
        "RTX PRO 6000": "12.0", "RTX 5090": "12.0", "RTX 5080": "12.0",
        "A100": "8.0", "A800": "8.0", "L40S": "8.9", "L40": "8.9", "L4": "8.9", "RTX 4090": "8.9"}
# The GPU named in the decision table's rows, by capability.
ROW_NAMES = {"9.0": "H100 / H200 (9.0)", "10.0": "B200 / GB200 (10.0)", "10.3": "B300 / GB300 (10.3)",
             "10.7": "SM107 (10.7)", "12.0": "RTX PRO 6000, RTX 5090 (12.0)",
             "8.9": "L40S, RTX 4090 (8.9)", "8.0": "A100 (8.0)"}
FP4_ENGINE_GPUS = ("9.0", "10.0", "10.3")  # where vLLM and SGLang recipes serve the released FP4 experts
FP8_GPUS = ("8.9", "9.0", "10.0", "10.3", "10.7", "12.0")  # FP8 E4M3 tensor cores

# Bytes on disk for V4-Flash and V4-Pro (`--dry-run` on the released inventories, README's quick start).
SIZES = {"release": ("160 GB", "865 GB"), "fp8_block": ("293 GB", "1.60 TB"), "bf16": ("576 GB", "3.17 TB"),
         "kernel": ("about the source's size: 160 GB", "865 GB")}
SRC = "deepseek-ai/DeepSeek-V4-Flash"
WIDTH = 116  # characters per line of the text answer

# How each command was checked (the words docs/SERVING.md uses).
RUN_VLLM = "vLLM 0.33.0's own loader run on a CPU (scripts/engines/vllm_load.py); not served on a GPU here"
RUN_SGLANG = "SGLang 0.5.23's own loader run on a CPU (scripts/engines/sglang_load.py); not served on a GPU here"
READ_VLLM = "read from vLLM's DeepSeek V4 loader (docs/ENGINES.md); not run here"
READ_SGLANG = ("read from SGLang's DeepSeek V4 loader (FP4 experts auto-detected) and its DeepSeek-V4 cookbook; "
               "not run here")
RUN_TRANSFORMERS = "run on a CPU: logits bit-identical to the source's (tests/engines/test_engines_transformers.py)"
RUN_H200 = "run on an H200 against a reference (docs/GPU_CHECKS.md)"
NOT_RUN_KERNEL = "converted and checked on a CPU; the kernel was not run on this GPU here (docs/GPU_CHECKS.md)"


@dataclass
class Option:
    """One way to serve: what to convert (target None: serve the release or a published checkpoint as it is)."""

    target: str | None
    params: dict = field(default_factory=dict)
    preset: str | None = None  # --config NAME for V4-Flash
    source: str = SRC  # what to serve when nothing is converted
    size: str = ""  # on disk, V4-Flash / V4-Pro
    serve: str = ""
    checked: str = ""
    note: str = ""

    @property
    def convert(self) -> str | None:
        """The conversion command for V4-Flash, or None."""
        if self.target is None:
            return None
        if self.preset:
            return f"fimoe-convert {SRC} OUT --config {self.preset}"
        flags = [f"--target {self.target}", *[f"--param {k}={v}" for k, v in self.params.items()]]
        return f"fimoe-convert {SRC} OUT {' '.join(flags)}"


@dataclass
class Recommendation:
    engine: str
    gpu: str
    capability: str
    needed: bool
    why: str
    best: Option
    also: list[Option] = field(default_factory=list)

    def to_json(self) -> dict:
        return {**asdict(self), "best": {**asdict(self.best), "convert": self.best.convert},
                "also": [{**asdict(o), "convert": o.convert} for o in self.also]}


def _size(key: str) -> str:
    flash, pro = SIZES[key]
    return f"{flash} (V4-Flash), {pro} (V4-Pro)"


def _fp8_vllm(note: str = "") -> Option:
    return Option("fp8_block", {"scale_dtype": "f32"}, "v4_flash_fp8_block_vllm", size=_size("fp8_block"),
                  serve="vllm serve OUT --tensor-parallel-size 8", checked=RUN_VLLM, note=note)


def _fp8_sglang(note: str = "") -> Option:
    return Option("fp8_block", {}, "v4_flash_fp8_block_sglang", size=_size("fp8_block"),
                  serve="SGLANG_DSV4_FP4_EXPERTS=0 python3 -m sglang.launch_server --model-path OUT --tp 8",
                  checked=RUN_SGLANG, note=note)


def _bf16(engine: str) -> Option:
    serve = {"vllm": ("vllm serve OUT --tensor-parallel-size 8", RUN_VLLM),
             "sglang": ("SGLANG_DSV4_FP4_EXPERTS=0 python3 -m sglang.launch_server --model-path OUT --tp 8",
                        RUN_SGLANG),
             "transformers": ('AutoModelForCausalLM.from_pretrained("OUT", device_map="auto")', RUN_TRANSFORMERS)}
    return Option("bf16", size=_size("bf16"), serve=serve[engine][0], checked=serve[engine][1])


def _release(engine: str) -> Option:
    if engine == "vllm":
        return Option(None, size=_size("release"), serve=f"vllm serve {SRC} --tensor-parallel-size 8",
                      checked=READ_VLLM)
    return Option(None, size=_size("release"), serve=f"python3 -m sglang.launch_server --model-path {SRC} --tp 8",
                  checked=READ_SGLANG)


def _kernel_option(name: str, cap: str) -> Option:
    kernel = BY_NAME[name]
    preset = {"megamoe_sm90_mxfp4": "v4_flash_megamoe_sm90_ep8",
              "sm100_mxfp8_mxfp4_bf16_cutedsl": "v4_flash_sm100_mxfp8_mxfp4_ep8"}.get(name)
    serve = ("your serving code: fimoe_convert.runtime.load_megamoe_weights(OUT, block, rank=RANK) into "
             "flashinfer.megamoe (docs/SERVING.md)" if kernel.family == "megamoe" else
             "your serving code: fimoe_convert.runtime.mega_config(OUT, block, rank=RANK) into "
             "flashinfer.moe_ep.MoEEpMegaLayer (docs/SERVING.md)")
    checked = RUN_H200 if name in ("megamoe_sm90_mxfp4", "sm90_fp8_fp8_bf16_pull_cutedsl") else NOT_RUN_KERNEL
    where = ("convert on a GPU host: its CPU transform is slow (about 3 min on an H200 for V4-Flash against hours on "
             "a CPU)" if kernel.family == "megamoe" else
             "preprocessing needs a CUDA GPU" if kernel.preprocess_needs_cuda else "")
    option = Option(name, preset=preset, size=_size("kernel") + ", at EP 8", serve=serve, checked=checked,
                    note=where)
    if not preset:
        option.params = {}
        option.note = "; ".join(filter(None, [f"add --ep-size N (your expert-parallel ranks) --arch {cap}", where]))
    return option


def _advice(engine: str, cap: str) -> tuple[bool, str, Option, list[Option]]:
    """(conversion needed, why, the best option, other options) for `engine` on a GPU of capability `cap`."""
    if engine == "flashinfer":
        kernels = [k.name for k in suggested(cap)]
        if not kernels:
            return (False, f"No FlashInfer MoE megakernel of the kernel table runs on compute capability {cap}, so "
                           "there is no kernel layout to convert to; serve through an engine instead",
                    Option(None, source="", size="-", serve=f"through an engine: fimoe-convert recommend --engine "
                                                             f"vllm --gpu {cap}",
                           checked="the kernel table (fimoe-convert targets)"), [])
        return (True, f"FlashInfer's MoE megakernels take weights in their own layout: the kernel table recommends "
                      f"{' and '.join(kernels)} for {cap}; converting once saves that transform at every start",
                _kernel_option(kernels[0], cap), [_kernel_option(k, cap) for k in kernels[1:]])
    if engine == "transformers":
        if cap in FP8_GPUS:
            return (True, "transformers loads FP8-block experts (FP8Experts on the GPU) and BF16 experts; fp8_block "
                          "is half the size of bf16",
                    Option("fp8_block", size=_size("fp8_block"),
                           serve='AutoModelForCausalLM.from_pretrained("OUT", device_map="auto")',
                           checked=RUN_TRANSFORMERS),
                    [_bf16("transformers"),
                     Option("bf16", {"dense": "bf16"}, size=_size("bf16"),
                            serve='AutoModelForCausalLM.from_pretrained("OUT")  # transformers >= 5.20',
                            checked=RUN_TRANSFORMERS, note="a plain BF16 checkpoint, for training and fine-tuning")])
        return (True, f"Compute capability {cap} has no FP8 tensor cores: BF16 experts", _bf16("transformers"), [])
    if cap in FP4_ENGINE_GPUS:
        if engine == "vllm":
            why = ("vLLM serves the released FP4 checkpoint as it is (its DeepSeek V4 loader reads expert_dtype fp4 "
                   "into Mxfp4MoEMethod; NVIDIA Dynamo's DeepSeek-V4-Pro recipe serves the release with vLLM on H200)")
            return False, why, _release("vllm"), [_fp8_vllm(
                "FP8 experts without converting at every start; never plain fp8_block: vLLM reads its E8M0 scales as "
                "FP4 and does not load it")]
        why = ("SGLang serves the released FP4 checkpoint as it is (FP4 experts auto-detected; its DeepSeek-V4 "
               "cookbook lists it on H200, B200, B300, GB200 and GB300)")
        also = [_fp8_sglang("FP8 experts, as in the cookbook's H200 FP8 recipe; the preset is V4-Flash's, for V4-Pro "
                            "give --target fp8_block")]
        if cap == "9.0":
            also.insert(0, Option(None, source="sgl-project/DeepSeek-V4-Flash-FP8", size="293 GB (V4-Flash only)",
                                  serve="python3 -m sglang.launch_server --model-path "
                                        "sgl-project/DeepSeek-V4-Flash-FP8 --tp 8",
                                  checked=READ_SGLANG,
                                  note="FP8 experts already published for V4-Flash, in the fp8_block E8M0 "
                                       "layout: nothing to convert"))
        return False, why, _release("sglang"), also
    if cap in FP8_GPUS:
        why = (f"{ENGINES[engine]}'s FP4 MoE path on compute capability {cap} was not checked (the published "
               "DeepSeek V4 recipes cover H200 and B200-class GPUs); FP8-block experts load in its DeepSeek V4 loader")
        best = _fp8_vllm() if engine == "vllm" else _fp8_sglang()
        return True, why, best, [_bf16(engine)]
    return (True, f"Compute capability {cap} has neither FP4 MoE kernels nor FP8 tensor cores: BF16 experts, which "
                  f"{ENGINES[engine]} runs unquantized", _bf16(engine), [])


def _norm(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum() or c == ".")


def parse_engine(name: str) -> str:
    key = _norm(name)
    key = ENGINE_ALIASES.get(key, key)
    if key in ENGINES:
        return key
    close = difflib.get_close_matches(key, [*ENGINES, *ENGINE_ALIASES], n=1, cutoff=0.5)
    hint = f"did you mean {ENGINE_ALIASES.get(close[0], close[0])!r}? " if close else ""
    raise UsageError(f"--engine {name}: unknown engine; {hint}known: {', '.join(ENGINES)}")


def parse_gpu(name: str) -> tuple[str, str]:
    """(the GPU's display name, its compute capability) from a common name or a capability (9.0, 90, sm90, sm_90)."""
    names = {_norm(n): n for n in GPUS}
    key = _norm(name)
    if key in names:
        return names[key], GPUS[names[key]]
    caps = {*GPUS.values(), *ROW_NAMES}
    digits = key.removeprefix("sm").replace(".", "")
    for cap in caps:
        if key == cap or digits == cap.replace(".", ""):
            return f"compute capability {cap}", cap
    part = [n for n in names if key and key in n]
    if len(part) == 1:  # a unique part of a name: "5090", "pro6000"
        return names[part[0]], GPUS[names[part[0]]]
    close = difflib.get_close_matches(key, list(names), n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(names[c]) for c in close)}? " if close else ""
    raise UsageError(f"--gpu {name}: unknown GPU; {hint}known: {', '.join(GPUS)}, or a compute capability "
                     f"({', '.join(sorted(caps, key=lambda c: tuple(map(int, c.split('.')))))})")


def recommend(engine: str, gpu: str) -> Recommendation:
    """What to convert (or not) for `engine` on `gpu`; an unknown name is a UsageError with the closest one."""
    key = parse_engine(engine)
    name, cap = parse_gpu(gpu)
    needed, why, best, also = _advice(key, cap)
    return Recommendation(ENGINES[key], name, cap, needed, why, best, also)


def text(r: Recommendation) -> str:
    """The readable answer of `fimoe-convert recommend`."""
    head = f"{ENGINES.get(r.engine, r.engine)} on {r.gpu} (compute capability {r.capability}): "
    if r.gpu.startswith("compute capability"):
        head = f"{r.engine} on compute capability {r.capability}: "
    verdict = (f"convert to {_label(r.best)}" if r.needed else "no conversion needed" if r.best.source
               else "nothing to convert for it")
    head += f"{verdict}. {r.why}."
    lines = [_wrap(head, ""), *_lines(r.best, "")]
    for o in r.also:
        lines.append(_wrap("or: " + (f"convert to {_label(o)}" if o.target else f"serve {o.source} as it is")
                           + (f" ({o.note})" if o.note else ""), "  "))
        lines += _lines(o, "  ")
    return "\n".join(lines)


def _wrap(line: str, indent: str) -> str:
    import textwrap  # here: only the text answer needs it

    return textwrap.fill(line, WIDTH, subsequent_indent=indent + "  ", break_on_hyphens=False, break_long_words=False)


def _label(o: Option) -> str:
    return o.target + "".join(f" --param {k}={v}" for k, v in o.params.items()) if o.target else "nothing"


def _lines(o: Option, indent: str) -> list[str]:
    lines = [f"{indent}convert: {o.convert}"] if o.convert else []
    if o.target and o.note and not indent:
        lines.append(_wrap(f"note: {o.note}", ""))
    size = [f"{indent}size on disk: {o.size}"] if o.size != "-" else []
    return lines + size + [f"{indent}serve: {o.serve}", f"{indent}checked: {o.checked}"]


def decision_table() -> str:
    """The Markdown table of docs/TARGETS.md: per GPU and engine, what to convert to (or nothing), from recommend()."""
    caps = ["9.0", "10.0", "10.3", "10.7", "12.0", "8.9", "8.0"]
    head = "| GPU (compute capability) | " + " | ".join(ENGINES.values()) + " |"
    rows = [head, "|" + "---|" * (len(ENGINES) + 1)]
    for cap in caps:
        cells = []
        for engine in ENGINES:
            needed, _, best, also = _advice(engine, cap)
            if not best.source:
                cell = "- (no megakernel for this GPU: use an engine)"
            elif not needed:
                cell = "**nothing**: the release as it is" + "".join(
                    f"; or `{_label(o)}`" if o.target else f"; or `{o.source}`" for o in also)
            else:
                cell = f"`{_label(best)}`" + "".join(f"; or `{_label(o)}`" for o in also)
            cells.append(cell)
        rows.append(f"| {ROW_NAMES[cap]} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# --engine on a conversion: the engines that load an output, and each engine's default conversion.
def expert_scales(kernel, params: dict) -> str | None:
    """The dtype of an fp8_block output's expert tile scales ("E8M0" or "F32"); None for other targets."""
    if kernel.family != "fp8_block":
        return None
    return params.get("scale_dtype", kernel.params["scale_dtype"][0]).upper()


def loading_engines(kernel, params: dict) -> tuple[str, ...]:
    """The engines (ENGINES keys) that load an output of `kernel` with `params`: the facts `_advice` serves from."""
    if kernel.kernel_name:  # a FlashInfer layout: no engine reads it as is
        return ("flashinfer",)
    if kernel.family == "fp8_block":  # vLLM reads E8M0-scaled FP8 experts as FP4; SGLang wants E8M0
        return ("vllm", "transformers") if expert_scales(kernel, params) == "F32" else ("sglang", "transformers")
    if params.get("dense") == "bf16":  # not vLLM's CUDA path, nor SGLang's FP8 dense linears
        return ("transformers",)
    return ("vllm", "sglang", "transformers")


def engine_names(engines: tuple[str, ...]) -> str:
    return ", ".join(ENGINES[e] for e in engines)


def engine_option(engine: str, arch: str | None) -> Option:
    """What `--engine` converts to without --target: the conversion `recommend` names for that engine."""
    if engine == "vllm":
        return _fp8_vllm()
    if engine == "sglang":
        return _fp8_sglang()
    if engine == "transformers":
        return _advice(engine, arch or "9.0")[2]  # FP8-block experts, or BF16 where --arch has no FP8 tensor cores
    if arch is None:
        raise UsageError("--engine flashinfer: which kernel layout depends on the serving GPU, and neither --target "
                         "nor --arch was given; add --arch (e.g. 9.0) or --target NAME (fimoe-convert targets)")
    option = _advice(engine, arch)[2]
    if option.target is None:
        raise UsageError(f"--engine flashinfer --arch {arch}: no FlashInfer MoE megakernel of the kernel table runs "
                         f"on compute capability {arch}; use --engine vllm, sglang or transformers")
    return option


def check_engine(engine: str, kernel, params: dict) -> None:
    """A UsageError naming the flags when the engine does not load an output of `kernel` with `params`."""
    loads = loading_engines(kernel, params)
    if engine in loads:
        return
    seen = f"--target {kernel.name}" + "".join(f" --param {k}={v}" for k, v in sorted(params.items()))
    if kernel.family == "fp8_block" and engine == "vllm":
        fix = "vLLM reads E8M0-scaled FP8 experts as FP4: use --param scale_dtype=f32 (or drop --target)"
    elif kernel.family == "fp8_block" and engine == "sglang":
        fix = "SGLang's FP8 experts take E8M0 scales: use --param scale_dtype=e8m0 (or drop --target)"
    elif engine == "flashinfer":
        fix = "FlashInfer's megakernels take a kernel layout: pick one for your GPU (fimoe-convert targets)"
    elif kernel.kernel_name:
        fix = (f"a FlashInfer kernel layout is loaded by fimoe_convert.runtime only, {ENGINES[engine]} preprocesses "
               "the source at load instead: drop --target (or serve the release as it is)")
    else:
        fix = "drop --param dense=bf16 (or drop --target)"
    raise UsageError(f"--engine {engine} with {seen}: this output loads in {engine_names(loads)}, not "
                     f"{ENGINES[engine]}; {fix}")
