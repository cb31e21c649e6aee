#!/usr/bin/env bash
# GPU check: every differential-attention path against the float64 reference (forward and backward) on a
# CUDA device, a few bf16 training steps under FSDP on every visible GPU (torchrun, one process per GPU) beside
# `difftransformer plan`'s estimate for the same run, then the benchmark's ratio table (DIFF / baseline /
# DiffLlama) measured there.
#
# Usage: scripts/gpu_check.sh [extra `difftransformer bench` options, e.g. --quick]
# Env:   PYTHON (default: .venv/bin/python if present, else python3), DEVICE (default cuda),
#        OUT (default gpu_bench.json; a PNG goes beside it), FSDP_RUN (the FSDP run's folder, default a new
#        temporary one), FSDP_STEPS (default 30).
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

# bf16 training under FSDP on every GPU, on text shipped in this repository (the machine may be offline).
# metrics.csv holds the losses and tokens/s; plan prints the memory per device it expects for the same run.
GPUS="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')"
FSDP_RUN="${FSDP_RUN:-$(mktemp -d)/fsdp}"
FSDP_STEPS="${FSDP_STEPS:-30}"
RUN_FLAGS=(--preset small --bf16 --fsdp "full_shard auto_wrap")
"$PYTHON" -m torch.distributed.run --nproc_per_node="$GPUS" -m difftransformer train "${RUN_FLAGS[@]}" \
    --data 'docs/*.md' README.md --vocab-size 2048 --needle-fraction 0 --max-steps "$FSDP_STEPS" --logging-steps 10 \
    --eval-steps "$FSDP_STEPS" --save-steps "$FSDP_STEPS" --report-to none --output-dir "$FSDP_RUN"
echo "gpu_check: FSDP bf16 on $GPUS GPU(s), $FSDP_STEPS steps: $FSDP_RUN/metrics.csv"
cat "$FSDP_RUN/metrics.csv"
"$PYTHON" -m difftransformer plan "${RUN_FLAGS[@]}" --vocab-size 2048 --world-size "$GPUS"

# The same ratio table as on CPU, measured on the GPU (bfloat16, as models train there).
"$PYTHON" -m difftransformer bench --device "$DEVICE" --dtype bfloat16 --output "$OUT" "$@"
