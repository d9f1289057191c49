#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), the same
bytes every time:
  fuzz_onnx_export  the samples, ~30 ONNX node conformance models (control flow, shapes,
                    quantization, resampling) and hand-made edge cases
  fuzz_kiln_load    those models exported by kiln (needs --kiln), plus a truncated one and the
                    compiled MLP and CNN samples (their kernels and packed weights' layouts
                    are this machine's)
  fuzz_npy          tests/data/npy and numpy-made edge cases
  fuzz_npz          sample inputs and numpy-made archives (stored, deflated, empty, nested names)
  fuzz_run          one seed per model of fuzz_run.cc with small shapes and plain values
Run: .venv/bin/python tests/fuzz/make_corpus.py --kiln build/kiln
"""
import argparse
import glob
import hashlib
import io
import os
import shutil
import subprocess
import tempfile
import zipfile

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NODE = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
MAX_SEED = 64 * 1024  # larger seeds slow every execution down

CONFORMANCE = [
    "test_loop11", "test_loop13_seq", "test_if", "test_scan9_sum", "test_range_float_type_positive_delta_expanded",
    "test_reshape_negative_dim", "test_expand_dim_changed", "test_slice_neg_steps", "test_pad", "test_edge_pad",
    "test_tile", "test_gather_elements_0", "test_scatter_elements_with_axis", "test_nonzero_example", "test_unique_sorted_with_axis",
    "test_topk", "test_onehot_with_axis", "test_constantofshape_int_zeros", "test_resize_upsample_scales_linear",
    "test_gridsample_bicubic", "test_center_crop_pad_crop_and_pad", "test_blackmanwindow", "test_maxunpool_export_with_output_shape",
    "test_col2im", "test_gru_defaults", "test_lstm_defaults", "test_dft", "test_quantizelinear", "test_dequantizelinear",
    "test_qlinearconv", "test_convinteger_with_padding", "test_einsum_batch_matmul", "test_depthtospace_crd_mode",
    "test_flatten_axis3", "test_concat_3d_axis_negative_1", "test_split_variable_parts_1d_opset18", "test_attention_3d",
]


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if len(data) <= MAX_SEED:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def onnx_bytes(nodes, inputs, outputs, inits=(), opset=18):
    g = h.make_graph(nodes, "edge", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8).SerializeToString()


def onnx_seeds():
    seeds = {}
    for f in sorted(glob.glob(os.path.join(ROOT, "samples", "*.onnx"))):
        seeds["sample_" + os.path.basename(f)] = open(f, "rb").read()
    for case in CONFORMANCE:
        path = os.path.join(NODE, case, "model.onnx")
        if os.path.exists(path):
            seeds[case + ".onnx"] = open(path, "rb").read()
    vi, F, I64 = h.make_tensor_value_info, T.FLOAT, T.INT64
    seeds["edge_symbolic_reshape.onnx"] = onnx_bytes(
        [h.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", F, ["n", 1 << 40, 4]), vi("s", I64, [3])], [vi("y", F, None)])
    seeds["edge_negative_pads.onnx"] = onnx_bytes(
        [h.make_node("Pad", ["x", "p"], ["y"], mode="edge")], [vi("x", F, [1, 1, 4, 4])], [vi("y", F, None)],
        [nh.from_array(np.array([0, 0, 0, -1, 0, 0, 0, 0], np.int64), "p")])
    seeds["edge_no_inputs.onnx"] = onnx_bytes([h.make_node("CastLike", [], ["y"])], [vi("x", F, [2])], [vi("y", F, None)])
    seeds["edge_window.onnx"] = onnx_bytes([h.make_node("HammingWindow", ["n"], ["y"])], [vi("n", I64, [])], [vi("y", F, None)])
    return seeds


def npy(a):
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


def npz(arrays, compressed=False):
    b = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(b, **arrays)
    return b.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kiln", required=True)
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)

    seeds = onnx_seeds()
    work = tempfile.mkdtemp()
    try:
        for name, data in seeds.items():
            write("fuzz_onnx_export", name, data)
            src = os.path.join(work, "m.onnx")
            with open(src, "wb") as f:
                f.write(data)
            out = os.path.join(work, "m.kiln")
            if subprocess.run([kiln, "export", src, "-o", out], capture_output=True).returncode == 0:
                kb = open(out, "rb").read()
                write("fuzz_kiln_load", name.replace(".onnx", ".kiln"), kb)
                if name == "sample_mlp.onnx":
                    write("fuzz_kiln_load", "truncated_mlp.kiln", kb[: len(kb) // 2])
                if name in ("sample_mlp.onnx", "sample_cnn.onnx"):
                    # Compiled: kernel choices, target, memory plan and packed weights.
                    compiled = os.path.join(work, "m.c.kiln")
                    subprocess.run([kiln, "compile", out, "-o", compiled], check=True, capture_output=True)
                    write("fuzz_kiln_load", name.replace("sample_", "compiled_").replace(".onnx", ".kiln"),
                          open(compiled, "rb").read())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for f in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "npy", "*"))):
        write("fuzz_npz" if f.endswith(".npz") else "fuzz_npy", os.path.basename(f), open(f, "rb").read())
    rng = np.random.default_rng(0)
    write("fuzz_npy", "scalar_bool.npy", npy(np.array(True)))
    write("fuzz_npy", "f32_2x3x4.npy", npy(rng.standard_normal((2, 3, 4)).astype(np.float32)))
    write("fuzz_npy", "nan_inf.npy", npy(np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)))
    write("fuzz_npy", "i64_extremes.npy", npy(np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max])))
    write("fuzz_npy", "empty_rank4.npy", npy(np.zeros((0, 2, 0, 3), np.float16)))
    for f in sorted(glob.glob(os.path.join(ROOT, "samples", "*.npz"))):
        write("fuzz_npz", "sample_" + os.path.basename(f), open(f, "rb").read())
    write("fuzz_npz", "two_members.npz", npz({"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.ones(3, np.float32)}))
    write("fuzz_npz", "compressed.npz", npz({"x": rng.standard_normal(64).astype(np.float32)}, compressed=True))
    write("fuzz_npz", "empty_archive.npz", npz({}))
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("dir/", b"")
        z.writestr("dir/x.npy", npy(np.ones(2, np.float32)))
        z.writestr("notes.txt", b"not an array")
    write("fuzz_npz", "mixed_members.npz", b.getvalue())

    # fuzz_run: byte 0 picks the model (index into its list), then per input a rank byte, dims,
    # and raw values. Plain small seeds: the fuzzer mutates the rest.
    for k in range(25):
        seed = bytes([k]) + bytes([1, 4]) + np.arange(4, dtype=np.float32).tobytes()
        seed += bytes([1, 2]) + np.array([2, 2], np.int64).tobytes() + bytes([0]) * 64
        write("fuzz_run", f"model_{k:02d}", seed)


if __name__ == "__main__":
    main()
