#!/usr/bin/env python3
"""What `kiln profile` costs and how much of the run it accounts for, on the real-sized models.

    python bench/profile_overhead.py --kiln PATH [--models NAME ...] [--threads 1 2] [--rounds 20]
                                     [--iters 10] [--warmup 3] [--work-dir DIR]

Every model (tests/models/make_models.py's, at their test inputs) is exported and compiled for
each thread count. Then `--rounds` rounds each run, interleaved, `kiln run --iters N --json`
(no observer) and `kiln profile --iters N --json` (every node timed) on the same compiled model
and inputs, so that a machine that slows down mid-run slows both alike. Per model and thread
count it prints:
  - run / profile: the median over rounds of each round's median latency, with the min-max of
    the round medians;
  - overhead: profile's median over run's, less 1 (what timing every node costs);
  - kernels/wall: the profile's sum of node times over its wall-clock latency (the rest is the
    executor's own work, which the profile reports as overhead).
Benchmark tool only; needs the test venv (scripts/requirements.txt).
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


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p.stdout


def input_shapes(npz):
    import numpy as np

    with np.load(npz) as z:
        return [f"{k}={'x'.join(str(d) for d in z[k].shape)}" for k in z.files]


def cell(values):
    return f"{statistics.median(values):8.3f} [{min(values):.3f}-{max(values):.3f}]"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--models", nargs="*", default=[m for m in MODELS])
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--work-dir", default=DEFAULT_OUT_DIR)
    args = ap.parse_args(argv)
    kiln = os.path.abspath(args.kiln)
    env = dict(os.environ)
    scratch = tempfile.mkdtemp(prefix="kiln-profile-overhead-")
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
    print(f"# {args.rounds} rounds of --iters {args.iters} --warmup {args.warmup}, run and profile interleaved; "
          f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')} GOMP_SPINCOUNT={env.get('GOMP_SPINCOUNT', 'unset')}")
    results = {(n, t): {"run": [], "profile": [], "share": []} for n, t, _, _ in cases}
    for r in range(args.rounds):
        for name, t, model, npz in cases:
            common = [model, "--inputs", npz, "--threads", str(t), "--iters", str(args.iters), "--warmup", str(args.warmup), "--json"]
            order = ("run", "profile") if r % 2 == 0 else ("profile", "run")
            for verb in order:
                doc = json.loads(run([kiln, verb] + common, env))
                res = results[(name, t)]
                if verb == "run":
                    res["run"].append(doc["latency_ms"]["median"])
                else:
                    res["profile"].append(doc["latency_ms"]["p50"])
                    res["share"].append(doc["kernel_time"]["sum_ms_p50"] / doc["kernel_time"]["wall_ms_p50"])
        print(f"# round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{'model':18} {'T':>2} {'run ms [min-max]':>24} {'profile ms [min-max]':>24} {'overhead':>9} {'kernels/wall':>13}")
    worst = 0.0
    for (name, t), res in results.items():
        overhead = statistics.median(res["profile"]) / statistics.median(res["run"]) - 1
        worst = max(worst, overhead)
        print(f"{name:18} {t:2d} {cell(res['run']):>24} {cell(res['profile']):>24} {100 * overhead:8.1f}% "
              f"{100 * statistics.median(res['share']):12.1f}%")
    print(f"# worst overhead {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
