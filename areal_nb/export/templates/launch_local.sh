#!/usr/bin/env bash
# Continue this run on this machine: torchrun starts NPROC trainer processes (gloo on CPU,
# NCCL on GPUs); rank 0 also runs the engine, the proxy and the rollouts.
#
#   bash launch_local.sh [key=value ...]        e.g. total_steps=50
#   NPROC=4 bash launch_local.sh                 more processes than cluster.nproc_per_node
set -euo pipefail
cd "$(dirname "$0")"

NPROC="${NPROC:-@NPROC@}"
if ! command -v torchrun > /dev/null; then
  echo "launch_local.sh: torchrun is not on PATH: activate the environment this run was exported from" \
       "(or pip install -r requirements.txt)" >&2
  exit 127
fi
exec torchrun --standalone --nproc-per-node "$NPROC" train.py "$@"
