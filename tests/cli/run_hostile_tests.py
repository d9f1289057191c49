#!/usr/bin/env python3
"""Hostile inputs: the models and data that coverage-guided fuzzing found breaking kiln's
promise (one line on stderr and exit 2, never a crash, bounded memory), each kept as a
regression case, plus a sweep of the committed fuzz corpora under --max-memory.

Every case runs the Release `kiln` as a user would and checks the exit code, that stderr is
exactly one line in kiln's format matching a pattern, the time taken and the peak RSS of the
process (from wait4). Cases that are valid ONNX with surprising values (negative Pad pads, a
grid of NaN and infinities) must instead succeed with the right output."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from checks import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
ONE_LINE = re.compile(r"^kiln (export|run|inspect): error: .+$")
F, I64 = T.FLOAT, T.INT64
vi = h.make_tensor_value_info
BIG = 1 << 40  # the largest dim ONNX export accepts; two of them and a symbol multiply past int64
RSS_LIMIT_KB = 300 * 1024  # peak RSS allowed with --max-memory 256MiB
TIME_SCALE = 1  # sanitizer builds get more time


def save(path, nodes, inputs, outputs, inits=(), opset=18):
    g = h.make_graph(nodes, os.path.basename(path), inputs, outputs, list(inits))
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8), path)
    return path


def run(kiln, args, cwd, timeout=60):
    """Runs kiln; returns (exit code, stdout, stderr, seconds, peak RSS in KB)."""
    start = time.monotonic()
    with open(os.path.join(cwd, ".out"), "wb") as out, open(os.path.join(cwd, ".err"), "wb") as err:
        p = subprocess.Popen([kiln] + args, cwd=cwd, stdout=out, stderr=err)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, usage = os.wait4(p.pid, 0)
                break
            time.sleep(0.005)
    rc = os.waitstatus_to_exitcode(status)
    read = lambda f: open(os.path.join(cwd, f), "rb").read().decode(errors="replace")
    return rc, read(".out"), read(".err"), time.monotonic() - start, usage.ru_maxrss


class Checker(Checks):
    def __init__(self, kiln, work):
        super().__init__()
        self.kiln, self.work = kiln, work

    def error(self, name, args, pattern, max_seconds=20):
        rc, out, err, secs, rss = run(self.kiln, args, self.work)
        lines = [l for l in err.splitlines() if l.strip()]
        ok = rc == 2 and len(lines) == 1 and ONE_LINE.match(lines[0]) and re.search(pattern, lines[0])
        ok = ok and len(lines[0]) <= 1500 and secs <= max_seconds * TIME_SCALE and rss <= RSS_LIMIT_KB
        self.check(name, ok, f"exit {rc} (want 2), {secs:.1f} s, {rss // 1024} MB; stderr {err.strip()[:400]!r}; want /{pattern}/")

    def ok(self, name, args, stdout_has):
        rc, out, err, secs, rss = run(self.kiln, args, self.work)
        self.check(name, rc == 0 and stdout_has in out and rss <= RSS_LIMIT_KB,
                   f"exit {rc}, {rss // 1024} MB; stderr {err.strip()[:300]!r}; stdout {out[:200]!r}")


def export(c, name, *args):
    """Exports work/name.onnx to name.kiln (must succeed)."""
    rc, out, err, _, _ = run(c.kiln, ["export", name + ".onnx", "-o", name + ".kiln", *args], c.work)
    c.check(f"export_{name}", rc == 0, f"exit {rc}: {err.strip()[:300]}")


def findings(c):
    w = c.work
    p = lambda name: os.path.join(w, name)
    limit = ["--max-memory", "256MiB"]

    # inspect read values[-1] of a DFT whose optional input 1 is omitted (ONNX test_dft).
    rc, out, err, _, _ = run(c.kiln, ["export", os.path.join(NODE_DATA, "test_dft", "model.onnx"), "-o", "dft.kiln"], w)
    c.ok("inspect_dft_omitted_input", ["inspect", "dft.kiln"], "DFT")

    # Signed overflow in dim arithmetic: each becomes a user error naming the overflow.
    save(p("flatten.onnx"), [h.make_node("Flatten", ["x"], ["y"], axis=1)], [vi("x", F, ["n", BIG, BIG])], [vi("y", F, None)])
    c.error("overflow_flatten", ["export", "flatten.onnx", "-o", "o.kiln"], r"node 'Flatten_0': dims .* overflow int64")
    save(p("reshape.onnx"), [h.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", F, ["n", BIG, BIG])], [vi("y", F, None)],
         [nh.from_array(np.array([0, -1, 2], np.int64), "s")])
    c.error("overflow_reshape_minus_one", ["export", "reshape.onnx", "-o", "o.kiln"], r"multiply past the int64 range")
    save(p("convint.onnx"), [h.make_node("ConvInteger", ["x", "w"], ["y"], pads=[1 << 62, 1 << 62, 1 << 62, 1 << 62])],
         [vi("x", T.UINT8, [1, 1, 4, 4]), vi("w", T.UINT8, [1, 1, 2, 2])], [vi("y", T.INT32, None)])
    c.error("overflow_conv_integer", ["export", "convint.onnx", "-o", "o.kiln"], r"overflows int64")
    save(p("gru.onnx"), [h.make_node("GRU", ["x", "w", "r"], ["y"], hidden_size=1 << 62)],
         [vi("x", F, [2, 1, 3]), vi("w", F, [1, 6, 3]), vi("r", F, [1, 6, 2])], [vi("y", F, None)])
    c.error("overflow_gru_gates", ["export", "gru.onnx", "-o", "o.kiln"], r"W has 6 rows; expected 3 x hidden_size")
    save(p("pad.onnx"), [h.make_node("Pad", ["x", "pads"], ["y"])], [vi("x", F, [2, 2])], [vi("y", F, None)],
         [nh.from_array(np.array([1 << 62, 0, 1 << 62, 0], np.int64), "pads")])
    c.error("overflow_pad", ["export", "pad.onnx", "-o", "o.kiln"], r"pads .* overflow int64")
    save(p("col2im.onnx"), [h.make_node("Col2Im", ["x", "img", "blk"], ["y"])], [vi("x", F, [1, 4, 4])], [vi("y", F, None)],
         [nh.from_array(np.array([4, 4], np.int64), "img"), nh.from_array(np.array([1 << 32, 1 << 32], np.int64), "blk")])
    c.error("overflow_col2im", ["export", "col2im.onnx", "-o", "o.kiln"], r"block_shape .* multiplies past the int64 range")

    # An initializer whose few values declare 272 GiB (fuzz_onnx_export): its values are counted
    # before anything is allocated; one whose raw data is real but past --max-memory names itself.
    short = onnx.TensorProto(name="w", data_type=F, dims=[118, 97, 108, 117, 101, 5], float_data=[1, 2, 3, 4, 5])
    save(p("init_short.onnx"), [h.make_node("Identity", ["w"], ["y"])], [], [vi("y", F, None)], [short])
    c.error("initializer_values_short_of_its_shape", ["export", "init_short.onnx", "-o", "o.kiln"],
            r"init_short.onnx: tensor 'w': has 5 values but shape 118x97x108x117x101x5 needs 73038986280")
    save(p("init_big.onnx"), [h.make_node("Identity", ["w"], ["y"])], [], [vi("y", F, None)],
         [nh.from_array(np.ones((1024, 1024), np.float32), "w")])
    # (Reading the file is charged too, except under the sanitizers, whose allocator kiln keeps.)
    c.error("initializer_past_max_memory", ["export", "init_big.onnx", "-o", "o.kiln", "--max-memory", "3MiB"],
            r"init_big.onnx: (reading it|tensor 'w':) needs .* past the memory limit of 3\.0 MiB")

    # A shape input declared with 10^8 entries: refused without allocating 40 bytes per entry.
    for op in ("Reshape", "Expand"):
        save(p(op + "_long.onnx"), [h.make_node(op, ["x", "s"], ["y"])], [vi("x", F, [2]), vi("s", I64, [100_000_000])],
             [vi("y", F, None)])
        c.error(f"long_shape_input_{op.lower()}", ["export", op + "_long.onnx", "-o", "o.kiln"],
                r"the shape input has 100000000 entries; kiln supports ranks up to 64", max_seconds=5)

    # Converters indexed inputs that are not there.
    save(p("castlike.onnx"), [h.make_node("CastLike", [], ["y"])], [vi("x", F, [2])], [vi("y", F, None)])
    c.error("castlike_no_inputs", ["export", "castlike.onnx", "-o", "o.kiln"], r"has 0 inputs but CastLike-15 takes 2")
    save(p("clip6.onnx"), [h.make_node("Clip", [], ["y"])], [vi("x", F, [2])], [vi("y", F, None)], opset=6)
    c.error("clip6_no_inputs", ["export", "clip6.onnx", "-o", "o.kiln"], r"has 0 inputs but Clip-6 takes 1")

    # Pad with negative pads crops (ONNX semantics); it crashed on a null output tensor.
    save(p("pad_neg.onnx"), [h.make_node("Pad", ["x", "pads"], ["y"], mode="edge")], [vi("x", F, [1, 1, 4, 4]),
         vi("pads", I64, [8])], [vi("y", F, None)])
    export(c, "pad_neg")
    np.save(p("pads.npy"), np.array([0, 0, 0, -1, 0, 0, 0, 0], np.int64))
    c.ok("pad_negative_crops", ["run", "pad_neg.kiln", "--input", "pads=pads.npy"], "y: f32 1x1x4x3")

    # MaxUnpool with a negative output_shape: a user error, at export or at run time.
    save(p("unpool.onnx"), [h.make_node("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
         [vi("x", F, [1, 1, 2, 2]), vi("i", I64, [1, 1, 2, 2]), vi("s", I64, [4])], [vi("y", F, None)])
    export(c, "unpool")
    np.save(p("unpool_shape.npy"), np.array([1, 1, -1, 5], np.int64))
    c.error("max_unpool_negative_shape", ["run", "unpool.kiln", "--input", "s=unpool_shape.npy"],
            r"output_shape \[1, 1, -1, 5\] has a negative dim")

    # Expanded Range (a Loop) with delta 0 never ends: bounded by the memory it accumulates. These
    # two loops fill a budget of 32 MiB: they fill it in small steps, and 256 MiB took 45 and 18 s
    # under the sanitizers (60 s is the kill; 2.4 s in a Release build).
    shutil.copy(os.path.join(NODE_DATA, "test_range_float_type_positive_delta_expanded", "model.onnx"), p("range.onnx"))
    export(c, "range")
    m = onnx.load(p("range.onnx"))
    names = [i.name for i in m.graph.input]
    np.savez(p("range_in.npz"), **{names[0]: np.array(1, np.float32), names[1]: np.array(10, np.float32),
                                    names[2]: np.array(0, np.float32)})
    c.error("range_expanded_delta_zero", ["run", "range.kiln", "--inputs", "range_in.npz", "--max-memory", "32MiB"],
            r"past the memory limit of 32 MiB \(--max-memory\)")

    # A Loop whose trip count (1.8e11) comes from an input tensor: bounded the same way.
    body = h.make_graph([h.make_node("Identity", ["c"], ["co"]), h.make_node("Add", ["v", "one"], ["vo"]),
                         h.make_node("Identity", ["vo"], ["scan"])], "body",
                        [vi("i", I64, []), vi("c", T.BOOL, []), vi("v", F, [256])],
                        [vi("co", T.BOOL, []), vi("vo", F, [256]), vi("scan", F, [256])],
                        [nh.from_array(np.ones(256, np.float32), "one")])
    save(p("loop.onnx"), [h.make_node("Loop", ["n", "", "v0"], ["vf", "scan"], body=body)],
         [vi("n", I64, []), vi("v0", F, [256])], [vi("vf", F, None), vi("scan", F, None)])
    export(c, "loop")
    np.save(p("trip.npy"), np.array(180_000_000_000, np.int64))
    c.error("loop_trip_count_from_data", ["run", "loop.kiln", "--input", "n=trip.npy", "--max-memory", "32MiB"],
            r"past the memory limit of 32 MiB")

    # Window sizes and crop shapes from data: refused before allocating, named with their size.
    for op in ("BlackmanWindow", "HammingWindow"):
        save(p(op + ".onnx"), [h.make_node(op, ["n"], ["y"])], [vi("n", I64, [])], [vi("y", F, None)])
        export(c, op)
        np.save(p("n.npy"), np.array(536_870_914, np.int64))
        c.error(f"window_{op}", ["run", op + ".kiln", "--input", "n=n.npy", *limit],
                r"output 0 'y' of shape 536870914 \(f32\) needs 2\.0 GiB .* past the memory limit of 256 MiB", max_seconds=5)
    save(p("ccp.onnx"), [h.make_node("CenterCropPad", ["x", "s"], ["y"])], [vi("x", F, [2, 2, 2]), vi("s", I64, [3])],
         [vi("y", F, None)])
    export(c, "ccp")
    np.save(p("ccp_big.npy"), np.array([2, 2, 1 << 40], np.int64))
    c.error("center_crop_pad_huge", ["run", "ccp.kiln", "--input", "s=ccp_big.npy", *limit],
            r"past the memory limit of 256 MiB", max_seconds=5)
    # An empty result whose other dim is huge needs no memory and no work.
    np.save(p("ccp_empty.npy"), np.array([0, 0, 6_500_000_000_000_000_000], np.int64))
    c.ok("center_crop_pad_empty", ["run", "ccp.kiln", "--input", "s=ccp_empty.npy", *limit], "y: f32 0x0x6500000000000000000")

    # GridSample with NaN, infinities and huge coordinates: defined results (padding), no UB.
    save(p("grid.onnx"), [h.make_node("GridSample", ["x", "g"], ["y"])], [vi("x", F, [1, 1, 4, 4]), vi("g", F, [1, 2, 2, 2])],
         [vi("y", F, None)])
    export(c, "grid")
    np.save(p("grid.npy"), np.array([np.inf, -np.inf, np.nan, 1e38, -1e38, 0.5, 3e9, -3e9], np.float32).reshape(1, 2, 2, 2))
    c.ok("grid_sample_non_finite", ["run", "grid.kiln", "--input", "g=grid.npy"], "y: f32 1x1x2x2")

    # A model whose declared shapes need more than --max-memory is refused at load, naming it.
    save(p("huge.onnx"), [h.make_node("Relu", ["x"], ["y"])], [vi("x", F, [1 << 20, 1 << 20])], [vi("y", F, None)])
    export(c, "huge", "--max-memory", "8TiB")
    c.error("declared_shape_past_budget", ["inspect", "huge.kiln", *limit],
            r"value 'x': shape 1048576x1048576 \(f32\) needs 4\.0 TiB, past the memory limit of 256 MiB")
    c.error("max_memory_malformed", ["inspect", "huge.kiln", "--max-memory", "lots"], r"--max-memory: 'lots' is not a size")

    # One line, whatever the input quotes: a 100 KB node name is elided in the middle.
    save(p("longname.onnx"), [h.make_node("Frobnicate", ["x"], ["y"], name="n" * 100_000)], [vi("x", F, [2])],
         [vi("y", F, None)])
    c.error("long_name_elided", ["export", "longname.onnx", "-o", "o.kiln", "-v"], r"characters \.\.\.\]")


def control_characters(c):
    """Names are the model's to choose: escape sequences in them (colour, clear screen, window
    title, carriage return, backspace) print as \\xNN in every listing and error, never raw."""
    w = c.work
    x, wname, mid, y = "in\x1b]0;title\x07", "w\x1b[31mred", "mid\rX", "out\x08"
    save(os.path.join(w, "ctl.onnx"),
         [h.make_node("MatMul", [x, wname], [mid], name="mm\x1b[2J"), h.make_node("Relu", [mid], [y], name="relu\x1b[0m")],
         [vi(x, F, [2, 4])], [vi(y, F, [2, 4])], [nh.from_array(np.ones((4, 4), np.float32), wname)])
    export(c, "ctl")
    raw = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
    cases = [("inspect", ["inspect", "ctl.kiln"], r"input  in\\x1b\]0;title\\x07: f32"),
             ("run_v", ["run", "ctl.kiln", "-v"], r"node 'mm\\x1b\[2J' \(MatMul\)"),
             ("compile_v", ["compile", "ctl.kiln", "-o", "ctlc.kiln", "-v"], r"node 'mm\\x1b\[2J'"),
             ("profile", ["profile", "ctlc.kiln", "--iters", "3", "--warmup", "1", "--check"], r"mm\\x1b\[2J"),
             ("quant_v", ["quant", "ctl.kiln", "-o", "ctlq.kiln", "--quantizer", "x86", "--dynamic", "-v"], r"node 'mm\\x1b\[2J'"),
             ("inspect_quantized", ["inspect", "ctlq.kiln"], r"  mm\\x1b\[2J \("),
             ("error", ["run", "ctl.kiln", "--input", x + "=three.npy"], r"in\\x1b\]0;title\\x07")]
    np.save(os.path.join(w, "three.npy"), np.ones(3, np.float32))
    for name, args, shown in cases:
        rc, out, err, _, _ = run(c.kiln, args, w)
        c.check(f"control_characters_{name}", rc in (0, 2) and not raw.search(out + err) and re.search(shown, out + err),
                f"exit {rc}; want /{shown}/ and no raw control character; stdout {out[:300]!r}; stderr {err[:300]!r}")


def corpus_sweep(c, corpus_roots):
    """Every committed fuzz corpus file and finding of at most 64 KB, fed to the verb that reads
    it, with --max-memory 256MiB: exit 0, 2 or 3, and peak RSS within 300 MB."""
    samples = os.path.join(ROOT, "samples")
    shutil.copy(os.path.join(samples, "mlp.onnx"), os.path.join(c.work, "mlp.onnx"))
    run(c.kiln, ["export", "mlp.onnx", "-o", "mlp.kiln"], c.work)
    worst, count, bad = 0, 0, []
    walked = [w for root in corpus_roots for w in sorted(os.walk(root))]
    for dirpath, _, files in walked:
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            if os.path.getsize(path) > 64 * 1024:
                continue
            target = os.path.basename(dirpath)
            if target == "fuzz_kiln_load":
                commands = [["inspect", path], ["run", path, "--seed", "1"]]
            elif target == "fuzz_onnx_export":
                commands = [["export", path, "-o", "c.kiln"]]
            elif target in ("fuzz_npy", "fuzz_npz"):
                link = os.path.join(c.work, "in" + (".npz" if "npz" in target else ".npy"))
                shutil.copy(path, link)
                commands = [["run", "mlp.kiln", "--inputs" if link.endswith(".npz") else "--input", link]]
            else:  # fuzz_run's inputs are raw bytes for its own models, not files kiln reads
                continue
            for args in commands:
                rc, out, err, secs, rss = run(c.kiln, args + ["--max-memory", "256MiB"], c.work, timeout=30)
                count += 1
                worst = max(worst, rss)
                lines = [l for l in err.splitlines() if l.strip()]
                if rc not in (0, 2, 3) or rss > RSS_LIMIT_KB or (rc == 2 and len(lines) != 1):
                    bad.append(f"{' '.join(args[:2])}: exit {rc}, {rss // 1024} MB, {secs:.1f} s: {err.strip()[:200]!r}")
    print(f"corpus sweep: {count} runs, peak RSS {worst // 1024} MB")
    c.check("corpus_sweep_ran", count > 0, f"no corpus files under {corpus_roots}")
    c.check("corpus_sweep", not bad, "; ".join(bad[:10]))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--corpus", nargs="+", default=[os.path.join(ROOT, "tests", "fuzz", d) for d in ("corpus", "findings")])
    ap.add_argument("--sanitized", action="store_true",
                    help="kiln is built with sanitizers: their shadow memory and slowdown void the RSS and time bounds")
    args = ap.parse_args()
    global RSS_LIMIT_KB, TIME_SCALE
    if args.sanitized:
        RSS_LIMIT_KB, TIME_SCALE = 1 << 40, 10
    work = tempfile.mkdtemp(prefix="kiln-hostile-")
    c = Checker(os.path.abspath(args.kiln), work)
    try:
        findings(c)
        control_characters(c)
        corpus_sweep(c, args.corpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
