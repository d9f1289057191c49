#!/usr/bin/env python3
"""Start-up and memory of compiled kiln against ONNX Runtime, one model at a time.

    python bench/startup.py --kiln PATH [--models NAME ...] [--threads 1] [--repeat 3] [--work-dir DIR]
                            [--precision fp32 bf16 fp16]

For each model (the real-sized test models by default), compiled at each `--precision` (a row
each; fp32 alone by default), each in fresh processes, `--repeat` times, medians reported:
  - kiln: `kiln run COMPILED --iters 10 --json` gives the load time (memory-mapped), the
    session creation (which plans the compiled input shapes: kernels prepared on the weights
    as the model stores them, packed), the first run, the steady-state median and the peak RSS;
  - ONNX Runtime (CPU EP, all graph optimizations): session creation, first run, steady-state
    median and peak RSS, measured the same way in a child Python process.
It prints kiln's load + session + first run less one steady run (everything done before the
steady state) against ORT's session creation, each one's first run over its steady median, and peak RSS against the
weights' bytes plus kiln's arena. Benchmark tool only (needs onnxruntime from the test venv).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
from make_models import DEFAULT_OUT_DIR, MODELS  # noqa: E402
from ort_reference import load_npz  # noqa: E402
from run_models import Generated  # noqa: E402

ORT_CHILD = r"""
import json, resource, sys, time
import numpy as np, onnxruntime as ort
path, inputs_path, threads, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
inputs = dict(np.load(inputs_path))
o = ort.SessionOptions()
o.intra_op_num_threads = threads
o.inter_op_num_threads = 1
o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
t = time.perf_counter(); s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"]); created = time.perf_counter() - t
t = time.perf_counter(); s.run(None, inputs); first = time.perf_counter() - t
times = []
for _ in range(iters):
    t = time.perf_counter(); s.run(None, inputs); times.append(time.perf_counter() - t)
print(json.dumps({"session_ms": created * 1e3, "first_ms": first * 1e3, "median_ms": sorted(times)[len(times) // 2] * 1e3,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def input_shapes(inputs):
    return [f"{k}={'x'.join(str(d) for d in v.shape)}" for k, v in inputs.items()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--models", nargs="+", default=[m for m in MODELS if m != "resnet_qdq"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--work-dir", default=DEFAULT_OUT_DIR)
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16", "fp16"],
                        help="compile kiln's model at each (a row each; ONNX Runtime's f32 session is the same)")
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    generated = Generated(args.work_dir)
    print(f"# {args.threads} thread(s), medians of {args.repeat} fresh processes; ms and MB")
    print(f"{'model':16s} {'kiln load+session+plan':>22s} {'ORT session':>12s} {'ratio':>6s}  {'kiln 1st/median':>15s} "
          f"{'ORT 1st/median':>14s}  {'kiln RSS':>8s} {'weights+arena':>13s} {'ORT RSS':>8s}")
    with tempfile.TemporaryDirectory(dir=args.work_dir) as scratch:
        for name in args.models:
            _, error = generated.ensure(name)
            if error:
                print(f"{name:16s} generator failed: {error}")
                continue
            onnx_path = os.path.join(args.work_dir, f"{name}.onnx")
            inputs_path = os.path.join(args.work_dir, f"{name}.inputs.npz")
            exported = os.path.join(scratch, f"{name}.kiln")
            compiled = os.path.join(scratch, f"{name}.c.kiln")
            run([args.kiln, "export", onnx_path, "-o", exported])
            o = []  # ONNX Runtime's f32 session, once a model
            for precision in args.precision:
                cmd = [args.kiln, "compile", exported, "-o", compiled, "--threads", str(args.threads), "--precision", precision]
                for s in input_shapes(load_npz(inputs_path)):
                    cmd += ["--input-shape", s]
                run(cmd)
                weights = os.path.getsize(compiled)
                k = []
                for _ in range(args.repeat):
                    k.append(json.loads(run([args.kiln, "run", compiled, "--inputs", inputs_path, "--threads", str(args.threads),
                                             "--iters", str(args.iters), "--warmup", "0", "--json"])))
                    if len(o) < args.repeat:
                        o.append(json.loads(run([sys.executable, "-c", ORT_CHILD, onnx_path, inputs_path, str(args.threads),
                                                 str(args.iters)])))
                med = lambda xs: statistics.median(xs)  # noqa: E731
                k_median = med([r["latency_ms"]["median"] for r in k])
                k_first = med([r["startup_ms"]["first_run"] for r in k])
                k_start = med([r["startup_ms"]["load"] + r["startup_ms"]["session"] + r["startup_ms"]["first_run"] -
                               r["latency_ms"]["median"] for r in k])
                o_session = med([r["session_ms"] for r in o])
                arena = k[0]["arena_bytes"]
                label = name if precision == "fp32" else f"{name} {precision}"
                print(f"{label:16s} {k_start:22.1f} {o_session:12.1f} {k_start / o_session:6.2f}  {k_first / k_median:15.2f} "
                      f"{med([r['first_ms'] for r in o]) / med([r['median_ms'] for r in o]):14.2f}  "
                      f"{med([r['peak_rss_bytes'] for r in k]) / 1e6:8.0f} {(weights + arena) / 1e6:13.0f} "
                      f"{med([r['peak_rss_bytes'] for r in o]) / 1e6:8.0f}", flush=True)


if __name__ == "__main__":
    main()
