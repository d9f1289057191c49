#!/usr/bin/env python3
"""Writes kiln's small committed sample models, their inputs and their expected outputs.

    python samples/make_samples.py [--out-dir DIR]

For each sample NAME it writes NAME.onnx, NAME.inputs.npz (keys = graph input names) and
NAME.expected/<output name>.npy. Expected outputs come from onnx.reference.ReferenceEvaluator
(plain numpy, the same on every machine) and are checked against onnxruntime.

The files are committed, so the script must be reproducible byte for byte: weights come from
seeded numpy Generators, node names are fixed, and the .npz archives carry a fixed timestamp. A
test reruns the script into a temporary --out-dir and compares the bytes with samples/.

Names follow torch.onnx.export ('/scope/Op_1' nodes, '<node>_output_0' values, 'fc1.bias'
parameters) and each sample pins the opset and IR version such an exporter would have written.
Test tool only: needs onnx, onnxruntime and numpy (scripts/requirements.txt).
"""

import argparse
import io
import os
import sys
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SAMPLES_DIR = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 1e-5


def encode_name(name):
    """File-name form of a value name: bytes outside [A-Za-z0-9._-] become %XX."""
    safe = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
    return "".join(chr(b) if b in safe else "%%%02X" % b for b in name.encode("utf-8"))


def save_npz(path, arrays):
    """np.savez without its wall-clock zip timestamps, so reruns give the same bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for key, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())


class Builder:
    """Collects nodes and initializers of one graph, naming them the way torch.onnx does."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self._counts = {}
        self._next_id = 100

    def fresh(self, prefix):
        """A torch-style name for a folded constant: 'onnx::MatMul_101'."""
        self._next_id += 1
        return f"{prefix}_{self._next_id}"

    def input(self, name, elem_type, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name, elem_type, shape):
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def init(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def param(self, name, shape, std, mean=0.0):
        values = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        return self.init(name, values + np.float32(mean))

    def uniform(self, name, shape, low, high):
        return self.init(name, self.rng.uniform(low, high, shape).astype(np.float32))

    def op(self, op_type, inputs, scope="", out=None, **attrs):
        base = f"{scope}/{op_type}"
        count = self._counts.get(base, 0)
        self._counts[base] = count + 1
        name = base if count == 0 else f"{base}_{count}"
        output = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        return output

    def const(self, value, scope="", dtype=np.float32):
        """A Constant node, as torch emits for scalars and fixed shapes."""
        tensor = numpy_helper.from_array(np.array(value, dtype=dtype))
        return self.op("Constant", [], scope, value=tensor)

    def linear(self, x, prefix, n_in, n_out, out=None):
        """torch.nn.Linear on a 3-D or batched input: MatMul with W^T, then Add(bias, .)."""
        scope = "/" + prefix.replace(".", "/")
        w = self.param(self.fresh("onnx::MatMul"), (n_in, n_out), 1.0 / np.sqrt(n_in))
        b = self.param(f"{prefix}.bias", (n_out,), 0.1)
        return self.op("Add", [b, self.op("MatMul", [x, w], scope)], scope, out=out)

    def gemm(self, x, prefix, n_in, n_out, out=None):
        """torch.nn.Linear on a 2-D input: Gemm with transB=1 and the [out, in] weight."""
        w = self.param(f"{prefix}.weight", (n_out, n_in), 1.0 / np.sqrt(n_in))
        b = self.param(f"{prefix}.bias", (n_out,), 0.1)
        return self.op("Gemm", [x, w, b], "/" + prefix, out=out, alpha=1.0, beta=1.0, transB=1)

    def model(self, name, opset, ir_version):
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln-samples")
        model.ir_version = ir_version
        return model


def make_mlp():
    """MLP with a symbolic batch: MatMul/Add/Relu twice, then a Gemm head. Opset 13, IR 7."""
    b = Builder(seed=1001)
    x = b.input("input", TensorProto.FLOAT, ["batch", 16])
    h = b.op("Relu", [b.linear(x, "fc1", 16, 32)], "/relu")
    h = b.op("Relu", [b.linear(h, "fc2", 32, 32)], "/relu_1")
    b.gemm(h, "head", 32, 10, out="logits")
    b.output("logits", TensorProto.FLOAT, ["batch", 10])
    inputs = {"input": b.rng.standard_normal((2, 16), dtype=np.float32)}
    return b.model("mlp", 13, 7), inputs


def conv_bn_relu(b, x, prefix, c_in, c_out, relu=True):
    """Conv (no bias) + BatchNormalization (+ Relu), as exported from a model in eval mode."""
    scope = "/" + prefix
    w = b.param(f"{prefix}.conv.weight", (c_out, c_in, 3, 3), np.sqrt(2.0 / (c_in * 9)))
    y = b.op("Conv", [x, w], scope + "/conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             strides=[1, 1], dilations=[1, 1], group=1)
    bn = [b.uniform(f"{prefix}.bn.weight", (c_out,), 0.5, 1.5),
          b.param(f"{prefix}.bn.bias", (c_out,), 0.1),
          b.param(f"{prefix}.bn.running_mean", (c_out,), 0.1),
          b.uniform(f"{prefix}.bn.running_var", (c_out,), 0.5, 2.0)]
    y = b.op("BatchNormalization", [y] + bn, scope + "/bn", epsilon=1e-5, momentum=0.9)
    return b.op("Relu", [y], scope + "/relu") if relu else y


def make_cnn():
    """Small CNN on 1x3x32x32: Conv+BN+Relu, a residual block, MaxPool, GAP, Flatten, Gemm.
    Opset 15, IR 8."""
    b = Builder(seed=1002)
    x = b.input("input", TensorProto.FLOAT, [1, 3, 32, 32])
    stem = conv_bn_relu(b, x, "stem", 3, 8)
    y = conv_bn_relu(b, stem, "block.0", 8, 8)
    y = conv_bn_relu(b, y, "block.1", 8, 8, relu=False)
    y = b.op("Relu", [b.op("Add", [y, stem], "/block")], "/block/relu")
    y = b.op("MaxPool", [y], "/pool", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    w = b.param("conv2.weight", (16, 8, 3, 3), np.sqrt(2.0 / 72))
    y = b.op("Conv", [y, w, b.param("conv2.bias", (16,), 0.1)], "/conv2",
             kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    y = b.op("Relu", [y], "/relu")
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y], "/gap")], "/flatten", axis=1)
    b.gemm(y, "fc", 16, 10, out="logits")
    b.output("logits", TensorProto.FLOAT, [1, 10])
    inputs = {"input": b.rng.standard_normal((1, 3, 32, 32), dtype=np.float32)}
    return b.model("cnn", 15, 8), inputs


def make_transformer(seq=16, hidden=64, heads=4, ffn=256):
    """Pre-norm transformer encoder block: LayerNormalization, 4-head attention with
    Reshape/Transpose, Softmax, GELU written as the Erf pattern, two residual Adds.
    Opset 17 (the first with LayerNormalization), IR 8."""
    b = Builder(seed=1003)
    head_dim = hidden // heads
    x = b.input("hidden_states", TensorProto.FLOAT, [1, seq, hidden])

    def layer_norm(v, prefix):
        w = b.param(f"{prefix}.weight", (hidden,), 0.1, mean=1.0)
        bias = b.param(f"{prefix}.bias", (hidden,), 0.1)
        return b.op("LayerNormalization", [v, w, bias], "/" + prefix, axis=-1, epsilon=1e-5)

    def heads_of(v, scope, perm):
        shape = b.init(b.fresh("onnx::Reshape"), np.array([1, seq, heads, head_dim], np.int64))
        return b.op("Transpose", [b.op("Reshape", [v, shape], scope)], scope, perm=perm)

    h = layer_norm(x, "norm1")
    q = heads_of(b.linear(h, "attn.q", hidden, hidden), "/attn/q", [0, 2, 1, 3])
    k = heads_of(b.linear(h, "attn.k", hidden, hidden), "/attn/k", [0, 2, 3, 1])
    v = heads_of(b.linear(h, "attn.v", hidden, hidden), "/attn/v", [0, 2, 1, 3])
    scores = b.op("MatMul", [q, k], "/attn")
    scores = b.op("Div", [scores, b.const(np.sqrt(head_dim), "/attn")], "/attn")
    probs = b.op("Softmax", [scores], "/attn", axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v], "/attn")], "/attn", perm=[0, 2, 1, 3])
    merged = b.init(b.fresh("onnx::Reshape"), np.array([1, seq, hidden], np.int64))
    ctx = b.op("Reshape", [ctx, merged], "/attn")
    x = b.op("Add", [x, b.linear(ctx, "attn.proj", hidden, hidden)], "")

    h = b.linear(layer_norm(x, "norm2"), "mlp.fc1", hidden, ffn)
    gelu = b.op("Erf", [b.op("Div", [h, b.const(np.sqrt(2.0), "/mlp/act")], "/mlp/act")],
                "/mlp/act")
    gelu = b.op("Add", [gelu, b.const(1.0, "/mlp/act")], "/mlp/act")
    gelu = b.op("Mul", [b.op("Mul", [h, gelu], "/mlp/act"), b.const(0.5, "/mlp/act")], "/mlp/act")
    b.op("Add", [x, b.linear(gelu, "mlp.fc2", ffn, hidden)], "", out="output")
    b.output("output", TensorProto.FLOAT, [1, seq, hidden])
    inputs = {"hidden_states": b.rng.standard_normal((1, seq, hidden), dtype=np.float32)}
    return b.model("transformer", 17, 8), inputs


SAMPLES = {"mlp": make_mlp, "cnn": make_cnn, "transformer": make_transformer}


def write_sample(name, make, out_dir):
    """Writes one sample and returns False when onnxruntime disagrees with the reference."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    model, inputs = make()
    onnx.checker.check_model(model, full_check=True)
    model_bytes = model.SerializeToString()
    with open(os.path.join(out_dir, f"{name}.onnx"), "wb") as f:
        f.write(model_bytes)
    save_npz(os.path.join(out_dir, f"{name}.inputs.npz"), inputs)

    output_names = [o.name for o in model.graph.output]
    expected = ReferenceEvaluator(model).run(None, inputs)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    actual = session.run(output_names, inputs)

    expected_dir = os.path.join(out_dir, f"{name}.expected")
    os.makedirs(expected_dir, exist_ok=True)
    ok = True
    worst = 0.0
    for output_name, want, got in zip(output_names, expected, actual):
        np.save(os.path.join(expected_dir, encode_name(output_name) + ".npy"), want)
        diff = float(np.max(np.abs(want.astype(np.float64) - got)))
        worst = max(worst, diff)
        if not np.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
            print(f"{name}: output '{output_name}': onnxruntime differs from the reference "
                  f"evaluator by {diff:.3g} (tolerance {TOLERANCE})")
            ok = False
    size = len(model_bytes)
    print(f"{name}: {size} bytes, {len(model.graph.node)} nodes, outputs "
          + ", ".join(f"{n}{list(e.shape)}" for n, e in zip(output_names, expected))
          + f", onnxruntime max abs diff {worst:.2g}")
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=SAMPLES_DIR,
                        help="where to write the samples (default: the samples/ folder)")
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    ok = all([write_sample(name, make, args.out_dir) for name, make in SAMPLES.items()])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
