#!/usr/bin/env python3
"""What `kiln profile` costs and how much of the run it accounts for, on the real-sized models.

    python bench/profile_overhead.py --kiln PATH [--models NAME ...] [--threads 1 2] [--rounds 20]
                                     [--iters 10] [--work-dir DIR] [--bench build/bench/kiln_bench_profile_overhead]

Every model (tests/models/make_models.py's, at their test inputs) is exported and compiled for
each thread count. Then kiln_bench_profile_overhead (bench/profile_overhead.cc) runs it in one
process: `--rounds` rounds, each timing `--iters` plain runs and `--iters` runs with kiln
profile's recorder on every node, in alternating order, so that both sides share the process's
memory placement and the machine's moods. Per model and thread count it prints:
  - plain / profiled: the median latency over all runs of each side, with the min-max of the
    round medians;
  - overhead: profiled median over plain median, less 1 (what timing every node costs);
  - kernels/wall: the median share of each profiled run's wall-clock time that the node times
    sum to (the rest is the executor's own work, which the profile reports as overhead).
Benchmark tool only; needs the test venv (scripts/requirements.txt).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
from make_models import DEFAULT_OUT_DIR, MODELS  # noqa: E402


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p.stdout


def input_shapes(npz):
    import numpy as np

    with np.load(npz) as z:
        return [f"{k}={'x'.join(str(d) for d in z[k].shape)}" for k in z.files]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--models", nargs="*", default=[m for m in MODELS])
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "kiln_bench_profile_overhead"))
    ap.add_argument("--work-dir", default=DEFAULT_OUT_DIR)
    args = ap.parse_args(argv)
    kiln = os.path.abspath(args.kiln)
    bench = os.path.abspath(args.bench)
    env = dict(os.environ)
    scratch = tempfile.mkdtemp(prefix="kiln-profile-overhead-")
    try:
        return measure(args, kiln, bench, env, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(args, kiln, bench, env, scratch):
    cases = []
    for name in args.models:
        onnx_path = os.path.join(args.work_dir, f"{name}.onnx")
        npz = os.path.join(args.work_dir, f"{name}.inputs.npz")
        if not os.path.exists(onnx_path):
            print(f"# {name}: no {onnx_path} (tests/models/make_models.py makes it); skipped")
            continue
        exported = os.path.join(scratch, f"{name}.kiln")
        run([kiln, "export", onnx_path, "-o", exported], env)
        for t in args.threads:
            compiled = os.path.join(scratch, f"{name}.t{t}.kiln")
            cmd = [kiln, "compile", exported, "-o", compiled, "--threads", str(t)]
            for s in input_shapes(npz):
                cmd += ["--input-shape", s]
            run(cmd, env)
            cases.append((name, t, compiled, npz))
    print(f"# {args.rounds} rounds of {args.iters} plain and {args.iters} profiled runs, interleaved in one process; "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')} GOMP_SPINCOUNT={env.get('GOMP_SPINCOUNT', 'unset')}")
    print(f"{'model':18} {'T':>2} {'plain ms [round min-max]':>28} {'profiled ms [round min-max]':>28} {'overhead':>9} {'kernels/wall':>13}")
    worst = 0.0
    for name, t, model, npz in cases:
        out = run([bench, model, npz, "--threads", str(t), "--rounds", str(args.rounds), "--iters", str(args.iters)], env)
        j = json.loads(out)
        worst = max(worst, j["overhead"])
        cell = lambda s: f"{s['median']:8.3f} [{s['round_min']:.3f}-{s['round_max']:.3f}]"
        print(f"{name:18} {t:2d} {cell(j['plain_ms']):>28} {cell(j['profiled_ms']):>28} {100 * j['overhead']:8.1f}% "
              f"{100 * j['kernel_share']:12.1f}%", flush=True)
    print(f"# worst overhead {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
