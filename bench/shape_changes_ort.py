#!/usr/bin/env python3
"""ONNX Runtime at changing input shapes in one session: kiln_bench_shape_changes' columns for
the peer (bench/shape_changes.cc).

    python bench/shape_changes_ort.py MODEL.onnx NAME=SHAPE[,NAME=SHAPE...]... [--threads 1] [--runs 10]

The shapes run in the order given, then once more. Each line: the first run at the shape, the
median of --runs runs after, their difference (what the new shape cost) and the resident memory.
Integer inputs are ones where the name says mask, else random in [0, 100); float inputs are
uniform in [-1, 1). Benchmark tool only (needs onnxruntime from the test venv).
"""

import argparse
import os
import statistics
import time

import numpy as np
import onnxruntime as ort


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def parse(text):
    shapes = {}
    for item in text.split(","):
        name, _, dims = item.partition("=")
        shapes[name] = tuple(int(d) for d in dims.split("x"))
    return shapes


def feeds_for(session, shapes, rng):
    feeds = {}
    for i in session.get_inputs():
        shape = shapes[i.name]
        if "int" in i.type:
            feeds[i.name] = np.ones(shape, np.int64) if "mask" in i.name else rng.integers(0, 100, shape).astype(np.int64)
        else:
            feeds[i.name] = rng.uniform(-1, 1, shape).astype(np.float32)
    return feeds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    t = time.perf_counter()
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    print(f"session {1e3 * (time.perf_counter() - t):.1f} ms, RSS {rss_mb():.1f} MB; {args.threads} thread(s)")
    print(f"{'pass':<5} {'shapes':<44} {'first ms':>10} {'median ms':>10} {'new shape':>10} {'RSS MB':>9}")
    rng = np.random.default_rng(1)
    for p in (1, 2):
        for text in args.shapes:
            feeds = feeds_for(session, parse(text), rng)
            t = time.perf_counter()
            session.run(None, feeds)
            first = 1e3 * (time.perf_counter() - t)
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                session.run(None, feeds)
                times.append(1e3 * (time.perf_counter() - t))
            median = statistics.median(times)
            print(f"{p:<5} {text:<44} {first:>10.1f} {median:>10.2f} {first - median:>10.1f} {rss_mb():>9.1f}")


if __name__ == "__main__":
    main()
