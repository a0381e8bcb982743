#!/usr/bin/env bash
# Make (or reuse) the private venvs of the engine runs: scripts/engines/venvs.sh WORKDIR [vllm|sglang ...]
# Each engine is installed without its dependencies (its CUDA kernel packages do not install on a CPU machine),
# then every package the load needs is installed with the version the engine's own metadata pins (_pins.py).
# torch comes from PyPI: for Linux x86_64 PyPI serves only the CUDA build of torch (with its nvidia-* and
# cuda-toolkit wheels); it runs on a machine without a GPU. A finished venv holds .complete; a lock per venv lets
# two runs share one WORKDIR.
set -euo pipefail
work=${1:?usage: venvs.sh WORKDIR [vllm|sglang ...]}
here=$(cd "$(dirname "$0")" && pwd)
shift
VLLM_VERSION=0.33.0
SGLANG_VERSION=0.5.23
# what the loads import, beyond the engine itself; pinned as the engine pins them
VLLM_NEEDS="torch transformers compressed-tensors safetensors pydantic msgspec regex cachetools psutil sentencepiece
  numpy requests tqdm blake3 py-cpuinfo huggingface_hub tokenizers protobuf pyyaml einops cloudpickle pyzmq filelock
  cbor2 pybase64 setproctitle aiohttp fastapi openai prometheus_client pillow partial-json-parser jsonschema
  watchfiles python-json-logger ninja ijson oss-harmony xgrammar llguidance apache-tvm-ffi loguru uvloop triton_kernels"
SGLANG_NEEDS="torch torchvision transformers tokenizers sentencepiece compressed-tensors safetensors loguru gguf openai
  sniffio partial_json_parser apache-tvm-ffi pybase64 dill attrs aiohttp starlette ipython pillow pyzmq pyyaml msgspec
  orjson psutil requests tqdm numpy pydantic fastapi uvicorn einops setproctitle"

make() {  # make ENGINE VERSION NEEDS
  local venv=$work/venv-$1
  mkdir -p "$work"
  exec 9>"$work/.venv-$1.lock"
  flock 9
  if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --no-deps "$1==$2"
    # shellcheck disable=SC2086  # NEEDS is a word list
    mapfile -t reqs < <("$venv/bin/python" "$here/_pins.py" "$1" $3)
    echo "venv-$1: $1==$2 ${reqs[*]}"
    "$venv/bin/python" -m pip install -q "${reqs[@]}"
    "$venv/bin/python" -m pip freeze >"$venv/.complete"
  fi
  flock -u 9
}
for e in "${@:-vllm sglang}"; do
  for engine in $e; do
    case $engine in
      vllm) make vllm "$VLLM_VERSION" "$VLLM_NEEDS" ;;
      sglang) make sglang "$SGLANG_VERSION" "$SGLANG_NEEDS" ;;
      *) echo "venvs.sh: unknown engine '$engine'; expected vllm or sglang" >&2; exit 2 ;;
    esac
  done
done
