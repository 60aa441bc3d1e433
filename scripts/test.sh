#!/usr/bin/env bash
# The test command (README "Test", .ci/run): install dependencies, build, run every test:
#   scripts/setup.sh && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release &&
#   cmake --build build -j && ctest --test-dir build --output-on-failure -j2 -LE slow
# (-LE slow leaves out the tests labelled slow; run them with ctest -L slow).
# Then the sanitizer pass builds dtsim and the unit tests again with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs the unit tests there (README "Sanitizers": times):
#   cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Release -DDTSIM_SANITIZE=address,undefined &&
#   cmake --build build-sanitize -j --target dtsim dtsim_unit_tests &&
#   ctest --test-dir build-sanitize --output-on-failure -j2 -L unit -E '^Validation\.PublishedRunsWithinTolerance$'
# (-L unit: the unit tests, the only test executable built there; -E leaves out the one test
# that only repeats, row by row, the SimGrid runs of every published experiment for their
# accuracy: the Release pass checks that, and under ASan its 30 serial runs pass the 300 s
# test timeout; the engine tests run the same SimGrid code under ASan). DTSIM_SANITIZE_PASS=0 leaves it out. Its simulation children are fork-safe under ASan too:
# they are forked only by a process with one thread (sim/child_process.hpp).
# Run from anywhere; builds in <repo>/build and <repo>/build-sanitize (override with
# BUILD_DIR=... and SANITIZE_BUILD_DIR=...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${BUILD_DIR:-build}"
san_build="${SANITIZE_BUILD_DIR:-${build}-sanitize}"

scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j2 -LE slow

if [ "${DTSIM_SANITIZE_PASS:-1}" != 0 ]; then
  # Every ASan / UBSan report is fatal (CMakeLists.txt: -fno-sanitize-recover=all).
  # detect_stack_use_after_return=0: SimGrid switches between actor stacks it allocates
  # itself, which ASan's fake stacks cannot follow; detect_leaks=0: SimGrid keeps
  # process-lifetime allocations that LeakSanitizer would report at exit.
  export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0:detect_leaks=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  cmake -S . -B "$san_build" -DCMAKE_BUILD_TYPE=Release -DDTSIM_SANITIZE=address,undefined
  cmake --build "$san_build" -j "$(nproc)" --target dtsim dtsim_unit_tests
  ctest --test-dir "$san_build" --output-on-failure -j2 -L unit -E '^Validation\.PublishedRunsWithinTolerance$'
fi
