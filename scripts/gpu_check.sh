#!/usr/bin/env bash
# One GPU shared by the engine and the trainer (vLLM sleep mode around a GRPO step), checked on a real GPU.
# Needs a CUDA machine with the GPU install (`pip install -e .[gpu]`: vLLM's CUDA build) and the tiny model
# (`make model`), or `--model <folder>` of a small local chat model (e.g. Qwen2-0.5B-Instruct).
#   scripts/gpu_check.sh [--model PATH] [--keep]
# Prints a PASS/FAIL table; exit 0 = all passed, 1 = a check failed, 2 = the machine lacks a GPU or vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
       RAY_TRAIN_V2_ENABLED=1 RAY_USAGE_STATS_ENABLED=0 VLLM_CACHE_ROOT="$PWD/.cache/vllm"
exec timeout --signal=INT --kill-after=30 570 "$PY" -m scripts.gpu_check "$@"
