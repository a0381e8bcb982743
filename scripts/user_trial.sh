#!/bin/bash
# A new user's path, timed step by step: a fresh clone, the README's set-up block, the demo, `recommend`, a conversion
# for vLLM and one for SGLang, inspect, and each engine's own loader on the output (the serve check without a GPU):
#   bash scripts/user_trial.sh TRIAL_DIR ENGINES_DIR
# ENGINES_DIR holds venv-vllm and venv-sglang as scripts/engines/venvs.sh makes them. Run from the repo to clone.
set -e
D=${1:?usage: user_trial.sh TRIAL_DIR ENGINES_DIR}; E=${2:?usage: user_trial.sh TRIAL_DIR ENGINES_DIR}
E=$(cd "$E" && pwd)
rm -rf "$D" && git clone -q "$(git rev-parse --show-toplevel)" "$D" && cd "$D" && git log --oneline -1
t() { local s; s=$(date +%s.%N); echo "\$ $*"; "$@" 2>&1 | tail -"${TAIL:-8}"; local rc=${PIPESTATUS[0]}
      echo "[exit $rc, $(echo "$(date +%s.%N) - $s" | bc | xargs printf '%.2f') s]"; }
s=$(date +%s.%N)
python3 -c 'import torch' 2>/dev/null || { python3 -m venv --system-site-packages .venv && . .venv/bin/activate &&
  python3 -m pip install -q torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu; }
python3 -m pip install -q -e ".[$(python3 scripts/flashinfer_extra.py)]"
echo "[set-up block: $(echo "$(date +%s.%N) - $s" | bc | xargs printf '%.2f') s]"
t fimoe-convert demo
TAIL=20 t fimoe-convert recommend --engine vllm --gpu H200
TAIL=20 t fimoe-convert recommend --engine sglang --gpu H100
t fimoe-convert recommend --engine vllm --gpu rtx5090
t fimoe-convert demo-out/src out-vllm --config v4_flash_fp8_block_vllm
t fimoe-convert demo-out/src out-sglang --engine sglang
t fimoe-convert inspect out-vllm
t fimoe-convert verify out-vllm --deep
TAIL=6 t "$E/venv-vllm/bin/python" scripts/engines/vllm_load.py out-vllm
TAIL=6 t "$E/venv-sglang/bin/python" scripts/engines/sglang_load.py out-sglang
