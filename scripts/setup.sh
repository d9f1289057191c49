#!/usr/bin/env bash
# Installs kiln's build dependencies (Debian 12 packages) and test tools (a Python virtual
# environment in .venv), builds kiln in build/ (Release), and runs the demo on a sample model:
# export → compile → inspect → run, checked against the sample's expected outputs, then timed.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"

scripts/demo.sh build/kiln
