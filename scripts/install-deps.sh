#!/usr/bin/env bash
# System packages for building kiln on Debian 12, and the test tools' virtual environment.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  libcli11-dev libonnx-dev libprotobuf-dev protobuf-compiler
  flatbuffers-compiler libflatbuffers-dev zlib1g-dev libzip-dev
  libdnnl-dev ocl-icd-opencl-dev libxnnpack-dev libpthreadpool-dev libcpuinfo-dev
  libgtest-dev python3 python3-venv python3-pip
  clang libclang-rt-14-dev libomp-dev strace nlohmann-json3-dev  # clang: the sanitizer and fuzz build
  chromium  # tests/cli/run_html_test.py: the HTML report in a headless browser
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test tools (onnx with its node conformance data, onnxruntime, numpy): not runtime dependencies.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
.venv/bin/pip install -q -r scripts/requirements.txt
