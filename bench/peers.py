#!/usr/bin/env python3
"""Times compiled kiln against ONNX Runtime and OpenVINO on the same models, in one run.

    python bench/peers.py --kiln PATH [--models NAME ...] [--threads 1 2] [--rounds 3]
                          [--iters 10] [--warmup 3] [--work-dir DIR] [--no-compile] [--autotune]
                          [--precision bf16 fp16] [--lower-output-layers] [--no-pin]

For every model (the real-sized test models of tests/models/make_models.py, ResNet-50 at batch
64 too, ResNet-50 and the linear layers of BERT-base, GPT-2 and LLaMA in int8, BERT-base at
sequence 1 in fp32 and with int4 weights, and the samples' MLP at batch 1 and 64) and thread
count:
  - kiln: `kiln export`, then `kiln compile --input-shape ... --threads T`, then
    `kiln run --iters N --warmup W --threads T --json` (the run's own latency median: no
    process start or model loading);
  - ONNX Runtime 1.x, CPU execution provider, all graph optimizations, intra_op_num_threads=T,
    session.run timed in this process;
  - OpenVINO, CPU plugin, PERFORMANCE_HINT=LATENCY, INFERENCE_PRECISION_HINT=f32,
    INFERENCE_NUM_THREADS=T, infer() timed in this process.
resnet50_int8 is ResNet-50 quantized statically on 8 random samples: for kiln `kiln quant
--quantizer x86` before the compile; for ONNX Runtime and OpenVINO the same model in QDQ form
from ONNX Runtime's own quant_pre_process (BatchNorm folded) and quantize_static (QDQ format,
u8 activations, s8 per-channel weights, min-max calibration on the same samples), which both run
on their int8 kernels. Its outputs are
checked against ONNX Runtime's fp32 ones (relative L2 <= 0.1: the two quantizations differ), and
a line after the table gives kiln int8 over ONNX Runtime fp32 (the resnet50 row).
bert_int8 is BERT-base quantized the same way on 8 samples of random token ids, its linear
layers only (ONNX Runtime's quantize_static told the MatMul / Gemm nodes by a constant weight,
as kiln's x86 quantizer takes them; attention stays float in both, though kiln's quantizer
also quantizes the projections' outputs, whose codes kiln's attention multiplies on AMX:
QAttention); a line after the table
gives kiln int8 over kiln fp32 (the bert_base row). gpt2_int8 and llama_int8 are the GPT-2 and
LLaMA-style test models quantized as bert_int8 is, on random token ids; GPT-2's linear layers
include the tied LM head, whose weight both quantizers see folded (kiln quant's weight folding,
quant_pre_process's constant folding). Run only when named: mobilenetv2_int8,
efficientnet_b0_int8 and yolo_int8, quantized whole as resnet50_int8 is, and vit_s16_int8, its
linear layers as bert_int8's.
bert_int4_s1 is BERT-base at sequence length 1 (the shape of an LLM's decode step: every linear
layer one row by its weight, so reading the weights is the cost) with its MatMul weights
quantized to 4 bits in groups of 128 (u4 with zero points): for kiln `kiln quant --weight-only
int4` (Gemm kept float, as ONNX Runtime's quantizer leaves it); for ONNX Runtime and OpenVINO
the model from ONNX Runtime's MatMulNBitsQuantizer (MatMulNBits, the same scheme), whose
outputs kiln's are checked against (relative L2 <= 0.05: kiln's are within 0.002, OpenVINO's
within 0.03, as its CPU plugin quantizes the activations of such layers to 8 bits by default). A line after the table gives kiln
int4 over kiln's own fp32 at the same shape (bert_s1).
Each runtime's outputs are first checked against ONNX Runtime's (relative L2 <= 1e-4). Then
`--rounds` rounds each time every (model, threads, runtime) for `--iters` runs after `--warmup`,
interleaved, so that a machine that slows down mid-run slows every column alike. A cell is the
median over rounds of each round's median, with the min-max of the round medians. Ratios are
kiln's median over the peer's; the last rows are geometric means, over every row and over the
speed gate's models (GATE). A peer that fails a model leaves its cell "failed"; the reason
follows the table.

With --autotune, kiln's model is also compiled with `--mode max-autotune` (a fresh tuning
database per benchmark run: the first compile of each (model, threads) is cold, a second one
warm, reading what the first recorded; both are timed, wall clock) and the tuned model is a
fifth column, checked and timed in the same interleaved rounds; `tuned/kiln` is its median over
the default compile's, and a line per model gives the compile times and the problems the search
changed.

With --precision bf16 (or fp16, or both), kiln's model is also compiled with `--precision P`
(for fp16 with `--target avx512-fp16` where this CPU lacks AVX512-FP16: the compile refuses it
otherwise) and timed as a further column; `P/kiln` is its median over the fp32 compile's. Its
outputs are checked against ONNX Runtime's fp32 ones at relative L2 <= 1e-2 (PRECISION_REL_L2_LIMIT),
and a line per model gives the relative L2 of each output. With bf16, OpenVINO also runs at
INFERENCE_PRECISION_HINT=bf16 (checked at the same limit, timed in the same rounds), and a line
per model gives kiln bf16 over OpenVINO bf16. --lower-output-layers passes that flag to those
compiles (the layers that write graph outputs lowered too, as OpenVINO's bf16 lowers them).
With --autotune too, each lowered model is also compiled with `--mode max-autotune` (`P-tuned`,
where this CPU runs P's kernels: a search times them), checked at P's limit and timed as a
further column, and a line per thread count gives `P-tuned` over P's default compile.

At one thread every runtime of a round runs on the same CPU: while a one-thread case is timed,
the script pins each of its own threads (ONNX Runtime's and OpenVINO's included) and so the kiln
process it starts to one CPU, round r to the r-th CPU it may use (modulo their number), so that
the rounds sample every CPU alike (--no-pin leaves the scheduler to place them). The vCPUs of a
shared host can run at different speeds for minutes at a time (on the 2-core machine of the
tables below, one ran ~30 % slower than the other while both were busy), and a fresh kiln
process landing on the other CPU than the benchmark's own would decide a ratio by itself.

kiln's threads are GNU OpenMP's; the header prints OMP_WAIT_POLICY and GOMP_SPINCOUNT as set
(pass --omp-wait-policy to set it for kiln's runs). Test and benchmark tool only: needs numpy,
onnxruntime and openvino from the test venv (scripts/requirements.txt); without openvino its cells say failed.
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
from make_models import DEFAULT_OUT_DIR, MODELS  # noqa: E402
from ort_reference import load_npz  # noqa: E402
from run_models import Generated, last_line  # noqa: E402

REL_L2_LIMIT = 1e-4
INT8_REL_L2_LIMIT = 0.1  # an int8 model against fp32
# kiln's int4 weights against ONNX Runtime's of the same scheme (kiln is within 0.002; OpenVINO's
# CPU plugin also quantizes the activations of compressed-weight layers by default: 0.03)
INT4_REL_L2_LIMIT = 0.05
PRECISION_REL_L2_LIMIT = 1e-2  # --precision bf16 / fp16 against ONNX Runtime's fp32
CALIB_SAMPLES = 8
# The models of kiln's speed gate: the real-sized models at batch 1, ResNet-50 at batch 64, the
# sample MLP at batch 1 and 64 (resnet_qdq is timed too, but is int8 work for ONNX Runtime).
GATE = {"resnet50", "resnet50_b64", "mobilenetv2", "efficientnet_b0", "vit_s16", "bert_base", "gpt2", "llama", "yolo",
        "mlp_b1", "mlp_b64"}
PAUSE_S = 0.2  # between runtimes, so one runtime's spinning threads settle before the next


class Failed(Exception):
    """A measurement that could not be made; the row shows the reason."""


def fmt_ms(seconds):
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}"


def cell(values):
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{fmt_ms(med)} ({fmt_ms(min(values))}-{fmt_ms(max(values))})"


def rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    den = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (den if den > 0 else 1.0))


def run(cmd, timeout, env=None):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise Failed(f"{os.path.basename(cmd[0])} {cmd[1]}: exit {proc.returncode}: {last_line(proc.stderr)}")
    return proc.stdout


class Case:
    """One model at one input size: its ONNX file, inputs and ONNX Runtime's outputs."""

    def __init__(self, name, onnx_path, inputs, scratch):
        self.name = name
        self.onnx_path = onnx_path
        self.inputs = inputs
        self.inputs_path = os.path.join(scratch, f"{name}.inputs.npz")
        np.savez(self.inputs_path, **inputs)
        self.kiln = {}  # threads -> compiled model path
        self.variants = {}  # "tuned" (--autotune), "bf16", "fp16" (--precision) -> threads -> compiled model path
        self.variant_errors = {}  # (variant, threads) -> {output: relative L2 against ONNX Runtime}
        self.tune_info = {}  # (variant, threads) -> (cold compile s, warm compile s, problems changed, problems)
        self.ort = {}
        self.ov = {}
        self.ov_bf16 = {}  # threads -> OpenVINO's request at INFERENCE_PRECISION_HINT=bf16 (--precision bf16)
        self.ov_bf16_error = None
        self.reference = None
        self.error = None  # kiln or ONNX Runtime failed: no row
        self.ov_error = None  # OpenVINO failed: the row without its column
        self.kiln_onnx = onnx_path  # what kiln exports (the fp32 model, for an int8 case)
        self.calib = None  # an int8 case: the calibration .npz kiln quant reads
        self.quant_config = None  # a weight-only case: the --config kiln quant --weight-only reads
        self.limit = REL_L2_LIMIT


def input_shapes(inputs):
    return [f"{k}={'x'.join(str(d) for d in v.shape) or 'scalar'}" for k, v in inputs.items()]


def prepare_kiln(case, kiln, threads, scratch, args, env):
    exported = os.path.join(scratch, f"{case.name}.kiln")
    if not os.path.exists(exported):
        run([kiln, "export", case.kiln_onnx, "-o", exported], args.timeout)
        quantize = None
        if case.calib:
            quantize = ["--quantizer", "x86", "--calib", case.calib]
        elif case.quant_config:
            quantize = ["--config", case.quant_config]
        if quantize:
            quantized = os.path.join(scratch, f"{case.name}.q.kiln")
            run([kiln, "quant", exported, "-o", quantized] + quantize, args.timeout)
            os.replace(quantized, exported)
    if args.no_compile:
        case.kiln[threads] = exported
    else:
        compiled = os.path.join(scratch, f"{case.name}.t{threads}.kiln")
        cmd = [kiln, "compile", exported, "-o", compiled, "--threads", str(threads)]
        for s in input_shapes(case.inputs):
            cmd += ["--input-shape", s]
        run(cmd, args.timeout, env)
        case.kiln[threads] = compiled
    check_kiln(case, kiln, case.kiln[threads], threads, scratch, args, env, "kiln")
    if args.autotune and not args.no_compile:
        tune(case, kiln, exported, threads, scratch, args, env, "tuned", [])
    for precision in args.precision if not args.no_compile else []:
        lowered = os.path.join(scratch, f"{case.name}.t{threads}.{precision}.kiln")
        lowering = ["--precision", precision] + (["--lower-output-layers"] if args.lower_output_layers else [])
        cmd = [kiln, "compile", exported, "-o", lowered, "--threads", str(threads)] + lowering
        for s in input_shapes(case.inputs):
            cmd += ["--input-shape", s]
        native = True
        try:
            run(cmd, args.timeout, env)
        except Failed as e:
            if f"lacks avx512-{precision}" not in str(e):
                raise
            run(cmd + ["--target", f"avx512-{precision}"], args.timeout, env)  # compiled for a CPU that has it
            native = False
        case.variants.setdefault(precision, {})[threads] = lowered
        case.variant_errors[(precision, threads)] = check_kiln(case, kiln, lowered, threads, scratch, args, env, f"kiln {precision}",
                                                               max(case.limit, PRECISION_REL_L2_LIMIT))
        if args.autotune and native:  # a search times kernels: only on a CPU that runs them
            tune(case, kiln, exported, threads, scratch, args, env, f"{precision}-tuned", lowering)


def tune(case, kiln, exported, threads, scratch, args, env, variant, lowering):
    """Compiles the case with `--mode max-autotune` (and the `lowering` flags: --precision ...)
    twice, cold then warm from the database the first wrote, and adds it as `variant`."""
    tuned = os.path.join(scratch, f"{case.name}.t{threads}.{variant}.kiln")
    report = os.path.join(scratch, f"{case.name}.t{threads}.{variant}.tune.json")
    cmd = [kiln, "compile", exported, "-o", tuned, "--threads", str(threads), "--mode", "max-autotune",
           "--tuning-db", os.path.join(scratch, "tuning.jsonl"), "--tune-report", report] + lowering
    for s in input_shapes(case.inputs):
        cmd += ["--input-shape", s]
    t0 = time.perf_counter()
    run(cmd, args.timeout, env)
    cold = time.perf_counter() - t0
    with open(report) as f:
        problems = json.load(f)["problems"]
    t0 = time.perf_counter()
    run(cmd, args.timeout, env)  # warm: every problem from the database
    warm = time.perf_counter() - t0
    changed = sum(1 for p in problems if p["source"] == "tuned")
    case.tune_info[(variant, threads)] = (cold, warm, changed, len(problems))
    case.variants.setdefault(variant, {})[threads] = tuned
    limit = None if variant == "tuned" else max(case.limit, PRECISION_REL_L2_LIMIT)
    errors = check_kiln(case, kiln, tuned, threads, scratch, args, env, f"kiln {variant}", limit)
    if limit is not None:
        case.variant_errors[(variant, threads)] = errors


def check_kiln(case, kiln, model, threads, scratch, args, env, what, limit=None):
    """Runs the model on the case's inputs and checks its outputs against ONNX Runtime's; returns
    each output's relative L2."""
    out_dir = model + ".out"
    run([kiln, "run", model, "--inputs", case.inputs_path, "--threads", str(threads), "--output-dir", out_dir],
        args.timeout, env)
    errors = {}
    for name, ref in case.reference.items():
        got = np.load(os.path.join(out_dir, f"{name}.npy"))
        errors[name] = err = rel_l2(got, ref)
        if not err <= (limit or case.limit):
            raise Failed(f"{what} output {name}: relative L2 {err:.3g} against ONNX Runtime")
    return errors


def prepare_ort(case, threads):
    import onnxruntime as ort

    if case.reference is None and case.calib:  # an int8 case: checked against the fp32 model
        options = ort.SessionOptions()
        options.log_severity_level = 3
        fp32 = ort.InferenceSession(case.kiln_onnx, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in fp32.get_outputs()]
        case.reference = dict(zip(names, fp32.run(names, case.inputs)))

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    start = time.perf_counter()
    session = ort.InferenceSession(case.onnx_path, options, providers=["CPUExecutionProvider"])
    created = time.perf_counter() - start
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(names, case.inputs)))
    if case.reference is None:
        case.reference = outputs
    case.ort[threads] = (session, names, created)


def prepare_ov(case, threads, precision="f32"):
    """OpenVINO's request for the case, checked against ONNX Runtime's outputs; at bf16
    (INFERENCE_PRECISION_HINT=bf16, its own lower-precision mode) within PRECISION_REL_L2_LIMIT."""
    import openvino as ov

    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads}
    compiled = core.compile_model(case.onnx_path, "CPU", config)
    request = compiled.create_infer_request()
    result = request.infer(case.inputs)
    limit = case.limit if precision == "f32" else max(case.limit, PRECISION_REL_L2_LIMIT)
    for output in compiled.outputs:
        name = output.get_any_name()
        if name in case.reference:
            err = rel_l2(result[output], case.reference[name])
            if not err <= limit:
                raise Failed(f"OpenVINO {precision} output {name}: relative L2 {err:.3g} against ONNX Runtime")
    return request


def pin(cpus):
    """Every thread of this process (the peers' pools too) to `cpus`; children inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that has just exited
            pass


def time_kiln(case, kiln, threads, args, env, variant=None):
    out = run([kiln, "run", (case.variants[variant] if variant else case.kiln)[threads], "--inputs", case.inputs_path, "--threads", str(threads), "--iters",
               str(args.iters), "--warmup", str(args.warmup), "--json"], args.timeout, env)
    return json.loads(out)["latency_ms"]["median"] / 1e3


def time_calls(fn, args):
    for _ in range(args.warmup):
        fn()
    seconds = []
    for _ in range(args.iters):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def int8_case(name, onnx_path, inputs, scratch, rng, sample=None, linear_only=False):
    """The model quantized: calibration samples for kiln quant (`sample(rng)` each; default
    normal noise of the inputs' shapes), and ONNX Runtime's QDQ model of the same samples for the
    peers (`linear_only`: only the MatMul / Gemm nodes by a constant weight, the layers kiln's
    x86 quantizer takes in a transformer, not attention's products of two activations)."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    if sample is None:
        def sample(r):
            return {k: r.standard_normal(v.shape).astype(v.dtype) for k, v in inputs.items()}
    samples = [sample(rng) for _ in range(CALIB_SAMPLES)]
    calib = os.path.join(scratch, f"{name}.calib.npz")
    np.savez(calib, **{k: np.concatenate([s[k] for s in samples]) for k in inputs})

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    qdq = os.path.join(scratch, f"{name}.qdq.onnx")
    import logging
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice, per weight
    from onnxruntime.quantization.shape_inference import quant_pre_process
    pre = os.path.join(scratch, f"{name}.pre.onnx")  # BatchNorm folded into the convs, as ONNX Runtime advises
    quant_pre_process(onnx_path, pre, skip_symbolic_shape=True)
    nodes = None
    if linear_only:
        import onnx
        model = onnx.load(pre)
        weights = {t.name for t in model.graph.initializer}
        nodes = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]
    quantize_static(pre, qdq, Reader(), quant_format=QuantFormat.QDQ, per_channel=True, nodes_to_quantize=nodes,
                    op_types_to_quantize=["MatMul", "Gemm"] if linear_only else None,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    case = Case(name, qdq, inputs, scratch)
    case.kiln_onnx = onnx_path
    case.calib = calib
    case.limit = INT8_REL_L2_LIMIT
    return case


def int4_case(name, onnx_path, inputs, scratch):
    """The model's MatMul weights in 4 bits, groups of 128: ONNX Runtime's MatMulNBits model for
    the peers, and the --config that makes kiln quantize the same layers alike."""
    import logging
    logging.disable(logging.WARNING)  # the quantizer logs every weight
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    quantizer = MatMulNBitsQuantizer(onnx_path, bits=4, block_size=128, is_symmetric=False, quant_format=QuantFormat.QOperator)
    quantizer.process()
    nbits = os.path.join(scratch, f"{name}.nbits.onnx")
    quantizer.model.save_model_to_file(nbits, use_external_data_format=False)
    logging.disable(logging.NOTSET)
    config = os.path.join(scratch, f"{name}.quant.json")
    with open(config, "w") as f:
        json.dump({"global": {"weight_only": "int4", "group_size": 128}, "op_types": {"Gemm": None}}, f)
    case = Case(name, nbits, inputs, scratch)
    case.kiln_onnx = onnx_path
    case.quant_config = config
    case.limit = INT4_REL_L2_LIMIT
    return case


# Further int8 cases, run only when named: the image models quantized whole (as resnet50_int8),
# ViT-S/16's linear layers only (as bert_int8).
NAMED_INT8 = {"mobilenetv2": False, "efficientnet_b0": False, "yolo": False, "vit_s16": True}


def make_cases(args, scratch):
    generated = Generated(args.work_dir)
    cases = []
    wanted = args.models
    rng = np.random.default_rng(0)
    for name in MODELS:
        if wanted and name not in wanted and not (name == "resnet50" and {"resnet50_b64", "resnet50_int8"} & set(wanted)) \
                and not (name == "bert_base" and {"bert_s1", "bert_int4_s1", "bert_int8"} & set(wanted)) \
                and f"{name}_int8" not in wanted:
            continue
        gen_s, error = generated.ensure(name)
        if error:
            raise Failed(f"{name}: generator: {error}")
        onnx_path = os.path.join(args.work_dir, f"{name}.onnx")
        inputs = load_npz(os.path.join(args.work_dir, f"{name}.inputs.npz"))
        if not wanted or name in wanted:
            cases.append(Case(name, onnx_path, inputs, scratch))
        if name == "resnet50" and (not wanted or "resnet50_b64" in wanted):
            big = {k: rng.standard_normal((64,) + v.shape[1:]).astype(v.dtype) for k, v in inputs.items()}
            cases.append(Case("resnet50_b64", onnx_path, big, scratch))
        if name == "resnet50" and (not wanted or "resnet50_int8" in wanted):
            cases.append(int8_case("resnet50_int8", onnx_path, inputs, scratch, rng))
        if name == "bert_base" and (not wanted or "bert_int8" in wanted):
            def tokens(r, shape=inputs["input_ids"].shape):
                return {"input_ids": r.integers(0, 30522, shape).astype(np.int64), "attention_mask": np.ones(shape, np.int64)}
            cases.append(int8_case("bert_int8", onnx_path, inputs, scratch, rng, tokens, linear_only=True))
        if name in ("gpt2", "llama") and (not wanted or f"{name}_int8" in wanted):
            vocab = {"gpt2": 50257, "llama": 32000}[name]

            def lm_tokens(r, shape=inputs["input_ids"].shape, vocab=vocab):
                return {"input_ids": r.integers(0, vocab, shape).astype(np.int64)}
            cases.append(int8_case(f"{name}_int8", onnx_path, inputs, scratch, rng, lm_tokens, linear_only=True))
        if name in NAMED_INT8 and wanted and f"{name}_int8" in wanted:
            cases.append(int8_case(f"{name}_int8", onnx_path, inputs, scratch, rng, linear_only=NAMED_INT8[name]))
        if name == "bert_base":
            s1 = {k: v[:, :1] for k, v in inputs.items()}
            if not wanted or "bert_s1" in wanted:
                cases.append(Case("bert_s1", onnx_path, s1, scratch))
            if not wanted or "bert_int4_s1" in wanted:
                cases.append(int4_case("bert_int4_s1", onnx_path, s1, scratch))
    mlp = os.path.join(ROOT, "samples", "mlp.onnx")
    for batch in (1, 64):
        name = f"mlp_b{batch}"
        if not wanted or name in wanted:
            cases.append(Case(name, mlp, {"input": rng.standard_normal((batch, 16)).astype(np.float32)}, scratch))
    return cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--models", nargs="+", metavar="NAME",
                        help="models (default: all): " + " ".join(list(MODELS) + ["resnet50_b64", "resnet50_int8", "bert_int8", "gpt2_int8", "llama_int8", "bert_s1", "bert_int4_s1",
                                                                               *(f"{m}_int8" for m in NAMED_INT8),
                                                                               "mlp_b1", "mlp_b64"]))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--work-dir", default=DEFAULT_OUT_DIR)
    parser.add_argument("--no-compile", action="store_true", help="time the exported model, not a compiled one")
    parser.add_argument("--omp-wait-policy", choices=["active", "passive"], help="OMP_WAIT_POLICY for kiln's runs")
    parser.add_argument("--autotune", action="store_true", help="also time kiln compiled with --mode max-autotune")
    parser.add_argument("--precision", nargs="+", choices=["bf16", "fp16"], default=[],
                        help="also time kiln compiled with --precision P")
    parser.add_argument("--lower-output-layers", action="store_true",
                        help="with --precision: compile with --lower-output-layers (the final layers lowered too)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin one-thread cases to one CPU")
    args = parser.parse_args(argv)
    kiln = os.path.abspath(args.kiln)
    env = dict(os.environ)
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()

    import onnxruntime
    try:
        import openvino
        ov_version = openvino.__version__
    except ImportError:  # its cells say failed, with the reason after the table
        ov_version = "not installed"

    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs; onnxruntime "
          f"{onnxruntime.__version__}, openvino {ov_version}; kiln {'exported' if args.no_compile else 'compiled'}; "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')} GOMP_SPINCOUNT={env.get('GOMP_SPINCOUNT', 'unset')}")
    pinned = "not pinned" if args.no_pin else "one-thread rounds pinned to one CPU each, the CPUs in turn"
    print(f"# {args.rounds} rounds x {args.iters} runs after {args.warmup} warm-up; ms: median of round medians (min-max); "
          f"{pinned}", flush=True)
    failed = False
    with tempfile.TemporaryDirectory(dir=args.work_dir if os.path.isdir(args.work_dir) else None) as scratch:
        cases = make_cases(args, scratch)
        for case in cases:
            try:
                for t in args.threads:
                    prepare_ort(case, t)
                    try:
                        case.ov[t] = prepare_ov(case, t)
                    except (Failed, Exception) as e:  # OpenVINO raises its own exception types
                        case.ov_error = str(e).splitlines()[0]
                        case.ov[t] = None
                    if "bf16" in args.precision and not args.no_compile and case.ov[t] is not None:
                        try:  # OpenVINO's own bf16, to race kiln's
                            case.ov_bf16[t] = prepare_ov(case, t, "bf16")
                        except (Failed, Exception) as e:
                            case.ov_bf16_error = str(e).splitlines()[0]
                    prepare_kiln(case, kiln, t, scratch, args, env)
            except (Failed, Exception) as e:  # ONNX Runtime raises its own exception types
                case.error = str(e).splitlines()[0]
                failed = True
        allowed = os.sched_getaffinity(0)
        cpus = sorted(allowed)
        times = {}  # (case, threads, runtime) -> [round medians]
        for r in range(args.rounds):
            for case in cases:
                if case.error:
                    continue
                for t in args.threads:
                    if not args.no_pin:
                        pin({cpus[r % len(cpus)]} if t == 1 else allowed)
                    try:
                        times.setdefault((case.name, t, "kiln"), []).append(time_kiln(case, kiln, t, args, env))
                        time.sleep(PAUSE_S)
                        for variant, paths in case.variants.items():
                            if t in paths:
                                times.setdefault((case.name, t, variant), []).append(time_kiln(case, kiln, t, args, env, variant))
                                time.sleep(PAUSE_S)
                        session, names, _ = case.ort[t]
                        times.setdefault((case.name, t, "ort"), []).append(
                            time_calls(lambda: session.run(names, case.inputs), args))
                        time.sleep(PAUSE_S)
                        request = case.ov[t]
                        if request is not None:
                            times.setdefault((case.name, t, "ov"), []).append(time_calls(lambda: request.infer(case.inputs), args))
                            time.sleep(PAUSE_S)
                        request = case.ov_bf16.get(t)
                        if request is not None:
                            times.setdefault((case.name, t, "ov_bf16"), []).append(time_calls(lambda: request.infer(case.inputs), args))
                            time.sleep(PAUSE_S)
                    except Failed as e:
                        case.error = str(e)
                        failed = True
        pin(allowed)
        precisions = [] if args.no_compile else args.precision
        variants = (["tuned"] if args.autotune and not args.no_compile else []) + precisions
        variants += [f"{p}-tuned" for p in precisions if args.autotune and any(f"{p}-tuned" in c.variants for c in cases)]
        variant_cols = "".join(f"  {v + ' ms':>20s}  {v + '/kiln':>10s}" for v in variants)
        header = f"{'model':14s} {'T':>2s}  {'kiln ms':>20s}  {'ORT ms':>20s}  {'OpenVINO ms':>20s}  {'kiln/ORT':>8s}  {'kiln/OV':>8s}" + variant_cols
        print(header)
        ratios = {}
        variant_ratios = {}  # (variant, threads) -> [its median / kiln's]
        for t in args.threads:
            for case in cases:
                if case.error:
                    print(f"{case.name:14s} {t:2d}  FAILED: {case.error}")
                    continue
                k, o, v = (times.get((case.name, t, r), []) for r in ("kiln", "ort", "ov"))
                r_ort = statistics.median(k) / statistics.median(o)
                r_ov = statistics.median(k) / statistics.median(v) if v else None
                ratios.setdefault(t, []).append((case.name, r_ort, r_ov))
                ov_cell = cell(v) if v else "failed"
                ov_ratio = f"{r_ov:8.2f}" if r_ov else f"{'-':>8s}"
                extra = ""
                for variant in variants:
                    kv = times.get((case.name, t, variant), [])
                    if not kv:
                        extra += f"  {'-':>20s}  {'-':>10s}"
                        continue
                    r_variant = statistics.median(kv) / statistics.median(k)
                    variant_ratios.setdefault((variant, t), []).append(r_variant)
                    extra += f"  {cell(kv):>20s}  {r_variant:10.3f}"
                print(f"{case.name:14s} {t:2d}  {cell(k):>20s}  {cell(o):>20s}  {ov_cell:>20s}  {r_ort:8.2f}  {ov_ratio}{extra}")
        for t, rs in ratios.items():
            for label, rows in (("geomean", rs), ("geomean gate", [r for r in rs if r[0] in GATE])):
                if not rows:
                    continue
                g_ort = math.exp(statistics.mean(math.log(r[1]) for r in rows))
                ov = [r[2] for r in rows if r[2]]
                g_ov = f"{math.exp(statistics.mean(math.log(x) for x in ov)):8.2f}" if ov else f"{'-':>8s}"
                print(f"{label:14s} {t:2d}  {'':20s}  {'':20s}  {'':20s}  {g_ort:8.2f}  {g_ov}")
        for (variant, t), rs in variant_ratios.items():
            what = "max-autotune" if variant == "tuned" else f"--precision {variant}"
            print(f"# {what} {t}T: {variant}/kiln geomean {math.exp(statistics.mean(math.log(r) for r in rs)):.3f} over {len(rs)} models")
        for p in precisions:
            for t in args.threads:  # a lowered model tuned against its default compile
                rs = [statistics.median(times[(c.name, t, f"{p}-tuned")]) / statistics.median(times[(c.name, t, p)])
                      for c in cases if not c.error and times.get((c.name, t, f"{p}-tuned")) and times.get((c.name, t, p))]
                if rs:
                    print(f"# max-autotune --precision {p} {t}T: {p}-tuned/{p} geomean {math.exp(statistics.mean(math.log(r) for r in rs)):.3f} "
                          f"over {len(rs)} models ({', '.join(f'{r:.3f}' for r in rs)})")
        for t in args.threads:
            rows = [(case.name, times.get((case.name, t, "bf16")), times.get((case.name, t, "ov_bf16"))) for case in cases if not case.error]
            rows = [(name, statistics.median(k), v) for name, k, v in rows if k and v]
            for name, k, v in rows:
                print(f"# --precision bf16 {name} {t}T: kiln bf16 {fmt_ms(k)} ms, OpenVINO bf16 {cell(v)} ms: kiln/OV {k / statistics.median(v):.2f}")
            if rows:
                g = math.exp(statistics.mean(math.log(k / statistics.median(v)) for _, k, v in rows))
                print(f"# --precision bf16 {t}T: kiln bf16 / OpenVINO bf16 geomean {g:.2f} over {len(rows)} models")
        for case in cases:
            for (variant, t), errors in sorted(case.variant_errors.items()):
                listed = ", ".join(f"{name} {err:.2e}" for name, err in errors.items())
                what = variant.removesuffix("-tuned") + (" max-autotune" if variant.endswith("-tuned") else "")
                print(f"# --precision {what} {case.name} {t}T: relative L2 against ONNX Runtime fp32: {listed}")
        for case in cases:
            for (variant, t), (cold, warm, changed, problems) in sorted(case.tune_info.items()):
                what = "" if variant == "tuned" else f" --precision {variant.removesuffix('-tuned')}"
                print(f"# max-autotune{what} {case.name} {t}T: compile {cold:.1f} s cold, {warm:.1f} s warm; "
                      f"{changed} of {problems} problems changed kernel")
        for t in args.threads:
            k, o = times.get(("resnet50_int8", t, "kiln")), times.get(("resnet50", t, "ort"))
            if k and o:
                print(f"# resnet50_int8 {t}T: kiln int8 / ONNX Runtime fp32 = {statistics.median(k) / statistics.median(o):.2f}")
        for t in args.threads:
            k, f = times.get(("bert_int8", t, "kiln")), times.get(("bert_base", t, "kiln"))
            if k and f:
                print(f"# bert_int8 {t}T: kiln int8 / kiln fp32 = {statistics.median(k) / statistics.median(f):.2f}")
        for t in args.threads:
            k, f = times.get(("bert_int4_s1", t, "kiln")), times.get(("bert_s1", t, "kiln"))
            if k and f:
                print(f"# bert_int4_s1 {t}T: kiln int4 weights / kiln fp32 = {statistics.median(k) / statistics.median(f):.2f}")
        for case in cases:
            if case.ov_error and not case.error:
                print(f"# {case.name}: OpenVINO failed: {case.ov_error}")
            if case.ov_bf16_error and not case.error:
                print(f"# {case.name}: OpenVINO bf16 failed: {case.ov_bf16_error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
