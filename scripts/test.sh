#!/usr/bin/env bash
# The test command (README "Test", .ci/run): install dependencies, build, run every test.
#   scripts/setup.sh && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release &&
#   cmake --build build -j && ctest --test-dir build --output-on-failure -j2 -LE slow
# (-LE slow leaves out the tests labelled slow; run them with ctest -L slow).
# Run from anywhere; builds in <repo>/build (override with BUILD_DIR=...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${BUILD_DIR:-build}"

scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j2 -LE slow
