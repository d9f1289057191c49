#!/usr/bin/env python3
"""CLI golden tests: --help texts, each subcommand on samples/, and every user-error path with
its exit code and one-line message. Corrupt .onnx/.npy/.npz inputs are made here, in a temporary
folder. Run with --update to rewrite the golden --help files after an intended change."""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from checks import Checks, run_in_temp_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "cli", "golden")
ONE_LINE = re.compile(r"^kiln (export|quant|compile|run|inspect|profile): error: .+$")


class Runner(Checks):
    def __init__(self, kiln, work, update):
        super().__init__()
        self.kiln, self.work, self.update = kiln, work, update

    def run(self, args, stdin=None):
        p = subprocess.run([self.kiln] + args, capture_output=True, cwd=self.work, input=stdin)
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def golden(self, name, args):
        rc, out, err = self.run(args)
        path = os.path.join(GOLDEN, name + ".txt")
        if self.update:
            with open(path, "w") as f:
                f.write(out)
        want = open(path).read() if os.path.exists(path) else None
        self.check(name, rc == 0 and out == want, f"exit {rc}, output differs from {path} (run with --update)")

    def ok(self, name, args, stdout_has=None, stdin=None):
        rc, out, err = self.run(args, stdin)
        self.check(name, rc == 0 and (stdout_has is None or stdout_has in out),
                   f"exit {rc}; stderr: {err.strip()[:300]}; stdout: {out[:200]}")
        return out

    def error(self, name, args, code, pattern, no_file=None):
        """A user-facing failure: exit code, exactly one line on stderr in kiln's format, matching
        `pattern`, and no output file left behind."""
        rc, out, err = self.run(args)
        lines = [l for l in err.splitlines() if l.strip()]
        good = rc == code and len(lines) == 1 and ONE_LINE.match(lines[0]) and re.search(pattern, lines[0])
        if no_file:
            leftovers = [f for f in os.listdir(self.work) if f.startswith(no_file) or f.startswith("." + no_file)]
            good = good and not leftovers
        self.check(name, good, f"exit {rc} (want {code}); stderr: {err.strip()[:400]!r}; want /{pattern}/")


def rel_l2(got, want):
    """Relative L2 distance of `got` from `want`."""
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def save(model, path, **kw):
    onnx.save(model, path, **kw)
    return path


def tiny_model(name="tiny", op="Relu", domain="", opset=17, dims=(2, 3)):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))
    n1 = helper.make_node(op, ["x"], ["t"], name="first", domain=domain)
    n2 = helper.make_node(op, ["t"], ["y"], name="second", domain=domain)
    g = helper.make_graph([n1, n2], name, [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def external_model(work, location):
    w = numpy_helper.from_array(np.ones((4,), np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")], "ext", [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


PASSES = ("specialize_shapes", "fold_constants", "cse", "fold_batchnorm", "drop_linear_reshapes", "fuse_linear_bias", "fuse_layer_norm",
          "fuse_rms_norm", "fuse_gelu", "fuse_rotary", "fuse_attention", "hoist_activations", "fuse_epilogues", "gather_rows_early", "channels_last", "lower_int8", "lower_precision", "merge_projections",
          "merge_transposes", "fold_split_concat", "fuse_concat", "fuse_pointwise_depthwise", "fuse_channel_scale",
          "eliminate_dead",
          "select_kernels", "autotune_kernels", "prepack_weights")


def compile_tests(r, work, samples):
    """kiln compile on every sample: the compiled model gives the outputs the exported one gave
    on the same inputs; then the pass flags and the user errors."""
    for name in ("mlp", "cnn", "transformer"):
        r.ok(f"compile_{name}", ["compile", name + ".kiln", "-o", name + ".c.kiln"])
        r.ok(f"compile_{name}_same_outputs",
             ["run", name + ".c.kiln", "--inputs", os.path.join(samples, name + ".inputs.npz"), "--output-dir",
              name + ".c.out", "--check-against", name + ".out", "--atol", "1e-5", "--rtol", "1e-4"])
        text = r.ok(f"compile_{name}_inspect", ["inspect", name + ".c.kiln"], stdout_has="stage: compiled")
        r.check(f"compile_{name}_provenance", f"kiln compile 0.1.0 from {name}.kiln" in text, text[:400])
    # The provenance's digest is the input file's SHA-256 (hashed where the file is mapped; the
    # SHA extensions' rounds where the CPU has them), and the same for the bytes through stdin.
    with open(os.path.join(r.work, "mlp.kiln"), "rb") as f:
        mlp_bytes = f.read()
    want = hashlib.sha256(mlp_bytes).hexdigest()
    got = json.loads(r.ok("compile_provenance_sha256", ["inspect", "--json", "mlp.c.kiln"]))["provenance"][-1]
    r.check("compile_provenance_sha256_is_the_input's", got.get("input_sha256") == want, f"{got} against {want}")
    piped = subprocess.run([r.kiln, "compile", "-", "-o", "-"], input=mlp_bytes, capture_output=True).stdout
    got = json.loads(r.ok("compile_provenance_sha256_stdin", ["inspect", "--json", "-"], stdin=piped))["provenance"][-1]
    r.check("compile_provenance_sha256_stdin_is_the_input's", got.get("input_sha256") == want, f"{got} against {want}")
    # What the passes did to the samples: the CNN's BatchNormalizations are folded into its
    # convolutions and their Relus fused; the MLP's MatMul + Add (+ Relu) are fused linear layers;
    # the transformer's Q, K and V projections are one product with split outputs (4 of its 6).
    cnn_ops = r.ok("compile_cnn_ops", ["inspect", "--json", "cnn.c.kiln"])
    mlp_ops = r.ok("compile_mlp_ops", ["inspect", "--json", "mlp.c.kiln"])
    transformer_ops = r.ok("compile_transformer_ops", ["inspect", "--json", "transformer.c.kiln"])
    try:
        cnn_hist, mlp_hist = json.loads(cnn_ops)["ops"], json.loads(mlp_ops)["ops"]
        good = "BatchNormalization" not in cnn_hist and "Relu" not in cnn_hist and cnn_hist.get("FusedConv", 0) > 0
        good = good and "MatMul" not in mlp_hist and "Gemm" not in mlp_hist and mlp_hist.get("FusedMatMul") == 3
        good = good and json.loads(transformer_ops)["ops"].get("FusedMatMul") == 4
    except (ValueError, KeyError, AttributeError) as e:
        good, cnn_hist = False, f"{cnn_ops[:200]} ({e})"
    r.check("compile_rewrites_samples", good, f"cnn ops {cnn_hist}, mlp ops {mlp_ops[:300]}, transformer ops {transformer_ops[:300]}")
    text = r.ok("compile_transformer_text", ["inspect", "--text", "transformer.c.kiln"])
    r.check("compile_transformer_merges_qkv", "splits=ints[64, 64, 64]" in text, text[:600])

    # --input-shape binds the batch; the compiled model takes that shape.
    r.ok("compile_input_shape", ["compile", "mlp.kiln", "-o", "mlp4.kiln", "--input-shape", "input=4x16"])
    r.ok("compile_input_shape_inspect", ["inspect", "mlp4.kiln"], stdout_has="input  input: f32 4x16")
    r.ok("compile_input_shape_run", ["run", "mlp4.kiln", "--seed", "1"], stdout_has="logits: f32 4x10")
    # A symbolic input: one note that the kernels wait for each new shape's first run; nothing
    # once --input-shape binds it.
    rc, out, err = r.run(["compile", "mlp.kiln", "-o", "mlp.note.kiln"])
    r.check("compile_symbolic_note", rc == 0 and err == "kiln compile: note: input 'input' has shape batchx16: kernels are chosen "
            "on each new input shape's first run (--input-shape chooses them here)\n", f"exit {rc}; stderr {err[:400]!r}")
    # Run so, the session's plan packs the weights its kiln GEMMs read (kept for the plans of
    # later shapes, `run -v` says); compiled with the shape, they are stored packed and read
    # where mapped.
    rc, out, err = r.run(["run", "mlp.note.kiln", "--input-shape", "input=64x16", "-v"])
    packs = any(re.search(r"\(FusedMatMul\): kiln\.gemm_f32_", l) for l in err.splitlines())
    r.check("run_symbolic_packs_weights", rc == 0 and packs and
            re.search(r"^packed weights: \d+ bytes in \d+ forms? made while planning, shared by the plans of every input shape$",
                      err, re.M) is not None, f"exit {rc}; stderr {err[:600]!r}")
    rc, out, err = r.run(["compile", "mlp.kiln", "-o", "mlp.note.kiln", "--input-shape", "input=4x16"])
    r.check("compile_concrete_no_note", rc == 0 and err == "", f"exit {rc}; stderr {err[:400]!r}")
    r.ok("compile_input_shape_64", ["compile", "mlp.kiln", "-o", "mlp64.kiln", "--input-shape", "input=64x16"])
    rc, out, err = r.run(["run", "mlp64.kiln", "-v"])
    packs = any(re.search(r"\(FusedMatMul\): kiln\.gemm_f32_", l) for l in err.splitlines())
    r.check("run_concrete_packs_nothing", rc == 0 and packs and "packed weights:" not in err, f"exit {rc}; stderr {err[:600]!r}")
    # -v says, after the runs, how much of the mapped file is resident and on 2 MiB pages (the
    # kernel decides; at most all of it); a model read from stdin is not mapped.
    m = re.search(r"^on 2 MiB pages: model file (\d+) of (\d+) resident bytes$", err, re.M)
    r.check("run_verbose_pages", m is not None and 0 < int(m.group(2)) and int(m.group(1)) <= int(m.group(2)),
            f"stderr {err[:600]!r}")
    with open(os.path.join(work, "mlp64.kiln"), "rb") as f:
        rc, out, err = r.run(["run", "-", "-v"], stdin=f.read())
    r.check("run_verbose_pages_stdin", rc == 0 and "packed weights:" not in err and "on 2 MiB pages" not in err,
            f"exit {rc}; stderr {err[:600]!r}")
    # Through stdin and stdout.
    with open(os.path.join(work, "cnn.kiln"), "rb") as f:
        piped = subprocess.run([r.kiln, "compile", "-", "-o", "-"], input=f.read(), capture_output=True).stdout
    r.ok("compile_stdout", ["inspect", "-"], stdout_has="stage: compiled", stdin=piped)

    # The compiled CNN records its kernels, the target they need and its memory plan; --target
    # compiles for another CPU; a CPU name kiln does not know is a user error.
    r.ok("compile_cnn_avx2", ["compile", "cnn.kiln", "-o", "cnn.avx2.kiln", "--input-shape", "input=1x3x32x32",
                              "--target", "avx2"])
    info = r.ok("compile_cnn_avx2_inspect", ["inspect", "--json", "cnn.avx2.kiln"])
    try:
        doc = json.loads(info)
        good = doc["target"]["device"] == "cpu" and set(doc["target"]["isa"]) <= {"avx2", "fma"}
        good = good and doc["memory_plan"]["arena_bytes"] > 0 and doc["kernels"].get("onednn.conv", 0) > 0
    except (ValueError, KeyError, TypeError) as e:
        good, info = False, f"{info[:300]} ({e})"
    r.check("compile_records_kernels_target_and_plan", good, info[:400])
    r.ok("compile_cnn_avx2_runs", ["run", "cnn.avx2.kiln", "--inputs", os.path.join(samples, "cnn.inputs.npz"),
                                   "--check-against", os.path.join(samples, "cnn.expected")])
    # Its weights are stored packed for the kernels chosen; the reference kernels unpack them.
    r.ok("compile_cnn_packed_reference", ["run", "cnn.avx2.kiln", "--reference", "--inputs",
                                          os.path.join(samples, "cnn.inputs.npz"), "--check-against",
                                          os.path.join(samples, "cnn.expected")])
    r.error("compile_bad_target", ["compile", "cnn.kiln", "-o", "bad.kiln", "--target", "sse2"], 2,
            r"^kiln compile: error: --target 'sse2' is not one of host, avx2, avx512, avx512-vnni, avx512-bf16, avx512-fp16, amx$",
            no_file="bad.kiln")
    # A compiled model compiled again: its packed weights are unpacked, and packed again.
    r.ok("compile_compiled_again", ["compile", "cnn.avx2.kiln", "-o", "cnn.again.kiln"])
    r.ok("compile_compiled_again_runs", ["run", "cnn.again.kiln", "--inputs", os.path.join(samples, "cnn.inputs.npz"),
                                         "--check-against", os.path.join(samples, "cnn.expected")])

    precision_tests(r, work, samples)

    # --list-passes: the table, no model needed.
    rc, out, err = r.run(["compile", "--list-passes"])
    rows = [l.split()[0] for l in out.splitlines() if l.strip()]
    r.check("compile_list_passes", rc == 0 and tuple(rows) == PASSES, f"exit {rc}; stdout {out[:400]!r}")
    # --time-passes: a row per pass, with its time and what it did.
    rc, out, err = r.run(["compile", "cnn.kiln", "-o", "timed.kiln", "--time-passes"])
    lines = err.splitlines()
    rows = {l.split()[0]: l for l in lines[1:] if l.strip()}
    good = rc == 0 and lines and lines[0].split() == ["pass", "time", "ms", "result"] and all(p in rows for p in PASSES)
    good = good and rows.get("fold_batchnorm", "").endswith("folded 3 BatchNormalization into Conv")
    good = good and rows.get("fuse_linear_bias", "").endswith("no change") and "total" in rows
    good = good and "stored 4 weights packed" in rows.get("prepack_weights", "")
    r.check("compile_time_passes", good, f"exit {rc}; stderr {err[:600]!r}")
    # --print-after all: each pass, dumped when it changed the model, "no change" otherwise.
    rc, out, err = r.run(["compile", "mlp.kiln", "-o", "printed.kiln", "--print-after", "all"])
    heads = [l for l in err.splitlines() if l.startswith("# after ")]
    good = rc == 0 and [h.split()[2].rstrip(":") for h in heads] == list(PASSES)
    good = good and "# after fuse_linear_bias" in heads and "# after cse: no change" in heads
    good = good and "Gemm(/relu/Relu_output_0, onnx::MatMul_102, fc2.bias)" in err.split("# after fuse_linear_bias\n", 1)[-1]
    r.check("compile_print_after_all", good, f"exit {rc}; headings {heads}; stderr {err[:300]!r}")
    rc, out, err = r.run(["compile", "cnn.kiln", "-o", "printed.kiln", "--passes", "cse,fold_batchnorm",
                          "--print-after", "fold_batchnorm", "-v"])
    good = rc == 0 and err.count("# after ") == 1 and "# after fold_batchnorm\nmodel stage=exported" in err
    good = good and "kiln compile: cse: no change" in err and "kiln compile: fold_batchnorm: folded 3" in err
    good = good and "fold_constants" not in err
    r.check("compile_passes_and_print_after", good, f"exit {rc}; stderr {err[:600]!r}")

    # -v: each node's kernel with its parameters, once kernels are chosen.
    rc, out, err = r.run(["compile", "cnn.kiln", "-o", "verbose.kiln", "--input-shape", "input=1x3x32x32", "-v"])
    kernels = [l for l in err.splitlines() if l.startswith("kiln compile: node '")]
    good = rc == 0 and kernels and all(l.endswith("}") for l in kernels)
    good = good and any("onednn.conv{algorithm=" in l for l in kernels)
    r.check("compile_verbose_kernels", good, f"exit {rc}; stderr {err[-600:]!r}")

    # User errors: one line, exit 2, nothing written.
    r.error("compile_unknown_pass", ["compile", "cnn.kiln", "-o", "bad.kiln", "--passes", "cse,frobnicate"], 2,
            r"--passes: unknown pass 'frobnicate' \(known passes: specialize_shapes, fold_constants, .*\)$", no_file="bad.kiln")
    r.error("compile_unknown_print_after", ["compile", "cnn.kiln", "-o", "bad.kiln", "--print-after", "nope"], 2,
            r"--print-after: unknown pass 'nope'", no_file="bad.kiln")
    r.error("compile_missing_file", ["compile", "missing.kiln", "-o", "bad.kiln"], 2, r"missing\.kiln: cannot open file",
            no_file="bad.kiln")
    r.error("compile_no_input", ["compile", "-o", "bad.kiln"], 2, r"no input model given", no_file="bad.kiln")
    r.error("compile_no_output", ["compile", "cnn.kiln"], 2, r"no output given")
    with open(os.path.join(work, "garbage.kiln"), "wb") as f:
        f.write(b"not a kiln model at all")
    r.error("compile_corrupt_model", ["compile", "garbage.kiln", "-o", "bad.kiln"], 2, r"garbage\.kiln: ", no_file="bad.kiln")
    # Outputs that cannot be written are refused before the work that leads to them.
    r.error("compile_output_folder_missing", ["compile", "mlp.kiln", "-o", "nosuch/bad.kiln"], 2,
            r"nosuch/bad\.kiln: cannot be written: the folder 'nosuch' does not exist$")
    r.error("compile_tune_report_folder_missing", ["compile", "mlp.kiln", "-o", "bad.kiln", "--mode", "max-autotune", "--tune-report",
                                                   "nosuch/r.json"], 2, r"nosuch/r\.json: cannot be written", no_file="bad.kiln")
    os.makedirs(os.path.join(work, "a_folder"), exist_ok=True)
    r.error("export_output_is_folder", ["export", os.path.join(samples, "mlp.onnx"), "-o", "a_folder"], 2,
            r"a_folder: is a folder; the output is a file$")
    r.error("quant_output_folder_missing", ["quant", "mlp.kiln", "-o", "nosuch/q.kiln", "--weight-only", "int8"], 2,
            r"nosuch/q\.kiln: cannot be written: the folder 'nosuch' does not exist$")
    r.error("compile_onnx_model", ["compile", os.path.join(samples, "mlp.onnx"), "-o", "bad.kiln"], 2,
            r"mlp\.onnx: not a kiln file: .* \(an ONNX model: kiln export it to a \.kiln first\)$", no_file="bad.kiln")
    r.error("run_onnx_model", ["run", os.path.join(samples, "mlp.onnx")], 2, r"\(an ONNX model: kiln export it to a \.kiln first\)$")
    r.error("compile_unknown_input", ["compile", "mlp.kiln", "-o", "bad.kiln", "--input-shape", "nosuch=1x16"], 2,
            r"mlp\.kiln: input 'nosuch': the model has no input of this name", no_file="bad.kiln")
    r.error("compile_shape_does_not_fit", ["compile", "cnn.kiln", "-o", "bad.kiln", "--input-shape", "input=2x3x32x32"], 2,
            r"input 'input': --input-shape 2x3x32x32 does not fit the input's shape 1x3x32x32", no_file="bad.kiln")
    r.error("compile_symbolic_shape", ["compile", "mlp.kiln", "-o", "bad.kiln", "--input-shape", "input=nx16"], 2,
            r"compile needs a number for every dim", no_file="bad.kiln")
    r.error("compile_threads_zero", ["compile", "mlp.kiln", "-o", "bad.kiln", "--threads", "0"], 2,
            r"--threads: 0 is not a whole number from 1 to 1024 \(see kiln compile --help\)$", no_file="bad.kiln")


def host_features(r):
    """The ISA features kiln reads off this CPU ("avx2", "avx512-vnni"...), from `kiln run -v`."""
    rc, out, err = r.run(["run", "mlp.kiln", "--seed", "1", "-v"])
    host = (out + err).split("target: cpu (", 1)[-1].split(")", 1)[0].split()
    r.check("precision_host_features", rc == 0 and "avx2" in host, f"exit {rc}; {(out + err)[:300]!r}")
    return host


def precision_tests(r, work, samples):
    """--precision bf16 / fp16: compiled where the target has the ISA (elsewhere a user error, and
    --target compiles for a CPU that has it); the lowered models run where this CPU can, within
    1e-2 relative L2 of the fp32 outputs but not equal to them, and their files are smaller."""
    host = host_features(r)
    # (precision, the ISA the compile asks of the target, what the lowered model's kernels need here)
    for precision, isa, runs_on in (("bf16", "avx512-bf16", "avx512-bf16"), ("fp16", "avx512-fp16", "avx512-fp16")):
        target = []
        if isa not in host:
            r.error(f"compile_{precision}_needs_isa", ["compile", "cnn.kiln", "-o", "bad.kiln", "--precision", precision], 2,
                    rf"^kiln compile: error: cnn\.kiln: --precision {precision}: the target CPU lacks {isa} "
                    r"\(--target names a CPU to compile for\)$", no_file="bad.kiln")
            target = ["--target", isa]
        for name in ("cnn", "transformer"):
            lowered = f"{name}.{precision}.kiln"
            rc, out, err = r.run(["compile", name + ".kiln", "-o", lowered, "--precision", precision, "-v"] + target)
            dtype = "bf16" if precision == "bf16" else "f16"
            m = re.search(rf"lower_precision: lowered \d+ convolutions? (and|or) matrix products? to {dtype} \(their weights ", err)
            good, saved = rc == 0 and m is not None, None
            if good:  # smaller (by less than half the lowered weights' bytes where the kernels pad packed weights)
                saved = os.path.getsize(os.path.join(work, name + ".c.kiln")) - os.path.getsize(os.path.join(work, lowered))
                good = saved > 0
            r.check(f"compile_{name}_{precision}", good, f"exit {rc}; {saved} bytes saved; stderr {err[:500]!r}")
            if runs_on not in host:
                continue
            r.ok(f"compile_{name}_{precision}_runs", ["run", lowered, "--inputs", os.path.join(samples, name + ".inputs.npz"),
                                                      "--output-dir", lowered + ".out"])
            want_dir, got_dir = os.path.join(work, name + ".out"), os.path.join(work, lowered + ".out")
            errors = {f: rel_l2(np.load(os.path.join(got_dir, f)), np.load(os.path.join(want_dir, f)))
                      for f in sorted(os.listdir(want_dir))}
            r.check(f"compile_{name}_{precision}_close", errors and all(0 < e <= 1e-2 for e in errors.values()), str(errors))
    # --target amx: kiln's bf16 GEMM takes the lowered linear layers on AMX tiles (on VDPBF16PS
    # where the CPU lacks AMX) and the attention kiln's AMX kernel, so the model runs only where
    # the CPU has AMX.
    rc, out, err = r.run(["compile", "transformer.kiln", "-o", "transformer.amx.kiln", "--precision", "bf16", "--target", "amx", "-v"])
    kernels = re.findall(r"\(FusedMatMul\): ([\w.]+)", err)
    r.check("compile_transformer_bf16_amx", rc == 0 and "kiln.gemm_bf16_avx512" in kernels and "onednn.matmul" not in kernels
            and "target cpu (" in err and " amx)" in err, f"exit {rc}; kernels {kernels}; {err[:300]!r}")
    if "amx" in host:
        r.ok("compile_transformer_bf16_amx_runs", ["run", "transformer.amx.kiln", "--inputs", os.path.join(samples, "transformer.inputs.npz"),
                                                   "--check-against", "transformer.bf16.kiln.out", "--rtol", "1e-4", "--atol", "1e-5"])
    else:
        r.error("compile_transformer_bf16_amx_refused", ["run", "transformer.amx.kiln", "--inputs", os.path.join(samples, "transformer.inputs.npz")],
                2, r"^kiln run: error: transformer\.amx\.kiln: the model was compiled for a CPU with .*amx, which this CPU lacks "
                   r"\(compile it again with --target host, or run it with --reference\)$")
    # --target amx keeps the sample CNN's activations bf16 between its convolutions and its max
    # pool (the first convolution reads the f32 input, the last writes f32 for the average pool);
    # it still computes what fp32 does within bf16's error.
    rc, out, err = r.run(["compile", "cnn.kiln", "-o", "cnn.amx.kiln", "--precision", "bf16", "--target", "amx", "-v"])
    r.check("compile_cnn_bf16_amx_activations", rc == 0 and "; 3 convolutions and 1 max pool write bf16 activations for the nodes after them;" in err
            and "(Cast)" not in err, f"exit {rc}; {err[:600]!r}")
    if "avx512-bf16" in host:
        r.ok("compile_cnn_bf16_amx_runs", ["run", "cnn.amx.kiln", "--inputs", os.path.join(samples, "cnn.inputs.npz"), "--output-dir", "cnn.amx.out"])
        want_dir, got_dir = os.path.join(work, "cnn.out"), os.path.join(work, "cnn.amx.out")
        errors = {f: rel_l2(np.load(os.path.join(got_dir, f)), np.load(os.path.join(want_dir, f))) for f in sorted(os.listdir(want_dir))}
        r.check("compile_cnn_bf16_amx_close", errors and all(0 < e <= 1e-2 for e in errors.values()), str(errors))
    r.error("compile_bad_precision", ["compile", "cnn.kiln", "-o", "bad.kiln", "--precision", "int8"], 2,
            r"^kiln compile: error: --precision 'int8' is not one of fp32, bf16, fp16$", no_file="bad.kiln")
    rc, out, err = r.run(["compile", "cnn.kiln", "-o", "cnn.out_layers.kiln", "--precision", "bf16", "--target", "avx512-bf16",
                          "--lower-output-layers", "-v"])
    r.check("compile_cnn_bf16_output_layers", rc == 0 and "lowered 5 convolutions and matrix products to bf16" in err and "kept f32" not in err,
            f"exit {rc}; {err[:600]!r}")
    r.error("compile_output_layers_without_precision", ["compile", "cnn.kiln", "-o", "bad.kiln", "--lower-output-layers"], 2,
            r"^kiln compile: error: --lower-output-layers needs --precision bf16 or fp16$", no_file="bad.kiln")


def quant_tests(r, work, samples):
    """kiln quant: both quantizers on the sample CNN, calibrated on its inputs; the quantized
    model (and it compiled) stays close to the float outputs; its user errors."""
    cnn_in = os.path.join(samples, "cnn.inputs.npz")
    expected = os.path.join(samples, "cnn.expected")
    # Int8 products (QFusedConv, QFusedMatMul) are compiled for CPUs with VNNI, and weight-only
    # layers (WoqFusedMatMul) for CPUs with AVX-512: where this one lacks them, for the presets.
    host = host_features(r)
    vnni, avx512 = "avx512-vnni" in host, "avx512f" in host
    int8_target = [] if vnni else ["--target", "avx512-vnni"]
    for q in ("x86", "xnnpack"):
        rc, out, err = r.run(["quant", "cnn.kiln", "-o", f"cnn.{q}.kiln", "--quantizer", q, "--calib", cnn_in])
        r.check(f"quant_{q}", rc == 0 and f"kiln quant: {q}: " in err and "weights stored quantized" in err,
                f"exit {rc}; {err[:300]!r}")
        rc, out, err = r.run(["inspect", f"cnn.{q}.kiln"])
        act = "u8" if q == "x86" else "i8"
        r.check(f"quant_{q}_inspect", rc == 0 and "stage: quantized" in out and f'quantizer config: {{"global":{{"quantizer":"{q}"}}}}' in out
                and f"/stem/conv/Conv (Conv): in {act} per tensor, weight i8 per channel (8); out {act}" in out, f"exit {rc}; {out[-700:]!r}")
        rc, out, err = r.run(["inspect", "--text", f"cnn.{q}.kiln"])
        r.check(f"quant_{q}_qdq", rc == 0 and "QuantizeLinear" in out and "DequantizeLinear" in out
                and ": BatchNormalization(" not in out, f"exit {rc}; {err[:200]!r}")
        # 8-bit: within a few percent of the float logits, run as is and compiled.
        r.ok(f"quant_{q}_run", ["run", f"cnn.{q}.kiln", "--inputs", cnn_in, "--check-against", expected,
                                "--atol", "0.05", "--rtol", "0.05"])
        # Compiled: the convolutions become int8 kernels (QFusedConv: oneDNN's, or on AMX kiln's
        # direct kernel for their 16 channels), whose outputs match the
        # quantized model's reference run within a small fraction of the logits' scale. (For a
        # CPU with VNNI: on one without, compiled for --target avx512-vnni, and then for this
        # CPU, whose convolutions stay f32 between their Q and DQ.)
        rc, _, err = r.run(["compile", f"cnn.{q}.kiln", "-o", f"cnn.{q}.c.kiln", "-v"] + int8_target)
        r.check(f"quant_{q}_compiled", rc == 0 and re.search(r"lowered 4 convolutions to QFusedConv, 1 linear layer to QFusedMatMul, \d adds? to QAdd and 1 max pool to int8", err)
                and re.search(r"\(QFusedConv\): (onednn\.qconv|kiln\.qconv_)", err) and "(QFusedMatMul): kiln.qmatmul_u8s8_avx512" in err
                and "(FusedConv)" not in err, f"exit {rc}; {err[:600]!r}")
        r.ok(f"quant_{q}_reference", ["run", f"cnn.{q}.kiln", "--inputs", cnn_in, "--reference", "--output-dir", f"qref_{q}"])
        if not vnni:
            rc, _, err = r.run(["compile", f"cnn.{q}.kiln", "-o", f"cnn.{q}.c.kiln", "-v"])
            r.check(f"quant_{q}_compiled_without_vnni", rc == 0 and "(QFusedConv)" not in err and "(FusedConv): " in err
                    and "kept 5 convolutions and linear layers f32 (int8 products need avx512-vnni, which the target lacks)" in err,
                    f"exit {rc}; {err[-800:]!r}")
        r.ok(f"quant_{q}_int8_matches", ["run", f"cnn.{q}.c.kiln", "--inputs", cnn_in, "--check-against", f"qref_{q}",
                                          "--atol", "0.02" if vnni else "1e-4", "--rtol", "0"])
        r.ok(f"quant_{q}_compiled_run", ["run", f"cnn.{q}.c.kiln", "--inputs", cnn_in, "--check-against", expected,
                                         "--atol", "0.05", "--rtol", "0.05"])
    # -v names the annotated nodes of the model as given (before the Q/DQ go in).
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.v.kiln", "--quantizer", "x86", "--calib", cnn_in, "-v"])
    r.check("quant_verbose", rc == 0 and "kiln quant: node '/stem/conv/Conv': conv_Relu" in err
            and "kiln quant: node '/stem/relu/Relu': conv_Relu" in err and "x86: 13 of 13 nodes annotated" in err,
            f"exit {rc}; {err[:600]!r}")
    # A tied LM head (GPT-2's: logits = h · Transpose(wte), wte also the embedding table): its
    # computed weight is folded, so that it is quantized like any linear layer.
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, 12])
    wte = numpy_helper.from_array(np.random.default_rng(3).standard_normal((12, 8)).astype(np.float32), "wte")
    g = helper.make_graph([helper.make_node("Gather", ["wte", "ids"], ["h"], name="embed"),
                           helper.make_node("Transpose", ["wte"], ["wte_t"], name="wte_t"),
                           helper.make_node("MatMul", ["h", "wte_t"], ["logits"], name="lm_head")], "tied", [ids], [logits], [wte])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), os.path.join(work, "tied.onnx"))
    np.savez(os.path.join(work, "tied.npz"), ids=np.array([[3, 0, 11, 7], [1, 2, 5, 9]], np.int64))
    r.ok("quant_tied_export", ["export", "tied.onnx", "-o", "tied.kiln"])
    rc, _, err = r.run(["quant", "tied.kiln", "-o", "tied.q.kiln", "--quantizer", "x86", "--calib", "tied.npz", "-v"])
    r.check("quant_tied_lm_head", rc == 0 and "kiln quant: node 'lm_head': linear" in err and "1 weight stored quantized" in err,
            f"exit {rc}; {err[:600]!r}")
    # A folder of .npz files, a batch split into samples, --calib-limit.
    os.makedirs(os.path.join(work, "calib"), exist_ok=True)
    x = np.load(cnn_in)["input"]
    np.savez(os.path.join(work, "calib", "a.npz"), input=np.concatenate([x, 0.5 * x, -x], axis=0))
    np.savez(os.path.join(work, "calib", "b.npz"), input=x * 2)
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.dir.kiln", "--quantizer", "x86", "--calib", "calib"])
    r.check("quant_calib_folder", rc == 0 and "calibrated on 4 samples" in err, f"exit {rc}; {err[:300]!r}")
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.lim.kiln", "--quantizer", "x86", "--calib", "calib", "--calib-limit", "2"])
    r.check("quant_calib_limit", rc == 0 and "calibrated on 2 samples" in err, f"exit {rc}; {err[:300]!r}")
    # --report: the last quarter of the samples held out (1 of 4), or --eval; as text and JSON.
    rc, out, err = r.run(["quant", "cnn.kiln", "-o", "cnn.rep.kiln", "--quantizer", "x86", "--calib", "calib", "--report"])
    r.check("quant_report", rc == 0 and "calibrated on 3 samples" in err and "on 1 sample (the last 1 of the --calib" in out
            and "output 'logits': " in out and "/stem/relu/Relu (conv_Relu)" in out, f"exit {rc}; {out[:400]!r} {err[:300]!r}")
    rc, out, err = r.run(["quant", "cnn.kiln", "-o", "cnn.rep.kiln", "--quantizer", "xnnpack", "--calib", "calib", "--eval", cnn_in,
                          "--report", "--json"])
    try:
        doc = json.loads(out)
        layers = [l["sqnr_db"] for l in doc["layers"]]
        ok = (rc == 0 and doc["format"] == "kiln.quant_report" and doc["samples"] == 1 and "calibrated on 4 samples" in err
              and len(layers) >= 5 and layers == sorted(layers) and doc["outputs"][0]["name"] == "logits"
              and 20 < doc["outputs"][0]["sqnr_db"] < 80)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        ok, out = False, f"{e}: {out}"
    r.check("quant_report_json", ok, f"exit {rc}; {out[:600]!r} {err[:300]!r}")
    # --min-sqnr: the fewest layers kept float that reach the target on the held-out sample, the
    # choice written as a --config that reproduces it.
    os.makedirs(os.path.join(work, "calib2"), exist_ok=True)
    np.savez(os.path.join(work, "calib2", "a.npz"), input=np.concatenate([1.1 * x, -x, 0.9 * x], axis=0))
    np.savez(os.path.join(work, "calib2", "b.npz"), input=x)
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.min.kiln", "--quantizer", "x86", "--calib", "calib2", "--min-sqnr", "45",
                        "--exclude-out", "exclude.json"])
    m = re.search(r"--min-sqnr 45\.0: end-to-end SQNR ([0-9.]+|inf) dB with (\d+) layers? kept float \(([0-9.]+) dB with all quantized", err)
    ok = rc == 0 and m is not None
    if ok:
        reached, kept, before = float(m.group(1)), int(m.group(2)), float(m.group(3))
        with open(os.path.join(work, "exclude.json")) as f:
            excluded = json.load(f)
        ok = (before < 45 <= reached and 1 <= kept < 8 and excluded["global"] == {"quantizer": "x86"}
              and len(excluded["nodes"]) >= kept and all(v is None for v in excluded["nodes"].values()))
        rc2, out2, _ = r.run(["quant", "cnn.kiln", "-o", "cnn.min2.kiln", "--calib", "calib2", "--config", "exclude.json",
                              "--report", "--json"])
        ok = ok and rc2 == 0 and abs(json.loads(out2)["outputs"][0]["sqnr_db"] - reached) < 0.1
    r.check("quant_min_sqnr", ok, f"exit {rc}; {err[-600:]!r}")
    # A model in QDQ form from ONNX Runtime's own quantizer (BatchNorm folded by its pre-processing)
    # compiles to the same int8 kernels, and its outputs match ONNX Runtime's run of it.
    import logging
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    logging.getLogger().setLevel(logging.ERROR)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": x}, {"input": -x}, {"input": 0.5 * x}])

        def get_next(self):
            return next(self.it, None)

    pre, qdq = os.path.join(work, "cnn.pre.onnx"), os.path.join(work, "cnn.qdq.onnx")
    quant_pre_process(os.path.join(samples, "cnn.onnx"), pre, skip_symbolic_shape=True)
    quantize_static(pre, qdq, Reader(), quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    r.ok("quant_ort_qdq_export", ["export", "cnn.qdq.onnx", "-o", "cnn.qdq.kiln"])
    rc, _, err = r.run(["compile", "cnn.qdq.kiln", "-o", "cnn.qdq.c.kiln", "-v"] + int8_target)
    r.check("quant_ort_qdq_compiled", rc == 0 and re.search(r"lowered 4 convolutions to QFusedConv, 1 linear layer to QFusedMatMul", err)
            and "(FusedConv)" not in err, f"exit {rc}; {err[:600]!r}")
    if not vnni:  # what runs here
        r.ok("quant_ort_qdq_compiled_here", ["compile", "cnn.qdq.kiln", "-o", "cnn.qdq.c.kiln"])
    r.ok("quant_ort_qdq_run", ["run", "cnn.qdq.c.kiln", "--inputs", cnn_in, "--output-dir", "qdq_out"])
    want = ort.InferenceSession(qdq, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    got = np.load(os.path.join(work, "qdq_out", "logits.npy"))
    rel = rel_l2(got, want)
    r.check("quant_ort_qdq_matches_ort", rel < 0.02, f"relative L2 {rel:.4f} against ONNX Runtime on its QDQ model")
    # -o OUT.onnx: standard ONNX in QDQ form, which the ONNX checker accepts, ONNX Runtime and
    # OpenVINO run with kiln's outputs, and kiln exports and compiles back to the int8 kernels.
    for q in ("x86", "xnnpack"):
        r.ok(f"quant_{q}_onnx", ["quant", "cnn.kiln", "-o", f"cnn.{q}.q.onnx", "--quantizer", q, "--calib", cnn_in])
        path = os.path.join(work, f"cnn.{q}.q.onnx")
        try:
            m = onnx.load(path)
            onnx.checker.check_model(m, full_check=True)
            ops = {n.op_type for n in m.graph.node}
            got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
            want = np.load(os.path.join(work, f"qref_{q}", "logits.npy"))
            rel = rel_l2(got, want)
            import openvino
            # f32 arithmetic around the int8 ops, as kiln's: on a CPU with AMX OpenVINO would
            # otherwise pick bf16, for which its CPU plugin has no implementation of this model.
            got_ov = openvino.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x)[0]
            rel_ov = rel_l2(got_ov, want)
            ok = "QuantizeLinear" in ops and "DequantizeLinear" in ops and rel < 0.02 and rel_ov < 0.02
            why = f"ops {sorted(ops)}; relative L2 {rel:.4f} (ONNX Runtime), {rel_ov:.4f} (OpenVINO)"
        except Exception as e:  # the checker and ONNX Runtime raise their own types
            ok, why = False, str(e)[:300]
        r.check(f"quant_{q}_onnx_runs_in_peers", ok, why)
        r.ok(f"quant_{q}_onnx_reexport", ["export", f"cnn.{q}.q.onnx", "-o", f"cnn.{q}.rt.kiln"])
        rc, _, err = r.run(["compile", f"cnn.{q}.rt.kiln", "-o", f"cnn.{q}.rt.c.kiln", "-v"] + int8_target)
        r.check(f"quant_{q}_onnx_roundtrip_int8", rc == 0 and "lowered 4 convolutions to QFusedConv" in err, f"exit {rc}; {err[:400]!r}")
    r.error("quant_onnx_compiled_input", ["quant", "cnn.c.kiln", "-o", "q.onnx", "--quantizer", "x86", "--calib", cnn_in], 2,
            r"is compiled; quantize the exported model", no_file="q.onnx")
    # Streaming: a calibration set larger than the memory budget, read a file at a time (one file
    # of it all is refused under the same budget); and the progress line, on a terminal only.
    os.makedirs(os.path.join(work, "big_calib"), exist_ok=True)
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((320, 3, 32, 32)).astype(np.float32) for _ in range(3)]  # 3.75 MiB each
    for k, part in enumerate(parts):
        np.savez(os.path.join(work, "big_calib", f"part{k}.npz"), input=part)
    np.savez(os.path.join(work, "big_calib_one.npz"), input=np.concatenate(parts))
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.big.kiln", "--quantizer", "x86", "--calib", "big_calib", "--max-memory", "6MiB"])
    r.check("quant_streams_past_the_budget", rc == 0 and "calibrated on 960 samples" in err and "\r" not in err, f"exit {rc}; {err[:300]!r}")
    r.error("quant_one_file_past_the_budget", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", "big_calib_one.npz",
                                              "--max-memory", "6MiB"], 2, r"does not fit.*--max-memory", no_file="q.kiln")
    # Non-finite calibration or evaluation data is refused, naming the sample (one NaN pixel
    # once gave scales of 1e36 and constant logits).
    nan_batch = rng.standard_normal((5, 3, 32, 32)).astype(np.float32)
    nan_batch[3, 1, 2, 2] = np.nan
    np.savez(os.path.join(work, "nan_calib.npz"), input=nan_batch)
    r.error("quant_calib_nan", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", "nan_calib.npz"], 2,
            r"nan_calib\.npz: input 'input': sample 4 holds NaN or Inf", no_file="q.kiln")
    r.error("quant_eval_nan", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in, "--eval", "nan_calib.npz",
                               "--report"], 2, r"nan_calib\.npz: input 'input': sample 4 holds NaN or Inf", no_file="q.kiln")
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([r.kiln, "quant", "cnn.kiln", "-o", "cnn.tty.kiln", "--quantizer", "x86", "--calib", "big_calib", "--report"],
                            cwd=work, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    proc.wait()
    r.check("quant_progress_on_a_terminal", proc.returncode == 0 and re.search(rb"calibrating \d+/720 samples, [0-9.]+/s", shown)
            and re.search(rb"evaluating \d+/240 samples", shown), repr(shown[:300]))
    # --dynamic: no calibration; the linear layer's input quantized at run time, compiled to the
    # VNNI GEMM, its outputs the quantized model's reference ones.
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.dyn.kiln", "--quantizer", "x86", "--dynamic"])
    r.check("quant_dynamic", rc == 0 and "linear_dynamic 1" in err and "1 DynamicQuantizeLinear" in err, f"exit {rc}; {err[:400]!r}")
    rc, _, err = r.run(["compile", "cnn.dyn.kiln", "-o", "cnn.dyn.c.kiln", "-v"] + int8_target)
    r.check("quant_dynamic_compiled", rc == 0 and "(DynamicQuantizeLinear): kiln.dynamic_quantize_" in err
            and "(QFusedMatMul): kiln.qmatmul_u8s8_avx512" in err, f"exit {rc}; {err[:600]!r}")
    if not vnni:
        r.ok("quant_dynamic_compiled_here", ["compile", "cnn.dyn.kiln", "-o", "cnn.dyn.c.kiln"])
    r.ok("quant_dynamic_reference", ["run", "cnn.dyn.kiln", "--inputs", cnn_in, "--reference", "--output-dir", "qref_dyn"])
    r.ok("quant_dynamic_matches", ["run", "cnn.dyn.c.kiln", "--inputs", cnn_in, "--check-against", "qref_dyn", "--atol", "1e-4",
                                   "--rtol", "0"])
    r.error("quant_dynamic_xnnpack", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "xnnpack", "--dynamic"], 2,
            r"--dynamic is for --quantizer x86", no_file="q.kiln")
    # --weight-only: the linear layer's weight stored as int8 / int4 codes (blocks of 8 along K),
    # activations float, no calibration; compiled to WoqFusedMatMul with the quantized model's
    # reference outputs; as ONNX (INT8 / UINT4 with blocked DequantizeLinear) ONNX Runtime runs it.
    for bits, extra, stored in (("int8", [], r"weight i8 per channel \(\d+\)"), ("int4", ["--group-size", "8"], "weight u4 in blocks of 8")):
        rc, _, err = r.run(["quant", "cnn.kiln", "-o", f"cnn.wo{bits}.kiln", "--weight-only", bits] + extra)
        r.check(f"quant_weight_only_{bits}", rc == 0 and "linear_weight_only 1" in err and "calibrated on 0 samples" in err
                and "1 weight stored quantized" in err and "0 QuantizeLinear" in err, f"exit {rc}; {err[:400]!r}")
        rc, out, _ = r.run(["inspect", f"cnn.wo{bits}.kiln"])
        r.check(f"quant_weight_only_{bits}_inspect", rc == 0 and re.search(r"/fc/Gemm \(Gemm\): " + stored + "; out f32", out), out[-600:])
        rc, out, _ = r.run(["inspect", "--json", f"cnn.wo{bits}.kiln"])
        try:
            doc = json.loads(out)
            layers = {l["name"]: l for l in doc.get("quantized_layers", [])}
            ok = rc == 0 and re.fullmatch(stored, layers["/fc/Gemm"]["stored"]) and layers["/fc/Gemm"]["out"] == "f32" \
                and doc["quant_config"]["global"]["weight_only"] == bits
        except (ValueError, KeyError, TypeError) as e:
            ok, out = False, f"{e}: {out[-400:]}"
        r.check(f"quant_weight_only_{bits}_inspect_json", ok, out[-400:])
        rc, _, err = r.run(["compile", f"cnn.wo{bits}.kiln", "-o", f"cnn.wo{bits}.c.kiln", "-v"] + ([] if avx512 else ["--target", "avx512"]))
        r.check(f"quant_weight_only_{bits}_compiled", rc == 0 and "lowered 1 weight-only linear layer to WoqFusedMatMul" in err
                and "(WoqFusedMatMul): kiln.matmul_woq_avx512" in err, f"exit {rc}; {err[:800]!r}")
        rc, out, _ = r.run(["inspect", f"cnn.wo{bits}.c.kiln"])
        compiled_stored = stored.replace(r" per channel \(\d+\)", "")  # the compiled op names the codes' type only
        r.check(f"quant_weight_only_{bits}_compiled_inspect",
                rc == 0 and re.search(r"/fc/Gemm \(WoqFusedMatMul\): in f32, " + compiled_stored + "; out f32", out), out[-600:])
        if not avx512:  # what runs here: the weight dequantized to f32 at compile time
            rc, _, err = r.run(["compile", f"cnn.wo{bits}.kiln", "-o", f"cnn.wo{bits}.c.kiln", "-v"])
            r.check(f"quant_weight_only_{bits}_compiled_here", rc == 0 and "WoqFusedMatMul" not in err
                    and "folded 1 weight DequantizeLinear left float" in err and "int8 products" not in err, f"exit {rc}; {err[-800:]!r}")
        r.ok(f"quant_weight_only_{bits}_reference", ["run", f"cnn.wo{bits}.kiln", "--inputs", cnn_in, "--reference", "--output-dir", f"qref_wo{bits}"])
        r.ok(f"quant_weight_only_{bits}_matches", ["run", f"cnn.wo{bits}.c.kiln", "--inputs", cnn_in, "--check-against", f"qref_wo{bits}",
                                                  "--atol", "1e-4", "--rtol", "1e-4"])
        r.ok(f"quant_weight_only_{bits}_onnx", ["quant", "cnn.kiln", "-o", f"cnn.wo{bits}.onnx", "--weight-only", bits] + extra)
        path = os.path.join(work, f"cnn.wo{bits}.onnx")
        try:
            m = onnx.load(path)
            onnx.checker.check_model(m, full_check=True)
            types = {t.data_type for t in m.graph.initializer}
            got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
            want = np.load(os.path.join(work, f"qref_wo{bits}", "logits.npy"))
            rel = rel_l2(got, want)
            code = onnx.TensorProto.INT8 if bits == "int8" else onnx.TensorProto.UINT4
            ok, why = code in types and rel < 1e-4, f"initializer types {sorted(types)}; relative L2 {rel:.2e} against kiln"
        except Exception as e:  # the checker and ONNX Runtime raise their own types
            ok, why = False, str(e)[:300]
        r.check(f"quant_weight_only_{bits}_onnx_runs_in_ort", ok, why)
    # A --config of weight-only settings needs no calibration either; one with a static setting does.
    with open(os.path.join(work, "qconfig_wo.json"), "w") as f:
        json.dump({"global": {"weight_only": "int4", "group_size": 16}}, f)
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.wocfg.kiln", "--config", "qconfig_wo.json"])
    r.check("quant_weight_only_config", rc == 0 and "weight-only int4 (groups of 16)" in err and "calibrated on 0 samples" in err,
            f"exit {rc}; {err[:400]!r}")
    with open(os.path.join(work, "qconfig_mixed.json"), "w") as f:
        json.dump({"global": {"quantizer": "x86"}, "op_types": {"Gemm": {"weight_only": "int8"}}}, f)
    r.error("quant_config_static_needs_calib", ["quant", "cnn.kiln", "-o", "q.kiln", "--config", "qconfig_mixed.json"], 2,
            r"static quantization needs calibration inputs", no_file="q.kiln")
    r.error("quant_weight_only_bits", ["quant", "cnn.kiln", "-o", "q.kiln", "--weight-only", "int3"], 2,
            r"--weight-only 'int3' is not one of int8, int4", no_file="q.kiln")
    r.error("quant_weight_only_with_quantizer", ["quant", "cnn.kiln", "-o", "q.kiln", "--weight-only", "int8", "--quantizer", "x86"], 2,
            r"--weight-only quantizes the weights alone", no_file="q.kiln")
    r.error("quant_group_size_alone", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in, "--group-size", "32"],
            2, r"--group-size goes with --weight-only", no_file="q.kiln")
    r.error("quant_exclude_out_alone", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in,
                                        "--exclude-out", "e.json"], 2, r"--exclude-out goes with --min-sqnr", no_file="q.kiln")
    r.error("quant_report_one_sample", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in, "--report"],
            2, r"--report needs --eval or at least 2 calibration samples", no_file="q.kiln")
    r.error("quant_eval_without_report", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in, "--eval", cnn_in],
            2, r"--eval goes with --report or --min-sqnr", no_file="q.kiln")
    # --config: precedence node name > op type > global; null keeps nodes float; its errors.
    with open(os.path.join(work, "qconfig.json"), "w") as f:
        json.dump({"op_types": {"Gemm": None}, "nodes": {"/conv2/Conv": {"quantizer": "xnnpack", "per_tensor": True},
                                                         "/relu/Relu": {"quantizer": "xnnpack", "per_tensor": True}}}, f)
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.cfg.kiln", "--quantizer", "x86", "--calib", cnn_in, "--config", "qconfig.json", "-v"])
    r.check("quant_config", rc == 0 and "kiln quant: x86+xnnpack: 10 of 13 nodes annotated (1 kept float by --config)" in err
            and "node '/conv2/Conv': conv_Relu (xnnpack)" in err and "node '/stem/conv/Conv': conv_Relu (x86)" in err
            and "node '/fc/Gemm'" not in err, f"exit {rc}; {err[:700]!r}")
    with open(os.path.join(work, "qconfig_global.json"), "w") as f:
        json.dump({"global": {"quantizer": "xnnpack"}, "op_types": {"Conv": None}}, f)
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.cfg2.kiln", "--calib", cnn_in, "--config", "qconfig_global.json"])
    r.check("quant_config_global", rc == 0 and "kiln quant: xnnpack: " in err and "(4 kept float by --config)" in err,
            f"exit {rc}; {err[:400]!r}")
    for name, doc, message in (
            ("unknown_key", {"global": {"quantizer": "x86"}, "node": {}}, r"qconfig_bad\.json: node: unknown key \(known: global, op_types, nodes\)"),
            ("bad_quantizer", {"nodes": {"x": {"quantizer": "tflite"}}}, r"qconfig_bad\.json: nodes\.x\.quantizer: 'tflite' is not one of x86, xnnpack"),
            ("per_tensor_x86", {"op_types": {"Conv": {"quantizer": "x86", "per_tensor": True}}},
             r"qconfig_bad\.json: op_types\.Conv\.per_tensor: is for the xnnpack quantizer"),
            ("not_json", None, r"qconfig_bad\.json: is not valid JSON")):
        with open(os.path.join(work, "qconfig_bad.json"), "w") as f:
            f.write("{nope" if doc is None else json.dumps(doc))
        r.error(f"quant_config_{name}", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in,
                                          "--config", "qconfig_bad.json"], 2, message, no_file="q.kiln")
    r.error("quant_config_no_quantizer", ["quant", "cnn.kiln", "-o", "q.kiln", "--calib", cnn_in], 2,
            r"no quantizer given \(--quantizer x86\|xnnpack, --weight-only int8\|int4, or \"global\" in --config\)", no_file="q.kiln")
    # .npy files named after the inputs, and ONNX test_data_set folders (input_K.pb), alone or many.
    os.makedirs(os.path.join(work, "calib_npy"), exist_ok=True)
    np.save(os.path.join(work, "calib_npy", "input.npy"), np.concatenate([x, -x], axis=0))
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.npy.kiln", "--quantizer", "x86", "--calib", "calib_npy"])
    r.check("quant_calib_npy_folder", rc == 0 and "calibrated on 2 samples" in err, f"exit {rc}; {err[:300]!r}")
    for k in range(2):
        d = os.path.join(work, "sets", f"test_data_set_{k}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x * (k + 1), "input").SerializeToString())
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.sets.kiln", "--quantizer", "xnnpack", "--calib", "sets"])
    r.check("quant_calib_test_data_sets", rc == 0 and "calibrated on 2 samples" in err, f"exit {rc}; {err[:300]!r}")
    rc, _, err = r.run(["quant", "cnn.kiln", "-o", "cnn.set0.kiln", "--quantizer", "x86", "--calib",
                        os.path.join("sets", "test_data_set_0")])
    r.check("quant_calib_one_test_data_set", rc == 0 and "calibrated on 1 sample;" in err, f"exit {rc}; {err[:300]!r}")
    os.makedirs(os.path.join(work, "calib_wrong_npy"), exist_ok=True)
    np.save(os.path.join(work, "calib_wrong_npy", "other.npy"), x)
    r.error("quant_calib_npy_missing", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", "calib_wrong_npy"],
            2, r"calib_wrong_npy: input 'input': has no input\.npy", no_file="q.kiln")
    os.makedirs(os.path.join(work, "calib_empty"), exist_ok=True)
    r.error("quant_calib_empty", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", "calib_empty"],
            2, r"holds no calibration inputs", no_file="q.kiln")
    r.error("quant_unknown_quantizer", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "tflite", "--calib", cnn_in], 2,
            r"--quantizer 'tflite' is not one of x86, xnnpack", no_file="q.kiln")
    r.error("quant_no_calib", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86"], 2, r"needs calibration inputs",
            no_file="q.kiln")
    r.error("quant_compiled", ["quant", "cnn.c.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in], 2,
            r"is compiled; quantize the exported model", no_file="q.kiln")
    np.savez(os.path.join(work, "wrong_name.npz"), other=x)
    r.error("quant_calib_missing_input", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", "wrong_name.npz"],
            2, r"wrong_name\.npz: input 'input': has no array of this name", no_file="q.kiln")
    r.error("quant_calib_not_npz", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--calib", cnn_in + ".txt"], 2,
            r"is not an \.npz of calibration inputs", no_file="q.kiln")
    r.error("quant_per_tensor_x86", ["quant", "cnn.kiln", "-o", "q.kiln", "--quantizer", "x86", "--per-tensor", "--calib", cnn_in],
            2, r"--per-tensor is for the xnnpack quantizer", no_file="q.kiln")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--update", action="store_true")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    return run_in_temp_dir("kiln-cli-", lambda work: Runner(kiln, work, args.update), run_all)


def run_all(r, work):
    samples = os.path.join(ROOT, "samples")
    # --help and --version.
    r.golden("help", ["--help"])
    for verb in ("export", "quant", "compile", "run", "inspect", "profile"):
        r.golden(f"help_{verb}", [verb, "--help"])
    r.ok("version", ["--version"], stdout_has="kiln ")
    r.ok("list_ops", ["export", "--list-ops"], stdout_has="Relu ")

    # Each subcommand on every sample, and the pipeline through stdin/stdout.
    for name in ("mlp", "cnn", "transformer"):
        model = os.path.join(samples, name + ".onnx")
        r.ok(f"export_{name}", ["export", model, "-o", name + ".kiln"])
        r.ok(f"inspect_{name}", ["inspect", name + ".kiln"], stdout_has="stage: exported")
        r.ok(f"inspect_json_{name}", ["inspect", "--json", name + ".kiln"], stdout_has='"schema": "kiln.inspect"')
        r.ok(f"inspect_text_{name}", ["inspect", "--text", name + ".kiln"])
        r.ok(f"run_{name}", ["run", name + ".kiln", "--inputs", os.path.join(samples, name + ".inputs.npz"),
                             "--output-dir", name + ".out", "--check-against",
                             os.path.join(samples, name + ".expected")])
        r.ok(f"run_random_{name}", ["run", name + ".kiln", "--seed", "3", "--output-dir", name + ".rand"])
    compile_tests(r, work, samples)
    quant_tests(r, work, samples)

    # Timing: a table on stderr, or JSON on stdout; --input-shape sizes random inputs.
    rc, out, err = r.run(["run", "cnn.kiln", "--iters", "3", "--warmup", "1"])
    r.check("run_iters_table", rc == 0 and out == "" and "median ms" in err and "3 timed runs after 1 warm-up" in err
            and re.search(r"start: load [0-9.]+ ms, session [0-9.]+ ms, first run [0-9.e+-]+ ms; peak RSS [0-9.]+ MB", err),
            f"exit {rc}; stdout {out[:200]!r}; stderr {err[:300]!r}")
    # The default thread count is the cores this process may run on: with one CPU allowed (as
    # `taskset -c` or a container's cpuset leaves it), one thread, where the machine has more.
    whole = re.search(r"warm-up, (\d+) threads?\n", err)
    if hasattr(os, "sched_setaffinity") and whole and int(whole.group(1)) >= 2:
        one = min(os.sched_getaffinity(0))
        p = subprocess.run([r.kiln, "run", "cnn.kiln", "--iters", "1"], capture_output=True, cwd=r.work,
                           preexec_fn=lambda: os.sched_setaffinity(0, {one}))
        err_one = p.stderr.decode(errors="replace")
        r.check("run_threads_follow_affinity", p.returncode == 0 and "warm-up, 1 thread\n" in err_one,
                f"exit {p.returncode}; stderr {err_one[:300]!r}")
    # More threads than those cores: run anyway, with a warning; as many: none.
    if whole:
        cores = int(whole.group(1))
        rc, out, err = r.run(["run", "cnn.kiln", "--iters", "1", "--threads", str(cores + 1)])
        warned = (f"kiln run: warning: --threads {cores + 1} is more than the {cores} core{'s' if cores > 1 else ''} kiln may use here"
                  f" (its affinity mask and CPU quota): the threads will take turns\n")
        r.check("run_threads_above_cores_warn", rc == 0 and warned in err and f"warm-up, {cores + 1} threads\n" in err,
                f"exit {rc}; stderr {err[:400]!r}")
        rc, out, err = r.run(["run", "cnn.kiln", "--iters", "1", "--threads", str(cores)])
        r.check("run_threads_at_cores_quiet", rc == 0 and "warning" not in err, f"exit {rc}; stderr {err[:400]!r}")
    rc, out, err = r.run(["run", "mlp.kiln", "--iters", "4", "--json", "--input-shape", "input=8x16", "--threads", "3"])
    try:
        j = json.loads(out)
        lat = j["latency_ms"]
        good = (rc == 0 and j["schema"] == "kiln.run" and j["schema_version"] == 1 and j["iters"] == 4
                and j["warmup"] == 1 and j["threads"] == 3 and j["reference"] is False and j["input_shapes"] == {"input": [8, 16]}
                and 0 < lat["min"] <= lat["median"] <= lat["p90"] and lat["min"] <= lat["mean"]
                and set(j["startup_ms"]) == {"load", "session", "first_run"} and min(j["startup_ms"].values()) >= 0
                and j["startup_ms"]["first_run"] > 0 and j["peak_rss_bytes"] > j["arena_bytes"])
    except (ValueError, KeyError, TypeError) as e:
        good, err = False, f"{err} ({e})"
    r.check("run_iters_json", good, f"exit {rc}; stdout {out[:300]!r}; stderr {err[:300]!r}")
    rc, out, err = r.run(["run", "mlp.kiln", "--iters", "2", "--output-dir", "timed.out"])
    r.check("run_iters_writes_outputs", rc == 0 and os.path.exists(os.path.join(work, "timed.out", "logits.npy")),
            f"exit {rc}; stderr {err[:300]!r}")
    r.error("run_json_needs_iters", ["run", "mlp.kiln", "--json"], 2, r"--json requires --iters")
    r.error("run_input_shape_unknown", ["run", "mlp.kiln", "--iters", "1", "--input-shape", "nosuch=1x16"], 2,
            r"input 'nosuch': the model has no input of this name")
    r.error("run_input_shape_symbolic", ["run", "mlp.kiln", "--iters", "1", "--input-shape", "input=batchx16"], 2,
            r"a random input needs numbers for every dim")
    r.error("run_input_shape_wrong", ["run", "mlp.kiln", "--iters", "1", "--input-shape", "input=2x17"], 2,
            r"input 'input': expected shape batchx16 but got 2x17")
    r.error("run_input_shape_and_data", ["run", "mlp.kiln", "--inputs", os.path.join(samples, "mlp.inputs.npz"),
                                         "--input-shape", "input=2x16"], 2, r"is given as data")
    r.error("run_random_input_past_budget", ["run", "mlp.kiln", "--input-shape", "input=100000000x16", "--max-memory", "64MiB"], 2,
            r"mlp\.kiln: input 'input': a random input of this shape needs 6\.0 GiB .* past the memory limit of 64 MiB")
    r.error("run_iters_zero", ["run", "mlp.kiln", "--iters", "0"], 2, r"--iters: 0 is not a whole number from 1 up")
    r.error("run_iters_fraction", ["run", "mlp.kiln", "--iters", "2.5"], 2, r"--iters: 2\.5 is not a whole number from 1 up")
    r.error("run_warmup_negative", ["run", "mlp.kiln", "--iters", "2", "--warmup", "-1"], 2,
            r"--warmup: -1 is not a whole number from 0 up")
    r.error("run_threads_zero", ["run", "mlp.kiln", "--threads", "0"], 2, r"--threads: 0 is not a whole number from 1 to 1024")
    # More threads than a pool can be made with (GNU OpenMP crashed the process at 100,000).
    r.error("run_threads_too_many", ["run", "mlp.kiln", "--threads", "100000"], 2,
            r"--threads: 100000 is not a whole number from 1 to 1024")
    # --reference: every node on its reference kernel, said in -v and in the timing.
    rc, out, err = r.run(["run", "cnn.kiln", "--reference", "-v", "--iters", "1", "--threads", "1"])
    kernel_lines = [l for l in err.splitlines() if l.startswith("node '")]
    r.check("run_reference", rc == 0 and kernel_lines and all(l.endswith("): ref") or l.endswith("): ref (a view of its input's memory: nothing to run)") for l in kernel_lines)
            and "1 thread, reference kernels" in err, f"exit {rc}; stderr {err[:400]!r}")

    with open(os.path.join(samples, "mlp.onnx"), "rb") as f:
        piped = subprocess.run([r.kiln, "export", "-", "-o", "-"], input=f.read(), capture_output=True).stdout
    r.ok("inspect_stdin", ["inspect", "-"], stdout_has="stage: exported", stdin=piped)
    # The same command twice gives the same bytes (the command line is part of the provenance).
    a = r.run(["export", os.path.join(samples, "cnn.onnx"), "-o", "again.kiln"])
    first = open(os.path.join(work, "again.kiln"), "rb").read()
    b = r.run(["export", os.path.join(samples, "cnn.onnx"), "-o", "again.kiln"])
    same = first == open(os.path.join(work, "again.kiln"), "rb").read()
    r.check("export_byte_identical", a[0] == 0 and b[0] == 0 and same, "two exports differ")

    # Usage errors.
    rc, _, err = r.run(["frobnicate"])
    r.check("unknown_subcommand", rc == 2, f"exit {rc}: {err}")
    r.error("export_missing_file", ["export", "missing.onnx", "-o", "o.kiln"], 2, r"missing\.onnx: cannot open file")
    r.error("export_no_output", ["export", os.path.join(samples, "mlp.onnx")], 2, r"no output given")
    r.error("export_bad_shape", ["export", os.path.join(samples, "mlp.onnx"), "-o", "o.kiln", "--input-shape", "x=2x-1"],
            2, r"--input-shape 'x=2x-1'", no_file="o.kiln")
    r.error("export_unknown_input_shape", ["export", os.path.join(samples, "mlp.onnx"), "-o", "o.kiln",
                                           "--input-shape", "nosuch=1x2"], 2, r"input 'nosuch'", no_file="o.kiln")

    # Unsupported ops: grouped by type with counts; -v names every node.
    save(tiny_model(op="FrobnicateOp"), os.path.join(work, "unsupported.onnx"))
    r.error("export_unsupported", ["export", "unsupported.onnx", "-o", "u.kiln"], 2,
            r"unsupported ops: FrobnicateOp \(2\)$", no_file="u.kiln")
    r.error("export_unsupported_verbose", ["export", "unsupported.onnx", "-o", "u.kiln", "-v"], 2,
            r"FrobnicateOp \(2\) \[first, second\]", no_file="u.kiln")
    save(tiny_model(op="Relu", domain="com.example"), os.path.join(work, "custom.onnx"))
    r.error("export_unknown_domain", ["export", "custom.onnx", "-o", "u.kiln"], 2,
            r"unsupported ops: com\.example::Relu \(2\)", no_file="u.kiln")

    # The corrupt .onnx catalogue.
    good = tiny_model().SerializeToString()
    with open(os.path.join(work, "truncated.onnx"), "wb") as f:
        f.write(good[: len(good) // 2])
    r.error("onnx_truncated", ["export", "truncated.onnx", "-o", "t.kiln"], 2, r"truncated\.onnx: not a valid ONNX model", no_file="t.kiln")
    with open(os.path.join(work, "garbage.onnx"), "wb") as f:
        f.write(b"\xff\xfe not a protobuf at all \x00\x01")
    r.error("onnx_garbage", ["export", "garbage.onnx", "-o", "t.kiln"], 2, r"not a valid ONNX model", no_file="t.kiln")
    open(os.path.join(work, "empty.onnx"), "wb").close()
    r.error("onnx_empty", ["export", "empty.onnx", "-o", "t.kiln"], 2, r"not a valid ONNX model", no_file="t.kiln")
    save(tiny_model(dims=(2, 1 << 50)), os.path.join(work, "absurd.onnx"))
    r.error("onnx_absurd_dims", ["export", "absurd.onnx", "-o", "t.kiln"], 2, r"input 'x': has dim 1125899906842624", no_file="t.kiln")
    sub = os.path.join(work, "sub")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(work, "outside.bin"), "wb") as f:
        f.write(np.ones(4, np.float32).tobytes())
    save(external_model(work, "../outside.bin"), os.path.join(sub, "escape.onnx"))
    r.error("onnx_external_escapes", ["export", "sub/escape.onnx", "-o", "t.kiln"], 2, r"escapes the model's folder", no_file="t.kiln")
    save(external_model(work, os.path.join(work, "outside.bin")), os.path.join(sub, "absolute.onnx"))
    r.error("onnx_external_absolute", ["export", "sub/absolute.onnx", "-o", "t.kiln"], 2, r"must be relative", no_file="t.kiln")
    os.symlink(os.path.join(work, "outside.bin"), os.path.join(sub, "link.bin"))
    save(external_model(work, "link.bin"), os.path.join(sub, "symlink.onnx"))
    r.error("onnx_external_symlink_escapes", ["export", "sub/symlink.onnx", "-o", "t.kiln"], 2, r"resolves outside", no_file="t.kiln")
    save(external_model(work, "nosuch.bin"), os.path.join(sub, "missing_ext.onnx"))
    r.error("onnx_external_missing", ["export", "sub/missing_ext.onnx", "-o", "t.kiln"], 2, r"cannot open external data file 'nosuch\.bin'", no_file="t.kiln")
    # A folder where a file belongs: the external data (it once asked for exabytes, "out of
    # memory") and the model itself (an internal error, exit 1).
    os.makedirs(os.path.join(sub, "folder.bin"), exist_ok=True)
    save(external_model(work, "folder.bin"), os.path.join(sub, "folder_ext.onnx"))
    r.error("onnx_external_folder", ["export", "sub/folder_ext.onnx", "-o", "t.kiln"], 2,
            r"external data path 'folder\.bin' is not a regular file", no_file="t.kiln")
    r.error("onnx_model_folder", ["export", "sub", "-o", "t.kiln"], 2, r"kiln export: error: sub: is a directory, expected a file$",
            no_file="t.kiln")
    with open(os.path.join(sub, "short.bin"), "wb") as f:
        f.write(b"\0" * 8)
    save(external_model(work, "short.bin"), os.path.join(sub, "short_ext.onnx"))
    r.error("onnx_external_short", ["export", "sub/short_ext.onnx", "-o", "t.kiln"], 2, r"tensor 'w'", no_file="t.kiln")
    with open(os.path.join(sub, "ok.bin"), "wb") as f:
        f.write(np.ones(4, np.float32).tobytes())
    save(external_model(work, "ok.bin"), os.path.join(sub, "good_ext.onnx"))
    r.ok("onnx_external_ok", ["export", "sub/good_ext.onnx", "-o", "ext.kiln"])

    # kiln run: inputs that do not fit the model, and corrupt .npy/.npz files.
    np.save(os.path.join(work, "wrong_dtype.npy"), np.ones((2, 4), np.float64))
    np.save(os.path.join(work, "wrong_shape.npy"), np.ones((2, 5, 1), np.float32))
    mlp_in = onnx.load(os.path.join(samples, "mlp.onnx")).graph.input[0]
    in_name = mlp_in.name
    feat = mlp_in.type.tensor_type.shape.dim[1].dim_value
    r.error("run_wrong_dtype", ["run", "mlp.kiln", "--input", f"{in_name}=wrong_dtype.npy"], 2, rf"input '{in_name}': expected f32 but got f64")
    r.error("run_wrong_shape", ["run", "mlp.kiln", "--input", f"{in_name}=wrong_shape.npy"], 2, rf"input '{in_name}': expected shape")
    np.save(os.path.join(work, "good.npy"), np.ones((2, feat), np.float32))
    r.error("run_unknown_input", ["run", "mlp.kiln", "--input", "nosuch=good.npy"], 2, r"input 'nosuch': the model has no input")
    with open(os.path.join(work, "bad_header.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4' }\n")
    r.error("npy_bad_header", ["run", "mlp.kiln", "--input", f"{in_name}=bad_header.npy"], 2, r"bad_header\.npy")
    with open(os.path.join(work, "pickled.npy"), "wb") as f:
        np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    r.error("npy_pickled", ["run", "mlp.kiln", "--input", f"{in_name}=pickled.npy"], 2, r"pickled\.npy: .*object")
    np.savez(os.path.join(work, "wrong.npz"), **{in_name: np.ones((3, feat + 1), np.float32)})
    r.error("npz_wrong_shape", ["run", "mlp.kiln", "--inputs", "wrong.npz"], 2, rf"input '{in_name}': expected shape")
    with open(os.path.join(work, "corrupt.npz"), "wb") as f:
        f.write(b"PK\x03\x04" + b"\0" * 20)
    r.error("npz_corrupt", ["run", "mlp.kiln", "--inputs", "corrupt.npz"], 2, r"corrupt\.npz")
    r.error("run_missing_model", ["run", "nosuch.kiln"], 2, r"nosuch\.kiln")
    with open(os.path.join(work, "not_a_model.kiln"), "wb") as f:
        f.write(b"definitely not flatbuffers")
    r.error("run_corrupt_model", ["run", "not_a_model.kiln"], 2, r"not_a_model\.kiln")
    good_kiln = open(os.path.join(work, "mlp.kiln"), "rb").read()
    with open(os.path.join(work, "truncated.kiln"), "wb") as f:
        f.write(good_kiln[: len(good_kiln) // 2])
    r.error("kiln_truncated", ["run", "truncated.kiln"], 2, r"truncated\.kiln: .*truncated")
    with open(os.path.join(work, "bad_ident.kiln"), "wb") as f:
        f.write(good_kiln[:8] + b"NOPE" + good_kiln[12:])
    r.error("kiln_bad_identifier", ["inspect", "bad_ident.kiln"], 2, r"bad_ident\.kiln: ")
    r.error("inspect_corrupt_model", ["inspect", "not_a_model.kiln"], 2, r"not_a_model\.kiln")

    # --check-against: a mismatch is exit 3, missing expected files are user errors.
    os.makedirs(os.path.join(work, "wrong_expected"), exist_ok=True)
    out_name = onnx.load(os.path.join(samples, "mlp.onnx")).graph.output[0].name
    ref = np.load(os.path.join(samples, "mlp.expected", out_name + ".npy"))
    np.save(os.path.join(work, "wrong_expected", out_name + ".npy"), ref + 1.0)
    rc, out, err = r.run(["run", "mlp.kiln", "--inputs", os.path.join(samples, "mlp.inputs.npz"), "--check-against", "wrong_expected"])
    r.check("run_check_mismatch", rc == 3 and "FAILED" in out and ONE_LINE.match(err.strip()), f"exit {rc}: {err}")
    r.error("run_check_missing", ["run", "mlp.kiln", "--check-against", "no_such_dir"], 2, r"no_such_dir")


if __name__ == "__main__":
    sys.exit(main())
