#!/usr/bin/env bash
# The main job on a bundled sample: export the sample CNN, compile it for its input shape
# (folding, fusion, kernel choice), inspect it, run it and check the outputs against the
# sample's expected outputs, then time it and profile it (where its time goes, kernel by kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${1:-build/kiln}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$kiln" export samples/cnn.onnx -o "$out/cnn.kiln"
"$kiln" compile "$out/cnn.kiln" -o "$out/cnn.c.kiln" --input-shape input=1x3x32x32 --time-passes
"$kiln" inspect "$out/cnn.c.kiln"
"$kiln" run "$out/cnn.c.kiln" --inputs samples/cnn.inputs.npz --output-dir "$out/outputs" \
  --check-against samples/cnn.expected
"$kiln" run "$out/cnn.c.kiln" --inputs samples/cnn.inputs.npz --warmup 10 --iters 100
"$kiln" profile "$out/cnn.c.kiln" --inputs samples/cnn.inputs.npz --iters 200 --top 5
echo "demo: ok"
