#!/usr/bin/env bash
# The run command (README "Run"): install dependencies, build, simulate one step of
# GPT-3 175B with selective recompute (Korthikanti et al. 2022, Table 3).
#   scripts/setup.sh && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release &&
#   cmake --build build -j && ./build/dtsim run experiments/gpt3-175b-selective.yaml
# Extra arguments go to `dtsim run` (e.g. --set layout.tp=4 --json out.json).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${BUILD_DIR:-build}"

scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
"./$build/dtsim" run experiments/gpt3-175b-selective.yaml "$@"
