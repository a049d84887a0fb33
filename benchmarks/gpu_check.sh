#!/usr/bin/env bash
# The SGLang device check, in one run on a GPU machine (see benchmarks/gpu_check.py for the steps):
# install sglang if it is missing, build a small Qwen2 model from scratch, launch a real SGLang server,
# run the contract tests and GRPO steps against it, stop it and check nothing is left running.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      (results: OUT_DIR/{gpu_check.log,sglang.log,junit.xml})
#
# Checked version set (pip dry-run resolution, 2026-11-30): sglang 0.5.23 pins torch==2.14.1
# (CUDA 13.0 wheels from PyPI), transformers==5.19.0, tokenizers==0.23.2, openai==2.8.0; with
# areal_nb[test] the resolver picks openai-agents 0.6.2. `environment-gpu.yml` installs that set.
# sglang needs a CUDA 13 driver (>= 580) and network access to PyPI for the install step; a machine
# that has sglang already skips it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-$PWD/artifacts/gpu_check}}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || { echo "gpu_check: no NVIDIA GPU"; exit 2; }
"$PY" --version

if ! "$PY" -c "import sglang" 2>/dev/null; then
    echo "gpu_check: installing areal_nb[sglang,test] (sglang 0.5.23 and the torch it pins)"
    if ! timeout 1200 "$PY" -m pip install -q -e ".[sglang,test]" "sglang==0.5.23"; then
        echo "gpu_check: could not install sglang here (no network, or no wheel for this Python/CUDA)."
        echo "gpu_check: use a machine with PyPI access or an image with sglang 0.5.23 installed."
        exit 3
    fi
else
    # areal_nb and what it needs beyond sglang's image (httpx-aiohttp, pytest, ...): pip keeps every
    # version already installed that satisfies us (sglang's torch/transformers pins stay); a bare
    # `--no-deps` install left the client's transport and the test runner missing
    if ! timeout 1200 "$PY" -m pip install -q -e ".[test]"; then
        echo "gpu_check: could not install areal_nb[test] next to sglang (no network?)"
        exit 3
    fi
fi
"$PY" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda)"

"$PY" benchmarks/gpu_check.py --out "$OUT_DIR"
