#!/usr/bin/env bash
# Make the tiny source (indexer head 128, the only size the engines' kernels take), convert the outputs the README
# tells users to serve, and run vllm_load.py and sglang_load.py on each, each engine in its own private venv
# (never the project's). Usage: scripts/engines/run.sh WORKDIR
# Existing venvs are reused when named: VENV_VLLM, VENV_SGLANG (not VLLM_* / SGLANG_*, which the engines read);
# else WORKDIR/venv-vllm, WORKDIR/venv-sglang, made here when missing. FIMOE_PYTHON is the Python that has
# fimoe_convert (default python3).
set -euo pipefail
work=${1:?usage: run.sh WORKDIR}
here=$(cd "$(dirname "$0")" && pwd)
py=${FIMOE_PYTHON:-python3}
venv=${VENV_VLLM:-$work/venv-vllm}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q --no-deps vllm==0.33.0 compressed-tensors==0.17.0 loguru
  "$venv/bin/pip" install -q "transformers>=5.16.1,<5.21.0" safetensors pydantic msgspec regex cachetools psutil \
    sentencepiece numpy requests tqdm blake3 py-cpuinfo huggingface_hub tokenizers protobuf pyyaml einops \
    cloudpickle pyzmq filelock cbor2 pybase64 setproctitle aiohttp fastapi openai prometheus_client pillow \
    partial-json-parser jsonschema watchfiles python-json-logger ninja ijson oss-harmony uvloop xgrammar \
    llguidance triton_kernels
fi
sg=${VENV_SGLANG:-$work/venv-sglang}
if [ ! -x "$sg/bin/python" ]; then
  python3 -m venv "$sg"
  "$sg/bin/pip" install -q torch==2.14.1 torchvision==0.29.1  # SGLang 0.5.23 pins torch; its configs import torchvision
  "$sg/bin/pip" install -q --no-deps sglang==0.5.23 compressed-tensors loguru gguf openai sniffio \
    partial-json-parser apache-tvm-ffi pybase64 triton dill
  "$sg/bin/pip" install -q transformers safetensors attrs aiohttp starlette ipython pillow pyzmq pyyaml \
    msgspec orjson psutil requests tqdm numpy pydantic fastapi uvicorn einops setproctitle
fi
echo "fimoe-convert $("$py" -c 'import importlib.metadata as m; print(m.version("fimoe-convert"))' 2>/dev/null \
  || echo '(source tree)'); $(date -u +%FT%TZ); $(uname -m), $(nproc) cores; no GPU unless the scripts say cuda=True"
[ -d "$work/src" ] || "$py" "$here/../make_fixture.py" "$work/src" --preset tiny --index-head-dim 128
for t in "bf16" "fp8_block --param scale_dtype=f32" "fp8_block" "bf16 --param dense=bf16"; do
  o=$work/out-$(echo "$t" | tr ' =' '__')
  [ -d "$o" ] || "$py" -m fimoe_convert.cli "$work/src" "$o" --target $t
  echo "=== vllm_load.py $(basename "$o")"
  "$venv/bin/python" "$here/vllm_load.py" "$o" && echo "exit 0" || echo "exit $?"
  echo "=== sglang_load.py $(basename "$o")"
  "$sg/bin/python" "$here/sglang_load.py" "$o" && echo "exit 0" || echo "exit $?"
done
