#!/usr/bin/env bash
# The GPU check of the foundation (benchmarks/gpu_check.py): ViT-B/16 bf16 feature extraction
# (images/s, % of the dense bf16 peak) and TOSCA end-to-end at CIFAR-100 shape as a ratio to one
# feature pass (target <= 1.5), and AWARe on a random LLaVA-1.5-7B-shaped model in bf16 (profile + 10
# fine-tuning steps). Random weights and features: nothing is downloaded. A few
# minutes on one H200; killed after 5. Exit status non-zero on failure.
#
#   benchmarks/gpu_check.sh                       # on the GPU machine
#   benchmarks/gpu_check.sh --device cpu --tiny --target 1e9   # a dry run anywhere
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # lab importable without installing it
exec timeout 300 "$PY" benchmarks/gpu_check.py --device cuda "$@"
