#!/usr/bin/env bash
# The GPU check in one run (the stages are in benchmarks/gpu_check.py): a Qwen2.5-0.5B-shaped model
# in bf16 on CUDA through the engine, 3 GRPO steps of a Session, one FSDP2 step (NCCL, world size 1),
# the engine-server on CUDA driven by SGLangEngine; peak GPU memory. About 5 minutes on one GPU.
#
#   make gpu-wheels                              (here, with a package registry: ~32 MB of wheels)
#   bash benchmarks/gpu_check.sh [OUT_DIR] [gpu_check.py args ...]   (there; no registry needed)
#
# For a machine with Python 3.12, torch and transformers but no registry: what areal_nb needs
# beyond them (benchmarks/gpu_requirements.txt) is installed from benchmarks/gpu_wheels/ with
# `pip --no-index`; areal_nb itself runs from this tree (PYTHONPATH), nothing is built.
# With sglang installed, add --sglang to also run the contract tests against a real SGLang server.
# Rehearsal without a GPU: bash benchmarks/gpu_check.sh OUT --rehearse  (CPU, 2 small layers)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-$PWD/artifacts/gpu_check}}"
shift || true
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "gpu_check: no nvidia-smi"
"$PY" --version
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" \
    || { echo "gpu_check: torch and transformers must be installed"; exit 3; }

WHEELS="${GPU_WHEELS:-benchmarks/gpu_wheels}"
if ! "$PY" -c "import fastapi, uvicorn, openai, math_verify, httpx_aiohttp, orjson, pandas" 2>/dev/null; then
    if [ ! -d "$WHEELS" ]; then
        echo "gpu_check: packages missing and no $WHEELS: run 'make gpu-wheels' where PyPI is reachable"
        exit 3
    fi
    echo "gpu_check: installing benchmarks/gpu_requirements.txt from $WHEELS (no index)"
    if ! "$PY" -m pip install -q --no-index --find-links "$WHEELS" -r benchmarks/gpu_requirements.txt; then
        echo "gpu_check: the offline install failed (wheels for another Python? make gpu-wheels GPU_PYTHON=3.X)"
        exit 3
    fi
fi

timeout 600 "$PY" benchmarks/gpu_check.py --out "$OUT_DIR" "$@"
