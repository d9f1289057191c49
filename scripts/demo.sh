#!/usr/bin/env bash
# The main job on a bundled sample: export the sample CNN, quantize it (x86, calibrated on the
# sample's inputs) and check the quantized outputs, compile it to int8 kernels and check those
# too; compile the float model for its input shape (folding, fusion, kernel choice), inspect it,
# run it and check the outputs against the sample's expected outputs, then time it and profile
# it (where its time goes, kernel by kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${1:-build/kiln}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$kiln" export samples/cnn.onnx -o "$out/cnn.kiln"
"$kiln" quant "$out/cnn.kiln" -o "$out/cnn.q.kiln" --quantizer x86 --calib samples/cnn.inputs.npz
"$kiln" run "$out/cnn.q.kiln" --inputs samples/cnn.inputs.npz --check-against samples/cnn.expected --atol 0.05 --rtol 0.05
"$kiln" compile "$out/cnn.q.kiln" -o "$out/cnn.q.c.kiln" --input-shape input=1x3x32x32
"$kiln" run "$out/cnn.q.c.kiln" --inputs samples/cnn.inputs.npz --check-against samples/cnn.expected --atol 0.05 --rtol 0.05
"$kiln" compile "$out/cnn.kiln" -o "$out/cnn.c.kiln" --input-shape input=1x3x32x32 --time-passes
"$kiln" inspect "$out/cnn.c.kiln"
"$kiln" run "$out/cnn.c.kiln" --inputs samples/cnn.inputs.npz --output-dir "$out/outputs" \
  --check-against samples/cnn.expected
"$kiln" run "$out/cnn.c.kiln" --inputs samples/cnn.inputs.npz --warmup 10 --iters 100
"$kiln" profile "$out/cnn.c.kiln" --inputs samples/cnn.inputs.npz --iters 200 --top 5
echo "demo: ok"
