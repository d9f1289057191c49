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
  fuzz_profile_compare  kiln.profile documents (as `kiln profile --json` writes them, with
                    fixed numbers) and near misses, for the --compare baseline reader
  fuzz_quant_config `kiln quant --config` files: every key, null settings, and near misses
  fuzz_tuning_db    tuning databases (JSON lines): two machines, a key twice, blank and CRLF
                    lines, and near misses (a future format, a truncated line, not an object,
                    a mistyped field)
  fuzz_smaps        /proc/PID/smaps text after 16 bytes of an address range: a mapped file on
                    2 MiB pages, anonymous huge pages, a mapping half in the range, sizes past
                    64 bits, and near misses (no newline at the end, a size in MB, a header
                    that ends before it starts)
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

    for name, data in profile_seeds().items():
        write("fuzz_profile_compare", name, data)

    # fuzz_quant_config: `kiln quant --config` files, good and near misses.
    import json
    configs = {
        "full.json": {"global": {"quantizer": "x86"}, "op_types": {"Gemm": None, "MaxPool": {"quantizer": "xnnpack"}},
                      "nodes": {"conv": {"quantizer": "xnnpack", "per_tensor": True}, "relu": None}},
        "global_null.json": {"global": None},
        "nodes_only.json": {"nodes": {"fc": None, "conv": {"quantizer": "x86"}}},
        "unknown_key.json": {"global": {"quantizer": "x86", "bits": 4}},
        "per_tensor_x86.json": {"op_types": {"Conv": {"quantizer": "x86", "per_tensor": True}}},
        "wrong_types.json": {"op_types": [1, 2], "nodes": {"x": "x86"}},
        "weight_only.json": {"global": {"weight_only": "int4", "group_size": 64}, "op_types": {"Gemm": {"weight_only": "int8"}},
                             "nodes": {"lm_head": None}},
        "weight_only_bad.json": {"nodes": {"fc": {"weight_only": "int3", "group_size": -1}, "x": {"quantizer": "x86", "group_size": 8}}},
    }
    for name, doc in configs.items():
        write("fuzz_quant_config", name, (json.dumps(doc) + "\n").encode())
    for name, data in tuning_seeds().items():
        write("fuzz_tuning_db", name, data)
    for name, data in smaps_seeds().items():
        write("fuzz_smaps", name, data)


def smaps_seeds():
    """/proc/PID/smaps text as Linux 6.x writes it, and near misses, each after the address range
    (two little-endian 64-bit addresses) fuzz_smaps.cc reads first."""
    import struct

    def seed(first, last, text):
        return struct.pack("<QQ", first, last) + text.encode()

    file_and_anon = ("00400000-00800000 r--p 00000000 fe:01 42                         /models/llama.kiln\n"
                     "Size:               4096 kB\nKernelPageSize:        4 kB\nRss:                3072 kB\n"
                     "Pss:                3072 kB\nAnonHugePages:         0 kB\nFilePmdMapped:      2048 kB\n"
                     "THPeligible:    1\nVmFlags: rd wr mr mw me ac sd\n"
                     "00800000-00c00000 rw-p 00000000 00:00 0 \nRss:                4096 kB\n"
                     "AnonHugePages:      4096 kB\nVmFlags: rd wr mr mw me ac sd hg\n")
    huge = "18014398509481983 kB\n"
    return {
        "file_and_anon": seed(0x400000, 0xa00000, file_and_anon),
        "whole_space": seed(0, 2**64 - 1, file_and_anon),
        "past_64_bits": seed(0, 2**64 - 1, "0-ffffffffffffffff rw-p 0 0:0 0\nRss: " + huge + "Rss: " + huge
                             + "AnonHugePages: " + huge),
        "near_misses": seed(0x400000, 0x1600000, "01300000-01200000 rw-p 00000000 00:00 0\nRss: 1024 kB\n"
                            "01400000-01600000 rw-p 00000000 00:00 0 [heap]\nRss: 12 MB\nRss: -4 kB\n"
                            "ShmemPmdMapped: 2048 kB\nRss: 2048 kB"),
    }


def tuning_seeds():
    """Tuning databases as compile/tuning_db.cc writes them (keys in its order), and near misses."""
    import json

    def record(machine, m=64, time_us=41.8, version=1):
        return {"format_version": version,
                "problem": {"op": "MatMul", "inputs": [{"shape": [m, 256], "dtype": "f32"}, {"shape": [256, 512], "dtype": "f32"}],
                            "layout": "b_packed", "epilogue": "bias+relu", "threads": 2},
                "machine": {"model_name": machine, "vendor": "GenuineIntel" if "Intel" in machine else "AuthenticAMD",
                            "family": 6 if "Intel" in machine else 25, "model": 143 if "Intel" in machine else 17, "stepping": 8 if "Intel" in machine else 1,
                            "features": ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512-vnni"], "physical_cores": 2,
                            "l1d_bytes": 49152, "l2_bytes": 2097152, "l3_bytes": 110100480},
                "versions": {"kernel_templates": 1, "onednn": "2.6.3"},
                "winner": {"kernel": "kiln.gemm_f32_avx512", "params": {"kc": 256, "mc": 192, "mr": 6, "nc": 3072, "nr": 64, "pack_a": 0,
                                                                      "tm": 1, "tn": 2}, "time_us": time_us},
                "candidates": [{"kernel": "onednn.matmul", "params": {}, "time_us": time_us * 1.13}]}

    def line(doc):
        return json.dumps(doc, separators=(",", ":"))

    intel, amd = "Intel(R) Xeon(R) Platinum 8480+", "AMD EPYC 9654 96-Core Processor"
    mistyped = record(amd, 1)
    mistyped["problem"]["threads"] = "two"
    return {
        "two_machines.jsonl": (line(record(intel)) + "\n" + line(record(amd)) + "\n").encode(),
        "same_key_twice.jsonl": (line(record(intel)) + "\n" + line(record(intel, time_us=39.5)) + "\n").encode(),
        "blank_and_crlf.jsonl": ("\r\n" + line(record(amd, 1)) + "\r\n\n   \n").encode(),
        "future_version.jsonl": (line(record(amd, 1, version=2)) + "\n").encode(),
        "truncated.jsonl": (line(record(amd, 1)) + "\n" + line(record(intel))[:90] + "\n").encode(),
        "not_object.jsonl": (line(record(amd, 1)) + "\n[1,2]\n").encode(),
        "mistyped_field.jsonl": (line(mistyped) + "\n").encode(),
    }


def profile_seeds():
    """kiln.profile documents with the fields --compare reads (and the others around them), and
    near misses: another schema, another version, a negative time, a node without times."""
    import json

    def doc(runs, nodes):
        return {
            "schema": "kiln.profile", "schema_version": 1, "kiln_version": "0.1.0", "command_line": "kiln profile m.kiln --json",
            "created": "2026-11-26T12:00:00Z",
            "model": {"file": "m.kiln", "stage": "compiled", "compiled_in_memory": False, "nodes": len(nodes)},
            "machine": {"cpu": "AMD EPYC", "features": ["avx2", "fma"], "threads": 2,
                        "ceilings": {"compute_gflops": {"f32": 230.0}, "f32_isa": "avx2",
                                     "memory": [{"level": "L1", "capacity_bytes": 65536, "gbps": 300.0},
                                                {"level": "DRAM", "capacity_bytes": 0, "gbps": 20.0}],
                                     "memory_gbps": 20.0, "threads": 2, "source": "cache"}},
            "run": {"warmup": 2, "iterations": len(runs), "threads": 2, "threads_requested": 2, "seed": 0, "inputs": []},
            "iteration_ms": runs,
            "nodes": [{"index": i, "name": n, "op": "FusedConv", "kernel": k, "kernel_params": "", "sources": [n],
                       "share": sum(t) / 1e3 / sum(runs), "times_us": t} for i, (n, k, t) in enumerate(nodes)],
        }

    runs = [1.25, 1.5, 1.0, 1.75, 1.125]
    nodes = [("/conv1/Conv", "onednn.conv", [500.5, 600.25, 450.0, 700.0, 480.0]),
             ("/fc/Gemm", "kiln.gemm_f32_avx2", [20.0, 21.5, 19.0, 22.0, 20.5]),
             ("ids", "xnnpack.fully_connected", [0.0, 0.125, 0.0, 0.25, 0.5])]
    seeds = {"profile.json": doc(runs, nodes), "no_nodes.json": doc([3.0, 3.5], []), "one_run.json": doc([2.0], nodes[:1])}
    wrong_version = doc(runs, nodes)
    wrong_version["schema_version"] = 2
    negative = doc([1.0, -1.0], [])
    no_times = doc(runs, nodes)
    del no_times["nodes"][0]["times_us"]
    seeds.update({"wrong_version.json": wrong_version, "negative_time.json": negative, "no_times.json": no_times,
                  "other_schema.json": {"schema": "kiln.run", "schema_version": 1, "latency_ms": {"median": 1.0}}})
    return {name: (json.dumps(d, indent=1) + "\n").encode() for name, d in seeds.items()}


if __name__ == "__main__":
    main()
