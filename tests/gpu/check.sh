#!/usr/bin/env bash
# GPU check of `dtsim calibrate` (issue 7). Needs an NVIDIA GPU, the CUDA toolkit and a few
# minutes; not part of the CPU test suite. GPU time is bounded by the timeouts below
# (170 + 80 + 110 + 3 x 40 = 480 s = 8 minutes at most); building is CPU time.
#
#   tests/gpu/check.sh            # builds build-gpu/ with -DDTSIM_CUDA=ON, writes tests/gpu/out/
#   BUILD=dir OUT=dir tests/gpu/check.sh
#
# 1. calibrates the shipped GPT-3 175B experiment (with --grid, so the fitted models see a
#    range of shapes), the Llama-3-8B example and Mixtral-8x7B (with --grid): the shapes the
#    shipped kernel tables lack (models/calibration/tables/README.md): backward attention,
#    the dgrad (NN) and wgrad (TN) layouts of every GEMM, and the routed experts' grouped
#    GEMMs timed per expert over a range of tokens per expert;
# 2. layer check: predicts one transformer layer's forward + recompute + backward compute
#    time from a profile (per-kernel sum, models/compute_cost.hpp) and times the same
#    kernels back to back on the GPU, printing both and the error:
#      - in-sample: each experiment with its own profile (exact shapes);
#      - held-out:  Llama-3-8B predicted from the GPT-3 profile (none of its shapes were
#                   measured there: GEMMs come from the wave-quantised model, memory kernels
#                   from the bandwidth model, attention from the roofline).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
OUT=${OUT:-$ROOT/tests/gpu/out}
GPT3=$ROOT/experiments/gpt3-175b-selective.yaml
LLAMA=$ROOT/experiments/examples/llama3-8b-h100.yaml
MIXTRAL=$ROOT/experiments/moe/mixtral-8x7b-h100.yaml

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv || true
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDTSIM_CUDA=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target dtsim >/dev/null
DTSIM=$BUILD/dtsim
mkdir -p "$OUT"

echo "== calibrate GPT-3 175B (selective recompute) with --grid"
timeout 170 "$DTSIM" calibrate "$GPT3" --grid --repetitions 10 --out "$OUT/gpt3-175b-selective.profile.yaml"
echo "== calibrate Llama-3-8B"
timeout 80 "$DTSIM" calibrate "$LLAMA" --repetitions 10 --out "$OUT/llama3-8b-h100.profile.yaml"
echo "== calibrate Mixtral-8x7B with --grid (per-expert GEMMs, dgrad/wgrad layouts, backward attention)"
timeout 110 "$DTSIM" calibrate "$MIXTRAL" --grid --repetitions 5 --out "$OUT/mixtral-8x7b-h100.profile.yaml"

echo "== layer check, in-sample: GPT-3 175B from its own profile"
timeout 40 "$DTSIM" calibrate "$GPT3" --check-layer "$OUT/gpt3-175b-selective.profile.yaml"
echo "== layer check, in-sample: Llama-3-8B from its own profile"
timeout 40 "$DTSIM" calibrate "$LLAMA" --check-layer "$OUT/llama3-8b-h100.profile.yaml"
echo "== layer check, held-out: Llama-3-8B from the GPT-3 profile"
timeout 40 "$DTSIM" calibrate "$LLAMA" --check-layer "$OUT/gpt3-175b-selective.profile.yaml"
echo "profiles in $OUT"
