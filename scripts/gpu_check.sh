#!/usr/bin/env bash
# GPU check: every differential-attention path against the float64 reference (forward and backward) on a
# CUDA device, then the benchmark's ratio table (DIFF / baseline / DiffLlama) measured there.
#
# Usage: scripts/gpu_check.sh [extra `difftransformer bench` options, e.g. --quick]
# Env:   PYTHON (default: .venv/bin/python if present, else python3), DEVICE (default cuda),
#        OUT (default gpu_bench.json; a PNG goes beside it).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-gpu_bench.json}"

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device visible to $PYTHON (torch.cuda.is_available() is False); nothing checked" >&2
    exit 2
fi
"$PYTHON" -c 'import torch; print("gpu_check:", torch.cuda.get_device_name(), "torch", torch.__version__)'

# float32 and bfloat16: the check exits 1 on any miss (set -e stops here).
"$PYTHON" -m difftransformer bench --device "$DEVICE" --dtype float32 --check-only
"$PYTHON" -m difftransformer bench --device "$DEVICE" --dtype bfloat16 --check-only

# The same ratio table as on CPU, measured on the GPU (bfloat16, as models train there).
"$PYTHON" -m difftransformer bench --device "$DEVICE" --dtype bfloat16 --output "$OUT" "$@"
