#!/usr/bin/env python3
"""Generates real-sized, exporter-shaped ONNX models for kiln's model tests.

    python tests/models/make_models.py [--out-dir DIR] [--only NAME ...] [--check] [--list]

Each model NAME gives DIR/NAME.onnx, DIR/NAME.inputs.npz (keys = graph input names) and the
onnxruntime outputs DIR/NAME.ort/<output name>.npy (see ort_reference.py). The models are made
at test time, not committed: weights are random but seeded, so every run writes the same bytes.

The graphs are laid out the way torch.onnx.export (TorchScript exporter, do_constant_folding on)
writes them for the original PyTorch models: '/scope/Op_1' node names, MatMul with a folded W^T
plus Add(bias, .) for nn.Linear on 3-D inputs, Gemm(transB=1) on 2-D inputs, Shape->Gather->
Unsqueeze->Concat->Reshape chains where an axis is dynamic and constant shapes where none is,
Constant nodes for scalars, and each model pins the opset and IR version its exporter used.
Choices worth knowing:
  - resnet50 keeps Conv and BatchNormalization separate (training=PRESERVE or tf2onnx style);
    mobilenetv2, efficientnet_b0, yolo and resnet_qdq have BatchNorm folded into the Conv bias
    (the default eval-mode export);
  - bert_base and gpt2 use opset 14, so LayerNorm is the decomposed ReduceMean/Sub/Pow/Sqrt/Div
    pattern; vit_s16 uses opset 17 and LayerNormalization; llama uses opset 18 (ReduceMean axes
    as an input);
  - gpt2 ties its LM head to the token embedding through a Transpose node (one initializer
    read by both Gather and Transpose), as an export without constant folding does.
Test tool only: needs onnx, onnxruntime and numpy (scripts/requirements.txt).
"""

import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ort_reference import run_reference, save_npz  # noqa: E402

DEFAULT_OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated")
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
F32_MIN = float(np.finfo(np.float32).min)
# He-style init gain for convs followed by SiLU and the SE gate: with the ReLU value 2
# EfficientNet's signal fades to ~0.05 by the classifier, from 3.5 on it blows up.
SILU_GAIN = 3.0


def module_scope(prefix):
    """torch's node scope for a module path: 'encoder.layer.0.attention' -> '/encoder/layer.0/
    attention' (a ModuleList index stays with its list's name)."""
    parts = []
    for part in prefix.split("."):
        if part.isdigit() and parts:
            parts[-1] += "." + part
        else:
            parts.append(part)
    return "".join("/" + p for p in parts if p)


class Builder:
    """Collects the nodes and initializers of one graph for a fixed opset and emits the op
    forms that opset requires (Unsqueeze axes as an input from 13, ReduceMean axes from 18)."""

    def __init__(self, opset, seed):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self._counts = {}
        self._next_id = 100

    # -- graph plumbing ---------------------------------------------------------------------
    def input(self, name, elem_type, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name, elem_type, shape):
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def fresh(self, prefix):
        """A torch-style name for a folded constant: 'onnx::MatMul_101'."""
        self._next_id += 1
        return f"{prefix}_{self._next_id}"

    def init(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def param(self, name, shape, std, mean=0.0):
        values = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        if mean:
            values += np.float32(mean)
        return self.init(name, values)

    def uniform(self, name, shape, low, high):
        return self.init(name, self.rng.uniform(low, high, shape).astype(np.float32))

    def op(self, op_type, inputs, scope="", out=None, n_out=1, **attrs):
        """Appends a node named '<scope>/<op_type>[_k]' and returns its output name(s)."""
        base = f"{scope}/{op_type}"
        count = self._counts.get(base, 0)
        self._counts[base] = count + 1
        name = base if count == 0 else f"{base}_{count}"
        outputs = [out] if out else [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def const(self, value, scope="", dtype=np.float32):
        """A Constant node, as torch emits for scalars and small shape pieces."""
        tensor = numpy_helper.from_array(np.array(value, dtype=dtype))
        return self.op("Constant", [], scope, value=tensor)

    def ints(self, values, scope=""):
        return self.const(values, scope, np.int64)

    def model(self, name, ir_version):
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="kiln-make-models", producer_version="1")
        model.ir_version = ir_version
        return model

    # -- opset-dependent forms --------------------------------------------------------------
    def unsqueeze(self, x, axes, scope):
        return self.op("Unsqueeze", [x, self.ints(axes, scope)], scope)

    def squeeze(self, x, axes, scope):
        return self.op("Squeeze", [x, self.ints(axes, scope)], scope)

    def reduce_mean(self, x, axes, scope):
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.ints(axes, scope)], scope, keepdims=1)
        return self.op("ReduceMean", [x], scope, axes=axes, keepdims=1)

    def split(self, x, sizes, axis, scope):
        sizes_name = self.ints(sizes, scope)
        return self.op("Split", [x, sizes_name], scope, n_out=len(sizes), axis=axis)

    # -- shape arithmetic as torch emits it for dynamic axes --------------------------------
    def dim(self, x, index, scope):
        """x.size(index) as a 1-D int64: Shape -> Gather(scalar) -> Unsqueeze."""
        shape = self.op("Shape", [x], scope)
        value = self.op("Gather", [shape, self.ints(index, scope)], scope, axis=0)
        return self.unsqueeze(value, [0], scope)

    def scalar_dim(self, x, index, scope):
        """x.size(index) as a 0-D int64 (for Range)."""
        shape = self.op("Shape", [x], scope)
        return self.op("Gather", [shape, self.ints(index, scope)], scope, axis=0)

    def shape_of(self, parts, scope):
        """Concat of 1-D pieces; Python ints become Constant nodes."""
        pieces = [p if isinstance(p, str) else self.ints([p], scope) for p in parts]
        return self.op("Concat", pieces, scope, axis=0)

    def reshape(self, x, parts, scope):
        return self.op("Reshape", [x, self.shape_of(parts, scope)], scope)

    def reshape_const(self, x, shape, scope):
        """Reshape to a shape torch folded into an initializer (all axes static)."""
        name = self.init(self.fresh("onnx::Reshape"), np.array(shape, np.int64))
        return self.op("Reshape", [x, name], scope)

    # -- layers -----------------------------------------------------------------------------
    def linear(self, x, prefix, n_in, n_out, bias=True, std=None):
        """nn.Linear on a 3-D input: MatMul with the folded W^T, then Add(bias, .)."""
        scope = module_scope(prefix)
        w = self.param(self.fresh("onnx::MatMul"), (n_in, n_out), std or 1.0 / np.sqrt(n_in))
        y = self.op("MatMul", [x, w], scope)
        if not bias:
            return y
        return self.op("Add", [self.param(f"{prefix}.bias", (n_out,), 0.02), y], scope)

    def gemm(self, x, prefix, n_in, n_out, out=None, gain=1.0):
        """nn.Linear on a 2-D input: Gemm(transB=1) with the [out, in] weight."""
        w = self.param(f"{prefix}.weight", (n_out, n_in), gain / np.sqrt(n_in))
        b = self.param(f"{prefix}.bias", (n_out,), 0.02)
        return self.op("Gemm", [x, w, b], module_scope(prefix), out=out,
                       alpha=1.0, beta=1.0, transB=1)

    def conv(self, x, prefix, c_in, c_out, k, stride=1, group=1, folded=False, gain=2.0,
             bias=None):
        """Conv2d with 'same' padding. folded=True: BatchNorm already folded in, so a bias and
        'onnx::Conv_N' names; otherwise '<prefix>.weight' and no bias unless asked."""
        fan_in = c_in // group * k * k
        if folded:
            w_name, b_name = self.fresh("onnx::Conv"), self.fresh("onnx::Conv")
        else:
            w_name, b_name = f"{prefix}.weight", f"{prefix}.bias"
        inputs = [x, self.param(w_name, (c_out, c_in // group, k, k), np.sqrt(gain / fan_in))]
        if folded or bias:
            inputs.append(self.param(b_name, (c_out,), 0.05))
        p = k // 2
        return self.op("Conv", inputs, module_scope(prefix), dilations=[1, 1], group=group,
                       kernel_shape=[k, k], pads=[p, p, p, p], strides=[stride, stride])

    def batch_norm(self, x, prefix, c, gamma=(0.5, 1.0)):
        params = [self.uniform(f"{prefix}.weight", (c,), *gamma),
                  self.param(f"{prefix}.bias", (c,), 0.1),
                  self.param(f"{prefix}.running_mean", (c,), 0.1),
                  self.uniform(f"{prefix}.running_var", (c,), 0.5, 1.5)]
        return self.op("BatchNormalization", [x] + params, module_scope(prefix),
                       epsilon=1e-5, momentum=0.9)

    def layer_norm(self, x, prefix, dim, eps, out=None):
        """LayerNormalization from opset 17; before that torch's decomposition."""
        scope = module_scope(prefix)
        w = self.param(f"{prefix}.weight", (dim,), 0.1, mean=1.0)
        b = self.param(f"{prefix}.bias", (dim,), 0.05)
        if self.opset >= 17:
            return self.op("LayerNormalization", [x, w, b], scope, out=out, axis=-1, epsilon=eps)
        mean = self.reduce_mean(x, [-1], scope)
        centered = self.op("Sub", [x, mean], scope)
        var = self.reduce_mean(self.op("Pow", [centered, self.const(2.0, scope)], scope), [-1],
                               scope)
        std = self.op("Sqrt", [self.op("Add", [var, self.const(eps, scope)], scope)], scope)
        y = self.op("Mul", [self.op("Div", [centered, std], scope), w], scope)
        return self.op("Add", [y, b], scope, out=out)

    def rms_norm(self, x, prefix, dim, eps):
        """LLaMA RMSNorm as exported: x * rsqrt(mean(x^2) + eps) * weight, rsqrt = 1 / Sqrt."""
        scope = module_scope(prefix)
        w = self.param(f"{prefix}.weight", (dim,), 0.1, mean=1.0)
        var = self.reduce_mean(self.op("Pow", [x, self.const(2.0, scope)], scope), [-1], scope)
        std = self.op("Sqrt", [self.op("Add", [var, self.const(eps, scope)], scope)], scope)
        inv = self.op("Div", [self.const(1.0, scope), std], scope)
        return self.op("Mul", [w, self.op("Mul", [x, inv], scope)], scope)

    def gelu_erf(self, x, scope):
        """Exact GELU: x * 0.5 * (1 + erf(x / sqrt(2)))."""
        e = self.op("Erf", [self.op("Div", [x, self.const(1.4142135381698608, scope)], scope)],
                    scope)
        e = self.op("Add", [e, self.const(1.0, scope)], scope)
        return self.op("Mul", [self.op("Mul", [x, e], scope), self.const(0.5, scope)], scope)

    def gelu_tanh(self, x, scope):
        """GPT-2's gelu_new: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
        half = self.op("Mul", [self.const(0.5, scope), x], scope)
        cube = self.op("Pow", [x, self.const(3.0, scope)], scope)
        inner = self.op("Add", [x, self.op("Mul", [self.const(0.044715, scope), cube], scope)],
                        scope)
        inner = self.op("Mul", [self.const(0.7978845608028654, scope), inner], scope)
        t = self.op("Add", [self.const(1.0, scope), self.op("Tanh", [inner], scope)], scope)
        return self.op("Mul", [half, t], scope)

    def silu(self, x, scope):
        """SiLU / Swish as torch exports it below opset 22: x * Sigmoid(x)."""
        return self.op("Mul", [x, self.op("Sigmoid", [x], scope)], scope)


# == convolutional classifiers ==============================================================

def classifier_head(b, x, prefix, channels, classes, out="output", gain=1.0):
    """Global average pool, flatten and the final Linear, as torchvision models export."""
    y = b.op("GlobalAveragePool", [x], "/avgpool")
    y = b.op("Flatten", [y], "", axis=1)
    return b.gemm(y, prefix, channels, classes, out=out, gain=gain)


def make_resnet50():
    """torchvision ResNet-50 v1.5, Conv and BatchNormalization kept apart, batch axis 'N'."""
    b = Builder(opset=17, seed=50)
    x = b.input("input", FLOAT, ["N", 3, 224, 224])
    y = b.op("Relu", [b.batch_norm(b.conv(x, "conv1", 3, 64, 7, 2), "bn1", 64)], "/relu")
    y = b.op("MaxPool", [y], "/maxpool", ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
             pads=[1, 1, 1, 1], strides=[2, 2])
    c_in = 64
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                     (512, 3, 2)], start=1):
        for i in range(blocks):
            p, s, c_out = f"layer{stage}.{i}", stride if i == 0 else 1, width * 4
            h = b.op("Relu", [b.batch_norm(b.conv(y, f"{p}.conv1", c_in, width, 1),
                                           f"{p}.bn1", width)], module_scope(p + ".relu"))
            h = b.op("Relu", [b.batch_norm(b.conv(h, f"{p}.conv2", width, width, 3, s),
                                           f"{p}.bn2", width)], module_scope(p + ".relu"))
            # A small last gamma keeps the residual stream bounded with random statistics.
            h = b.batch_norm(b.conv(h, f"{p}.conv3", width, c_out, 1), f"{p}.bn3", c_out,
                             gamma=(0.1, 0.3))
            if i == 0:
                y = b.batch_norm(b.conv(y, f"{p}.downsample.0", c_in, c_out, 1, s),
                                 f"{p}.downsample.1", c_out)
            y = b.op("Relu", [b.op("Add", [h, y], module_scope(p))], module_scope(p + ".relu"))
            c_in = c_out
    classifier_head(b, y, "fc", 2048, 1000)
    b.output("output", FLOAT, ["N", 1000])
    return b.model("resnet50", 8), {"input": image(b.rng, 224)}


def relu6(b, x, scope):
    """nn.ReLU6 as exported from opset 11: Clip with min and max as Constant inputs."""
    return b.op("Clip", [x, b.const(0.0, scope), b.const(6.0, scope)], scope)


def make_mobilenetv2():
    """torchvision MobileNetV2 (BatchNorm folded): depthwise convs by group, ReLU6 as Clip."""
    b = Builder(opset=13, seed=2)
    x = b.input("input", FLOAT, [1, 3, 224, 224])
    y = relu6(b, b.conv(x, "features.0.0", 3, 32, 3, 2, folded=True), "/features.0/features.0.2")
    c_in, index = 32, 1
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            p, stride, hidden = f"features.{index}.conv", s if i == 0 else 1, c_in * t
            h, layer = y, 0
            if t != 1:
                h = relu6(b, b.conv(h, f"{p}.0.0", c_in, hidden, 1, folded=True),
                          module_scope(f"{p}.0.2"))
                layer = 1
            h = b.conv(h, f"{p}.{layer}.0", hidden, hidden, 3, stride, group=hidden, folded=True)
            h = relu6(b, h, module_scope(f"{p}.{layer}.2"))
            h = b.conv(h, f"{p}.{layer + 1}", hidden, c, 1, folded=True, gain=0.5)
            if stride == 1 and c_in == c:
                h = b.op("Add", [y, h], module_scope(f"features.{index}"))
            y = h
            c_in, index = c, index + 1
    y = relu6(b, b.conv(y, "features.18.0", 320, 1280, 1, folded=True),
              "/features.18/features.18.2")
    classifier_head(b, y, "classifier.1", 1280, 1000)
    b.output("output", FLOAT, [1, 1000])
    return b.model("mobilenetv2", 7), {"input": image(b.rng, 224)}


def make_efficientnet_b0():
    """torchvision EfficientNet-B0 (BatchNorm folded): SiLU as x*Sigmoid(x), MBConv blocks
    with squeeze-excite (GlobalAveragePool, 1x1 Convs, Sigmoid, Mul)."""
    b = Builder(opset=15, seed=3)
    x = b.input("input", FLOAT, [1, 3, 224, 224])
    y = b.silu(b.conv(x, "features.0.0", 3, 32, 3, 2, folded=True), "/features.0/features.0.2")
    c_in = 32
    stages = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]
    for stage, (expand, k, s, c_out, layers) in enumerate(stages, start=1):
        for i in range(layers):
            p, stride, hidden = f"features.{stage}.{i}.block", s if i == 0 else 1, c_in * expand
            h, layer = y, 0
            if expand != 1:
                h = b.silu(b.conv(h, f"{p}.0.0", c_in, hidden, 1, folded=True, gain=SILU_GAIN),
                           module_scope(f"{p}.0.2"))
                layer = 1
            h = b.conv(h, f"{p}.{layer}.0", hidden, hidden, k, stride, group=hidden, folded=True,
                       gain=SILU_GAIN)
            h = b.silu(h, module_scope(f"{p}.{layer}.2"))
            se, squeeze = f"{p}.{layer + 1}", max(1, c_in // 4)
            scale = b.op("GlobalAveragePool", [h], module_scope(se + ".avgpool"))
            scale = b.silu(b.conv(scale, se + ".fc1", hidden, squeeze, 1, bias=True),
                           module_scope(se + ".activation"))
            scale = b.conv(scale, se + ".fc2", squeeze, hidden, 1, bias=True)
            scale = b.op("Sigmoid", [scale], module_scope(se + ".scale_activation"))
            h = b.op("Mul", [scale, h], module_scope(se))
            h = b.conv(h, f"{p}.{layer + 2}.0", hidden, c_out, 1, folded=True, gain=1.0)
            if stride == 1 and c_in == c_out:
                h = b.op("Add", [h, y], module_scope(f"features.{stage}.{i}"))
            y, c_in = h, c_out
    y = b.silu(b.conv(y, "features.8.0", 320, 1280, 1, folded=True, gain=SILU_GAIN),
               "/features.8/features.8.2")
    classifier_head(b, y, "classifier.1", 1280, 1000, gain=10.0)  # logits of order 1
    b.output("output", FLOAT, [1, 1000])
    return b.model("efficientnet_b0", 8), {"input": image(b.rng, 224)}


def basic_block(b, y, p, c_in, c_out, stride):
    """ResNet BasicBlock with BatchNorm folded (two 3x3 convs, 1x1 projection when needed)."""
    h = b.op("Relu", [b.conv(y, f"{p}.conv1", c_in, c_out, 3, stride, folded=True)],
             module_scope(p + ".relu"))
    h = b.conv(h, f"{p}.conv2", c_out, c_out, 3, folded=True, gain=0.5)
    if stride != 1 or c_in != c_out:
        y = b.conv(y, f"{p}.downsample.0", c_in, c_out, 1, stride, folded=True)
    return b.op("Relu", [b.op("Add", [h, y], module_scope(p))], module_scope(p + ".relu"))


def make_resnet_qdq(out_dir):
    """A reduced ResNet (3 BasicBlocks, 64x64 input) quantized to QDQ by onnxruntime's
    quantize_static: u8 activations, s8 per-channel weights, MinMax calibration on 8 seeded
    random images."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod,
                                          QuantFormat, QuantType, quantize_static)

    b = Builder(opset=13, seed=13)
    x = b.input("input", FLOAT, [1, 3, 64, 64])
    y = b.op("Relu", [b.conv(x, "conv1", 3, 16, 3, folded=True)], "/relu")
    for p, c_in, c_out, stride in [("layer1.0", 16, 16, 1), ("layer2.0", 16, 32, 2),
                                   ("layer3.0", 32, 64, 2)]:
        y = basic_block(b, y, p, c_in, c_out, stride)
    classifier_head(b, y, "fc", 64, 10)
    b.output("output", FLOAT, [1, 10])
    float_model = b.model("resnet_qdq", 7)
    inputs = {"input": image(b.rng, 64)}

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1313)
            self.batches = iter([{"input": image(rng, 64)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    # quantize_static warns through the root logger that pre-processing was not run; the
    # float model is already shape-inferable and has BatchNorm folded, so hush it.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        float_path, q_path = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "qdq.onnx")
        onnx.save_model(float_model, float_path)
        quantize_static(float_path, q_path, Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
        model = onnx.load(q_path)
    root.setLevel(level)
    return model, inputs


# == transformers ===========================================================================

def make_vit_s16():
    """timm ViT-S/16 (224x224, 12 blocks, hidden 384, 6 heads), static shapes so torch folded
    every shape: patch Conv, Reshape/Transpose, class token Concat, position Add,
    LayerNormalization, qkv Split/Squeeze, Softmax attention, GELU (Erf), class token Gather."""
    b = Builder(opset=17, seed=16)
    dim, heads, depth, mlp, tokens = 384, 6, 12, 1536, 197
    hd = dim // heads
    x = b.input("input", FLOAT, [1, 3, 224, 224])
    w = b.param("patch_embed.proj.weight", (dim, 3, 16, 16), np.sqrt(1.0 / 768))
    y = b.op("Conv", [x, w, b.param("patch_embed.proj.bias", (dim,), 0.02)],
             "/patch_embed/proj", dilations=[1, 1], group=1, kernel_shape=[16, 16],
             pads=[0, 0, 0, 0], strides=[16, 16])
    y = b.reshape_const(y, [1, dim, 196], "/patch_embed")
    y = b.op("Transpose", [y], "/patch_embed", perm=[0, 2, 1])
    cls = b.param("cls_token", (1, 1, dim), 0.02)
    y = b.op("Concat", [cls, y], "", axis=1)
    y = b.op("Add", [y, b.param("pos_embed", (1, tokens, dim), 0.02)], "")
    for i in range(depth):
        p = f"blocks.{i}"
        s = module_scope(p + ".attn")
        h = b.layer_norm(y, f"{p}.norm1", dim, 1e-6)
        qkv = b.linear(h, f"{p}.attn.qkv", dim, 3 * dim)
        qkv = b.reshape_const(qkv, [1, tokens, 3, heads, hd], s)
        qkv = b.op("Transpose", [qkv], s, perm=[2, 0, 3, 1, 4])
        q, k, v = (b.squeeze(t, [0], s) for t in b.split(qkv, [1, 1, 1], 0, s))
        attn = b.op("MatMul", [q, b.op("Transpose", [k], s, perm=[0, 1, 3, 2])], s)
        attn = b.op("Mul", [attn, b.const(hd ** -0.5, s)], s)
        attn = b.op("Softmax", [attn], s, axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [attn, v], s)], s, perm=[0, 2, 1, 3])
        ctx = b.reshape_const(ctx, [1, tokens, dim], s)
        y = b.op("Add", [y, b.linear(ctx, f"{p}.attn.proj", dim, dim)], module_scope(p))
        h = b.linear(b.layer_norm(y, f"{p}.norm2", dim, 1e-6), f"{p}.mlp.fc1", dim, mlp)
        h = b.linear(b.gelu_erf(h, module_scope(p + ".mlp.act")), f"{p}.mlp.fc2", mlp, dim)
        y = b.op("Add", [y, h], module_scope(p))
    y = b.layer_norm(y, "norm", dim, 1e-6)
    y = b.op("Gather", [y, b.ints(0, "")], "", axis=1)
    b.gemm(y, "head", dim, 1000, out="output")
    b.output("output", FLOAT, [1, 1000])
    return b.model("vit_s16", 8), {"input": image(b.rng, 224)}


def split_heads(b, x, heads, hd, scope, perm=(0, 2, 1, 3)):
    """x.view(x.size()[:-1] + (heads, hd)).permute(...) with a dynamic batch and sequence."""
    y = b.reshape(x, [b.dim(x, 0, scope), b.dim(x, 1, scope), heads, hd], scope)
    return b.op("Transpose", [y], scope, perm=list(perm))


def merge_heads(b, ctx, dim, scope):
    """context.permute(0, 2, 1, 3).view(batch, seq, dim) with dynamic axes."""
    ctx = b.op("Transpose", [ctx], scope, perm=[0, 2, 1, 3])
    return b.reshape(ctx, [b.dim(ctx, 0, scope), b.dim(ctx, 1, scope), dim], scope)


def make_bert_base(seq=128, vocab=30522):
    """HF BertModel (bert-base-uncased shape: 12 layers, hidden 768, 12 heads), exported at
    opset 14 with dynamic 'batch'/'sequence' axes and inputs input_ids + attention_mask.
    Token types and positions come from sliced constant buffers, as in the HF model."""
    b = Builder(opset=14, seed=768)
    dim, heads, layers, ffn = 768, 12, 12, 3072
    hd = dim // heads
    ids = b.input("input_ids", INT64, ["batch", "sequence"])
    mask = b.input("attention_mask", INT64, ["batch", "sequence"])
    s = "/embeddings"
    seq_len = b.dim(ids, 1, s)
    zero, one = b.ints([0], s), b.ints([1], s)
    pos_buffer = b.init("embeddings.position_ids", np.arange(512, dtype=np.int64)[None])
    position_ids = b.op("Slice", [pos_buffer, zero, seq_len, one, one], s)
    type_buffer = b.init("embeddings.token_type_ids", np.zeros((1, 512), np.int64))
    token_types = b.op("Slice", [type_buffer, zero, seq_len, one, one], s)
    token_types = b.op("Expand", [token_types, b.shape_of([b.dim(ids, 0, s), seq_len], s)], s)
    words = b.op("Gather", [b.param("embeddings.word_embeddings.weight", (vocab, dim), 0.02),
                            ids], "/embeddings/word_embeddings")
    types = b.op("Gather", [b.param("embeddings.token_type_embeddings.weight", (2, dim), 0.02),
                            token_types], "/embeddings/token_type_embeddings")
    y = b.op("Add", [words, types], s)
    positions = b.op("Gather", [b.param("embeddings.position_embeddings.weight", (512, dim),
                                        0.02), position_ids], "/embeddings/position_embeddings")
    y = b.layer_norm(b.op("Add", [y, positions], s), "embeddings.LayerNorm", dim, 1e-12)

    # extended_attention_mask = (1.0 - mask[:, None, None, :].to(float)) * finfo(float).min
    ext = b.unsqueeze(b.unsqueeze(mask, [1], ""), [2], "")
    ext = b.op("Cast", [ext], "", to=FLOAT)
    ext = b.op("Sub", [b.const(1.0, ""), ext], "")
    ext = b.op("Mul", [ext, b.const(F32_MIN, "")], "")

    for i in range(layers):
        p = f"encoder.layer.{i}"
        s = module_scope(p + ".attention.self")
        q = split_heads(b, b.linear(y, f"{p}.attention.self.query", dim, dim), heads, hd, s)
        k = split_heads(b, b.linear(y, f"{p}.attention.self.key", dim, dim), heads, hd, s,
                        perm=(0, 2, 3, 1))
        v = split_heads(b, b.linear(y, f"{p}.attention.self.value", dim, dim), heads, hd, s)
        scores = b.op("Div", [b.op("MatMul", [q, k], s), b.const(np.sqrt(hd), s)], s)
        probs = b.op("Softmax", [b.op("Add", [scores, ext], s)], s, axis=-1)
        ctx = merge_heads(b, b.op("MatMul", [probs, v], s), dim, s)
        h = b.linear(ctx, f"{p}.attention.output.dense", dim, dim)
        h = b.op("Add", [h, y], module_scope(p + ".attention.output"))
        y = b.layer_norm(h, f"{p}.attention.output.LayerNorm", dim, 1e-12)
        h = b.linear(y, f"{p}.intermediate.dense", dim, ffn)
        h = b.gelu_erf(h, module_scope(p + ".intermediate.intermediate_act_fn"))
        h = b.op("Add", [b.linear(h, f"{p}.output.dense", ffn, dim), y],
                 module_scope(p + ".output"))
        last = "last_hidden_state" if i == layers - 1 else None
        y = b.layer_norm(h, f"{p}.output.LayerNorm", dim, 1e-12, out=last)
    first = b.op("Gather", [y, b.ints(0, "/pooler")], "/pooler", axis=1)
    b.op("Tanh", [b.gemm(first, "pooler.dense", dim, dim)], "/pooler/activation",
         out="pooler_output")
    b.output("last_hidden_state", FLOAT, ["batch", "sequence", dim])
    b.output("pooler_output", FLOAT, ["batch", dim])
    attention = np.ones((1, seq), np.int64)
    attention[0, seq - 9:] = 0  # a padded tail, as a tokenizer with padding writes
    return b.model("bert_base", 8), {"input_ids": token_ids(b.rng, vocab, seq),
                                     "attention_mask": attention}


def conv1d(b, x, prefix, n_in, n_out):
    """HF GPT-2 Conv1D: addmm(bias, x.view(-1, n_in), W), viewed back to
    x.size()[:-1] + (n_out,)."""
    s = module_scope(prefix)
    size_out = b.shape_of([b.dim(x, 0, s), b.dim(x, 1, s), n_out], s)
    flat = b.reshape_const(x, [-1, n_in], s)
    w = b.param(f"{prefix}.weight", (n_in, n_out), 1.0 / np.sqrt(n_in))
    y = b.op("Gemm", [flat, w, b.param(f"{prefix}.bias", (n_out,), 0.02)], s, alpha=1.0,
             beta=1.0)
    return b.op("Reshape", [y, size_out], s)


def make_gpt2(seq=32, vocab=50257):
    """HF GPT2LMHeadModel with 2 blocks (hidden 768, 12 heads), opset 14, dynamic axes:
    Range/Gather positions, Conv1D as Gemm, Split of the fused QKV, causal mask from Trilu
    and Where, GELU tanh pattern, LM head tied to the token embedding."""
    b = Builder(opset=14, seed=2019)
    dim, heads, layers = 768, 12, 2
    hd = dim // heads
    ids = b.input("input_ids", INT64, ["batch", "sequence"])
    seq_scalar = b.scalar_dim(ids, 1, "")
    positions = b.op("Range", [b.const(0, "", np.int64), seq_scalar, b.const(1, "", np.int64)], "")
    positions = b.unsqueeze(positions, [0], "")
    wte = b.param("transformer.wte.weight", (vocab, dim), 0.02)
    y = b.op("Add", [b.op("Gather", [wte, ids], "/transformer/wte"),
                     b.op("Gather", [b.param("transformer.wpe.weight", (1024, dim), 0.01),
                                     positions], "/transformer/wpe")], "/transformer")

    # Causal mask, lower triangle of ones: [1, 1, seq, seq] bool.
    s = "/transformer"
    seq_len = b.dim(ids, 1, s)
    ones = b.op("ConstantOfShape", [b.shape_of([seq_len, seq_len], s)], s,
                value=numpy_helper.from_array(np.array([1], np.int64)))
    causal = b.op("Cast", [b.op("Trilu", [ones], s, upper=0)], s, to=TensorProto.BOOL)
    causal = b.unsqueeze(causal, [0, 1], s)

    for i in range(layers):
        p = f"transformer.h.{i}"
        s = module_scope(p + ".attn")
        h = b.layer_norm(y, f"{p}.ln_1", dim, 1e-5)
        q, k, v = b.split(conv1d(b, h, f"{p}.attn.c_attn", dim, 3 * dim), [dim] * 3, 2, s)
        q, v = split_heads(b, q, heads, hd, s), split_heads(b, v, heads, hd, s)
        k = split_heads(b, k, heads, hd, s, perm=(0, 2, 3, 1))
        w = b.op("Div", [b.op("MatMul", [q, k], s), b.const(np.sqrt(hd), s)], s)
        w = b.op("Where", [causal, w, b.const(F32_MIN, s)], s)
        w = b.op("Softmax", [w], s, axis=-1)
        ctx = merge_heads(b, b.op("MatMul", [w, v], s), dim, s)
        y = b.op("Add", [conv1d(b, ctx, f"{p}.attn.c_proj", dim, dim), y], module_scope(p))
        h = conv1d(b, b.layer_norm(y, f"{p}.ln_2", dim, 1e-5), f"{p}.mlp.c_fc", dim, 4 * dim)
        h = b.gelu_tanh(h, module_scope(p + ".mlp.act"))
        y = b.op("Add", [y, conv1d(b, h, f"{p}.mlp.c_proj", 4 * dim, dim)], module_scope(p))
    y = b.layer_norm(y, "transformer.ln_f", dim, 1e-5)
    head = b.op("Transpose", [wte], "/lm_head", perm=[1, 0])
    b.op("MatMul", [y, head], "/lm_head", out="logits")
    b.output("logits", FLOAT, ["batch", "sequence", vocab])
    return b.model("gpt2", 8), {"input_ids": token_ids(b.rng, vocab, seq)}


def rotate_half(b, x, hd, scope):
    """cat((-x[..., hd/2:], x[..., :hd/2]), -1): Slice, Slice, Neg, Concat."""
    axes, step = b.ints([3], scope), b.ints([1], scope)
    x1 = b.op("Slice", [x, b.ints([0], scope), b.ints([hd // 2], scope), axes, step], scope)
    x2 = b.op("Slice", [x, b.ints([hd // 2], scope), b.ints([np.iinfo(np.int64).max], scope),
                        axes, step], scope)
    return b.op("Concat", [b.op("Neg", [x2], scope), x1], scope, axis=-1)


def make_llama(seq=32, vocab=32000, max_pos=2048):
    """A LLaMA-style decoder (2 layers, hidden 512, 8 query heads and 2 kv heads of 64, SwiGLU
    MLP of 1408) exported at opset 18: decomposed RMSNorm, RoPE from cos/sin tables with the
    rotate-half pattern, grouped-query attention repeating kv by Unsqueeze/Expand/Reshape,
    an additive causal mask from Range/Less/Where, SiLU as x*Sigmoid(x)."""
    b = Builder(opset=18, seed=7)
    dim, heads, kv_heads, layers, ffn = 512, 8, 2, 2, 1408
    hd, rep = dim // heads, heads // kv_heads
    ids = b.input("input_ids", INT64, ["batch", "sequence"])
    y = b.op("Gather", [b.param("model.embed_tokens.weight", (vocab, dim), 1.0), ids],
             "/model/embed_tokens")
    s = "/model"
    seq_scalar = b.scalar_dim(ids, 1, s)
    seq_len = b.dim(ids, 1, s)
    positions = b.op("Range", [b.const(0, s, np.int64), seq_scalar, b.const(1, s, np.int64)], s)
    position_ids = b.unsqueeze(positions, [0], s)
    future = b.op("Less", [b.unsqueeze(positions, [1], s), positions], s)
    mask = b.op("Where", [future, b.const(F32_MIN, s), b.const(0.0, s)], s)
    mask = b.unsqueeze(mask, [0, 1], s)

    # Rotary tables cos_cached/sin_cached[:seq_len][position_ids], shaped [batch, 1, seq, hd].
    s = "/model/rotary_emb"
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    freqs = np.outer(np.arange(max_pos, dtype=np.float64), inv_freq)
    angles = np.concatenate([freqs, freqs], axis=-1)
    tables = []
    for fn, name in [(np.cos, "cos_cached"), (np.sin, "sin_cached")]:
        table = b.init(f"model.rotary_emb.{name}", fn(angles).astype(np.float32))
        table = b.op("Slice", [table, b.ints([0], s), seq_len, b.ints([0], s)], s)
        tables.append(b.unsqueeze(b.op("Gather", [table, position_ids], s, axis=0), [1], s))
    cos, sin = tables

    for i in range(layers):
        p = f"model.layers.{i}"
        s = module_scope(p + ".self_attn")
        h = b.rms_norm(y, f"{p}.input_layernorm", dim, 1e-6)
        q = split_heads(b, b.linear(h, f"{p}.self_attn.q_proj", dim, dim, bias=False), heads,
                        hd, s)
        k = split_heads(b, b.linear(h, f"{p}.self_attn.k_proj", dim, kv_heads * hd, bias=False),
                        kv_heads, hd, s)
        v = split_heads(b, b.linear(h, f"{p}.self_attn.v_proj", dim, kv_heads * hd, bias=False),
                        kv_heads, hd, s)
        q, k = (b.op("Add", [b.op("Mul", [t, cos], s),
                             b.op("Mul", [rotate_half(b, t, hd, s), sin], s)], s) for t in (q, k))
        repeated = []
        for t in (k, v):  # repeat_kv: [b, kv, s, hd] -> [b, kv, rep, s, hd] -> [b, heads, s, hd]
            batch, kv_seq = b.dim(t, 0, s), b.dim(t, 2, s)
            t = b.op("Expand", [b.unsqueeze(t, [2], s),
                                b.shape_of([batch, kv_heads, rep, kv_seq, hd], s)], s)
            repeated.append(b.reshape(t, [batch, heads, kv_seq, hd], s))
        k, v = repeated
        w = b.op("MatMul", [q, b.op("Transpose", [k], s, perm=[0, 1, 3, 2])], s)
        w = b.op("Add", [b.op("Div", [w, b.const(np.sqrt(hd), s)], s), mask], s)
        w = b.op("Softmax", [w], s, axis=-1)
        ctx = merge_heads(b, b.op("MatMul", [w, v], s), dim, s)
        o = b.linear(ctx, f"{p}.self_attn.o_proj", dim, dim, bias=False)
        y = b.op("Add", [y, o], module_scope(p))
        h = b.rms_norm(y, f"{p}.post_attention_layernorm", dim, 1e-6)
        gate = b.linear(h, f"{p}.mlp.gate_proj", dim, ffn, bias=False)
        up = b.linear(h, f"{p}.mlp.up_proj", dim, ffn, bias=False)
        h = b.op("Mul", [b.silu(gate, module_scope(p + ".mlp.act_fn")), up],
                 module_scope(p + ".mlp"))
        y = b.op("Add", [y, b.linear(h, f"{p}.mlp.down_proj", ffn, dim, bias=False)],
                 module_scope(p))
    y = b.rms_norm(y, "model.norm", dim, 1e-6)
    w = b.param(b.fresh("onnx::MatMul"), (dim, vocab), 1.0 / np.sqrt(dim))
    b.op("MatMul", [y, w], "/lm_head", out="logits")
    b.output("logits", FLOAT, ["batch", "sequence", vocab])
    return b.model("llama", 9), {"input_ids": token_ids(b.rng, vocab, seq)}


# == detector ===============================================================================

def conv_silu(b, x, prefix, c_in, c_out, k=1, stride=1):
    """Ultralytics Conv after fuse(): Conv with bias, then SiLU."""
    return b.silu(b.conv(x, prefix + ".conv", c_in, c_out, k, stride, folded=True),
                  module_scope(prefix + ".act"))


def c2f(b, x, prefix, c_in, c_out, n, shortcut):
    """YOLOv8 C2f: 1x1 conv, Split in two, n bottlenecks on the second half, Concat, 1x1."""
    c = c_out // 2
    parts = b.split(conv_silu(b, x, prefix + ".cv1", c_in, 2 * c), [c, c], 1,
                    module_scope(prefix))
    for i in range(n):
        m = f"{prefix}.m.{i}"
        h = conv_silu(b, conv_silu(b, parts[-1], m + ".cv1", c, c, 3), m + ".cv2", c, c, 3)
        parts.append(b.op("Add", [parts[-1], h], module_scope(m)) if shortcut else h)
    y = b.op("Concat", parts, module_scope(prefix), axis=1)
    return conv_silu(b, y, prefix + ".cv2", (2 + n) * c, c_out)


def sppf(b, x, prefix, c):
    """SPPF: 1x1 conv, three chained 5x5 MaxPools, Concat, 1x1 conv."""
    y = conv_silu(b, x, prefix + ".cv1", c, c // 2)
    pools = [y]
    for _ in range(3):
        pools.append(b.op("MaxPool", [pools[-1]], module_scope(prefix + ".m"), ceil_mode=0,
                          dilations=[1, 1], kernel_shape=[5, 5], pads=[2, 2, 2, 2],
                          strides=[1, 1]))
    return conv_silu(b, b.op("Concat", pools, module_scope(prefix), axis=1), prefix + ".cv2",
                     2 * c, c)


def upsample(b, x, prefix):
    """nn.Upsample(scale_factor=2, mode='nearest') at opset 13+: Resize with empty roi."""
    s = module_scope(prefix)
    scales = b.init(b.fresh("onnx::Resize"), np.array([1, 1, 2, 2], np.float32))
    return b.op("Resize", [x, "", scales], s, coordinate_transformation_mode="asymmetric",
                cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")


def make_yolo(size=320, classes=80):
    """A YOLO-style detector at 320x320, 'n' widths: YOLOv8 backbone and PAN neck (C2f with
    Split, SPPF, nearest Resize upsampling, Concat), SiLU everywhere, and a YOLOv5 anchor head
    (Reshape/Transpose/Sigmoid, Split of xy/wh/conf, grid and anchor decode, Concat)."""
    b = Builder(opset=17, seed=5)
    x = b.input("images", FLOAT, [1, 3, size, size])
    y = conv_silu(b, x, "model.0", 3, 16, 3, 2)
    y = c2f(b, conv_silu(b, y, "model.1", 16, 32, 3, 2), "model.2", 32, 32, 1, True)
    p3 = c2f(b, conv_silu(b, y, "model.3", 32, 64, 3, 2), "model.4", 64, 64, 2, True)
    p4 = c2f(b, conv_silu(b, p3, "model.5", 64, 128, 3, 2), "model.6", 128, 128, 2, True)
    y = c2f(b, conv_silu(b, p4, "model.7", 128, 256, 3, 2), "model.8", 256, 256, 1, True)
    p5 = sppf(b, y, "model.9", 256)
    y = b.op("Concat", [upsample(b, p5, "model.10"), p4], "/model.11", axis=1)
    n4 = c2f(b, y, "model.12", 384, 128, 1, False)
    y = b.op("Concat", [upsample(b, n4, "model.13"), p3], "/model.14", axis=1)
    out3 = c2f(b, y, "model.15", 192, 64, 1, False)
    y = b.op("Concat", [conv_silu(b, out3, "model.16", 64, 64, 3, 2), n4], "/model.17", axis=1)
    out4 = c2f(b, y, "model.18", 192, 128, 1, False)
    y = b.op("Concat", [conv_silu(b, out4, "model.19", 128, 128, 3, 2), p5], "/model.20", axis=1)
    out5 = c2f(b, y, "model.21", 384, 256, 1, False)

    anchors = [[(10, 13), (16, 30), (33, 23)], [(30, 61), (62, 45), (59, 119)],
               [(116, 90), (156, 198), (373, 326)]]
    no, s = classes + 5, "/model.22"
    detections = []
    for i, (feature, c, stride) in enumerate([(out3, 64, 8), (out4, 128, 16), (out5, 256, 32)]):
        n = size // stride
        y = b.conv(feature, f"model.22.m.{i}", c, 3 * no, 1, bias=True, gain=1.0)
        y = b.reshape_const(y, [1, 3, no, n, n], s)
        y = b.op("Sigmoid", [b.op("Transpose", [y], s, perm=[0, 1, 3, 4, 2])], s)
        xy, wh, conf = b.split(y, [2, 2, no - 4], 4, s)
        gy, gx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grid = np.broadcast_to(np.stack([gx, gy], -1)[None, None], (1, 3, n, n, 2)) - 0.5
        anchor_grid = np.broadcast_to(np.array(anchors[i], np.float32)[None, :, None, None],
                                      (1, 3, n, n, 2))
        xy = b.op("Mul", [xy, b.const(2.0, s)], s)
        xy = b.op("Add", [xy, b.init(b.fresh("onnx::Add"), grid.astype(np.float32))], s)
        xy = b.op("Mul", [xy, b.const(float(stride), s)], s)
        wh = b.op("Pow", [b.op("Mul", [wh, b.const(2.0, s)], s), b.const(2.0, s)], s)
        wh = b.op("Mul", [wh, b.init(b.fresh("onnx::Mul"), anchor_grid.astype(np.float32))], s)
        y = b.op("Concat", [xy, wh, conf], s, axis=4)
        detections.append(b.reshape_const(y, [1, 3 * n * n, no], s))
    b.op("Concat", detections, s, out="output0", axis=1)
    boxes = 3 * sum((size // st) ** 2 for st in (8, 16, 32))
    b.output("output0", FLOAT, [1, boxes, no])
    images = b.rng.uniform(0.0, 1.0, (1, 3, size, size)).astype(np.float32)
    return b.model("yolo", 8), {"images": images}


# == inputs and driver ======================================================================

def image(rng, size):
    return rng.standard_normal((1, 3, size, size), dtype=np.float32)


def token_ids(rng, vocab, seq):
    return rng.integers(0, vocab, (1, seq), dtype=np.int64)


MODELS = {
    "resnet50": make_resnet50,
    "mobilenetv2": make_mobilenetv2,
    "efficientnet_b0": make_efficientnet_b0,
    "vit_s16": make_vit_s16,
    "bert_base": make_bert_base,
    "gpt2": make_gpt2,
    "llama": make_llama,
    "yolo": make_yolo,
    "resnet_qdq": make_resnet_qdq,
}


def generate(name, out_dir, check):
    """Writes NAME.onnx, NAME.inputs.npz and NAME.ort/ and prints sizes and times."""
    start = time.perf_counter()
    make = MODELS[name]
    model, inputs = make(out_dir) if name == "resnet_qdq" else make()
    model_path = os.path.join(out_dir, f"{name}.onnx")
    onnx.save_model(model, model_path)
    nodes = len(model.graph.node)
    del model
    save_npz(os.path.join(out_dir, f"{name}.inputs.npz"), inputs)
    generated = time.perf_counter()
    if check:
        onnx.checker.check_model(model_path, full_check=True)
    checked = time.perf_counter()
    _, load_s, run_s = run_reference(model_path, inputs, os.path.join(out_dir, f"{name}.ort"))
    size_mb = os.path.getsize(model_path) / 1e6
    print(f"{name:16s} {size_mb:8.1f} MB {nodes:5d} nodes  generate {generated - start:5.2f} s"
          + (f"  check {checked - generated:5.2f} s" if check else "")
          + f"  ort session {load_s:5.2f} s  run {run_s:5.2f} s", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=DEFAULT_OUT_DIR,
                        help="output folder (default: tests/models/generated)")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(MODELS),
                        help="generate just these models")
    parser.add_argument("--check", action="store_true",
                        help="also run onnx.checker.check_model(full_check=True) on each model")
    parser.add_argument("--list", action="store_true", help="print the model names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(MODELS))
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    start = time.perf_counter()
    for name in args.only or MODELS:
        generate(name, args.out_dir, args.check)
    print(f"total {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
