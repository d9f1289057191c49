#!/usr/bin/env bash
# The main job on a bundled sample: export the sample CNN, inspect it, run it and check the
# outputs against the sample's expected outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${1:-build/kiln}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$kiln" export samples/cnn.onnx -o "$out/cnn.kiln"
"$kiln" inspect "$out/cnn.kiln"
"$kiln" run "$out/cnn.kiln" --inputs samples/cnn.inputs.npz --output-dir "$out/outputs" \
  --check-against samples/cnn.expected
echo "demo: ok"
