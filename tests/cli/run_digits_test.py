#!/usr/bin/env python3
"""kiln quant keeps a small CNN's accuracy: a CNN trained here, in numpy, on scikit-learn's bundled
digits set (8x8 images, 10 classes), exported to ONNX, quantized by `kiln quant` with each
built-in quantizer (calibrated on 256 training images), and compiled to int8 kernels, must keep
its top-1 accuracy on the held-out split within 0.5 points of the fp32 model's.

    run_digits_test.py --kiln PATH [--keep DIR]

Deterministic: fixed seeds, fixed split. Test tool only (numpy, onnx, scikit-learn).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

CHANNELS = 16
MAX_DROP_POINTS = 0.5


def im2col(x):
    """[N, 8, 8] -> [N, 64, 9]: each output pixel's 3x3 window, zero-padded by 1."""
    p = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    return np.stack([p[:, i:i + 8, j:j + 8] for i in range(3) for j in range(3)], axis=-1).reshape(len(x), 64, 9)


def forward(params, x):
    w, b, wf, bf = params
    cols = im2col(x)
    z = cols @ w.T + b  # [N, 64, C]
    a = np.maximum(z, 0)
    a6 = a.reshape(len(x), 4, 2, 4, 2, CHANNELS)
    m = a6.max(axis=(2, 4))  # [N, 4, 4, C]
    f = m.transpose(0, 3, 1, 2).reshape(len(x), -1)  # ONNX Flatten of NCHW
    return cols, z, a6, m, f, f @ wf.T + bf


def train(x, y, seed=0, epochs=30, batch=64, lr=0.01):
    """Conv 3x3 (16) + Relu + MaxPool 2 + Flatten + Gemm (10), Adam on cross-entropy."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal((CHANNELS, 9)) * np.sqrt(2 / 9), np.zeros(CHANNELS),
              rng.standard_normal((10, 16 * CHANNELS)) * np.sqrt(1 / (16 * CHANNELS)), np.zeros(10)]
    moments = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for s in range(0, len(x), batch):
            idx = order[s:s + batch]
            xb, yb, n = x[idx], y[idx], len(idx)
            cols, z, a6, m, f, logits = forward(params, xb)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(n), yb] -= 1
            dlogits = p / n
            dwf, dbf = dlogits.T @ f, dlogits.sum(axis=0)
            dm = (dlogits @ params[2]).reshape(n, CHANNELS, 4, 4).transpose(0, 2, 3, 1)
            mask = a6 == m[:, :, None, :, None, :]
            da = (mask * dm[:, :, None, :, None, :]).reshape(n, 64, CHANNELS)
            dz = da * (z > 0)
            dw, db = dz.reshape(-1, CHANNELS).T @ cols.reshape(-1, 9), dz.sum(axis=(0, 1))
            step += 1
            for k, g in enumerate((dw, db, dwf, dbf)):
                moments[k][0] = 0.9 * moments[k][0] + 0.1 * g
                moments[k][1] = 0.999 * moments[k][1] + 0.001 * g * g
                mh, vh = moments[k][0] / (1 - 0.9 ** step), moments[k][1] / (1 - 0.999 ** step)
                params[k] -= lr * mh / (np.sqrt(vh) + 1e-8)
    return [p.astype(np.float32) for p in params]


def to_onnx(params, path):
    w, b, wf, bf = params
    nodes = [helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="/relu/Relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="/pool/MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="/flatten/Flatten"),
             helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm", transB=1)]
    inits = [numpy_helper.from_array(w.reshape(CHANNELS, 1, 3, 3), "conv.weight"), numpy_helper.from_array(b, "conv.bias"),
             numpy_helper.from_array(wf, "fc.weight"), numpy_helper.from_array(bf, "fc.bias")]
    graph = helper.make_graph(nodes, "digits", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def kiln_run(kiln, args, cwd):
    proc = subprocess.run([kiln] + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"FAILED: kiln {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[:400]}")
    return proc.stderr


def accuracy(kiln, model, cwd, labels, tag):
    out = os.path.join(cwd, f"out_{tag}")
    kiln_run(kiln, ["run", model, "--inputs", "test.npz", "--output-dir", out], cwd)
    return 100.0 * float(np.mean(np.load(os.path.join(out, "logits.npy")).argmax(axis=1) == labels))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--keep", help="work in this folder and keep it")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    digits = load_digits()
    x = ((digits.images / 16.0 - 0.5) / 0.5).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0,
                                                        stratify=digits.target)
    params = train(x_train, y_train)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        to_onnx(params, os.path.join(work, "digits.onnx"))
        np.savez(os.path.join(work, "calib.npz"), input=x_train[:256, None])
        np.savez(os.path.join(work, "test.npz"), input=x_test[:, None])
        kiln_run(kiln, ["export", "digits.onnx", "-o", "digits.kiln"], work)
        fp32 = accuracy(kiln, "digits.kiln", work, y_test, "fp32")
        print(f"fp32: top-1 {fp32:.2f}% on {len(y_test)} held-out images")
        failed = fp32 < 90  # the network trained
        for q in ("x86", "xnnpack"):
            kiln_run(kiln, ["quant", "digits.kiln", "-o", f"digits.{q}.kiln", "--quantizer", q, "--calib", "calib.npz"], work)
            err = kiln_run(kiln, ["compile", f"digits.{q}.kiln", "-o", f"digits.{q}.c.kiln", "--input-shape",
                                  f"input={len(y_test)}x1x8x8", "-v"], work)
            # A CPU without VNNI keeps the products f32 between their Q and DQ (lower_int8).
            vnni = "avx512-vnni" in err.split("target cpu (", 1)[-1].split(")", 1)[0].split()
            lowered = ("lowered 1 convolution to QFusedConv, 1 linear layer to QFusedMatMul, 0 adds to QAdd and 1 max pool to int8" in err
                       if vnni else "kept 2 convolutions and linear layers f32 (int8 products need avx512-vnni" in err)
            simulated = accuracy(kiln, f"digits.{q}.kiln", work, y_test, q)
            int8 = accuracy(kiln, f"digits.{q}.c.kiln", work, y_test, q + "_int8")
            ok = lowered and fp32 - simulated <= MAX_DROP_POINTS and fp32 - int8 <= MAX_DROP_POINTS
            kernels = "int8 kernels" if vnni else "f32 products (the CPU lacks VNNI)"
            print(f"{q}: top-1 {simulated:.2f}% quantized, {int8:.2f}% compiled to {kernels} "
                  f"({'lowered' if lowered else 'NOT lowered'}); {'ok' if ok else 'FAILED'}")
            failed = failed or not ok
    if failed:
        sys.exit(f"FAILED: the quantized models must stay within {MAX_DROP_POINTS} points of fp32's top-1")
    print("passed")


if __name__ == "__main__":
    main()
