#!/usr/bin/env bash
# Runs kiln's whole test suite on the Release build (unit, CLI golden, corrupt inputs, samples,
# ONNX node conformance, real-sized models against ONNX Runtime).
#   scripts/test.sh           the suite on build/ (configures and builds it if needed)
#   scripts/test.sh --asan    the unit, CLI, corrupt-input and conformance tests under
#                             AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/: clang,
#                             the build that also holds the libFuzzer targets of scripts/fuzz.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

if [ "${1:-}" = "--asan" ]; then
  cmake --preset asan
  cmake --build build-asan -j "$jobs"
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L 'unit|cli|conformance'
  exit
fi

[ -x .venv/bin/python ] || scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
