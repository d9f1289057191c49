#!/usr/bin/env python3
"""ONNX Runtime reference outputs for the real-sized model tests.

    python tests/models/ort_reference.py MODEL.onnx INPUTS.npz OUT_DIR

Runs MODEL once in onnxruntime on the arrays of INPUTS.npz (keys = graph input names) and
writes each output to OUT_DIR/<output name>.npy, the name percent-encoded (encode_name). ORT
runs with all graph optimizations disabled, so that it executes the graph as written (no
fusions that change rounding) and 2 intra-op threads, matching the test machines.

Also a module: make_models.py imports run_reference, save_npz and encode_name from here.
Test tool only: needs onnxruntime and numpy (scripts/requirements.txt).
"""

import argparse
import io
import os
import sys
import time
import zipfile

import numpy as np

_SAFE = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def encode_name(name):
    """File-name form of a value name: bytes of its UTF-8 outside [A-Za-z0-9._-] become %XX
    (upper-case hex), so '/head/Gemm_output_0' is '%2Fhead%2FGemm_output_0'."""
    return "".join(chr(b) if b in _SAFE else "%%%02X" % b for b in name.encode("utf-8"))


def save_npz(path, arrays):
    """np.savez without its wall-clock zip timestamps: members '<key>.npy', stored (not
    deflated), dated 1980-01-01, so the same arrays always give the same bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for key, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())


def load_npz(path):
    """The arrays of an .npz file as a dict, read eagerly."""
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def make_session(model_path, threads=2):
    """An onnxruntime CPU session that runs the graph as written."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: no warnings about disabled optimizations
    return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


def run_reference(model_path, inputs, out_dir, threads=2):
    """Runs the model on `inputs` (a dict, or the path of an .npz file), writes every output to
    out_dir/<encoded name>.npy and returns (outputs dict, load seconds, run seconds)."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = load_npz(inputs)
    start = time.perf_counter()
    session = make_session(model_path, threads)
    loaded = time.perf_counter()
    names = [o.name for o in session.get_outputs()]
    results = session.run(names, inputs)
    finished = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    outputs = dict(zip(names, results))
    for name, value in outputs.items():
        np.save(os.path.join(out_dir, encode_name(name) + ".npy"), value)
    return outputs, loaded - start, finished - loaded


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write onnxruntime outputs of a model as .npy")
    parser.add_argument("model", help="the .onnx model")
    parser.add_argument("inputs", help="an .npz with one array per graph input")
    parser.add_argument("out_dir", help="folder for <output name>.npy files")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    args = parser.parse_args(argv)
    outputs, load_s, run_s = run_reference(args.model, args.inputs, args.out_dir, args.threads)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype} {list(value.shape)} -> "
              f"{os.path.join(args.out_dir, encode_name(name) + '.npy')}")
    print(f"session {load_s:.2f} s, run {run_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
