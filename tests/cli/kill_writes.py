#!/usr/bin/env python3
"""Atomic writes, proven by killing the writer: `kiln export` (model and weights sidecar, with
--sidecar-threshold 0) and `kiln run --output-dir` (.npy outputs) are SIGKILLed at random
points while they overwrite earlier results, at least 50 times each. After every kill the files
in place must load and hold exactly the old or exactly the new results, never a mix and never
an error; the next complete write must leave no temporary file and no orphaned sidecar."""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import numpy_helper

from checks import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.path.join(ROOT, "samples")
SIDECAR = re.compile(r"^m\.kiln\.[0-9a-f]{16}\.weights$")


def kiln(args, cwd, check=True):
    p = subprocess.run(args, cwd=cwd, capture_output=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p


def outputs(k, model, work, out_dir):
    """The model's outputs on the sample inputs, as {file name: bytes}."""
    shutil.rmtree(os.path.join(work, out_dir), ignore_errors=True)
    kiln([k, "run", model, "--inputs", os.path.join(SAMPLES, "cnn.inputs.npz"), "--output-dir", out_dir], work)
    d = os.path.join(work, out_dir)
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}


def kill_at_random(cmd, cwd, delay):
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    p.kill()
    p.wait()
    return p.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--kills", type=int, default=60)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    args = ap.parse_args()
    k = os.path.abspath(args.kiln)
    rng = random.Random(args.seed)
    print(f"kill_writes: seed {args.seed}")
    work = tempfile.mkdtemp(prefix="kiln-kill-")
    checks = Checks()
    check = checks.check

    try:
        # Two versions of the sample CNN: same graph, different weights, so their outputs differ.
        a_path, b_path = os.path.join(work, "a.onnx"), os.path.join(work, "b.onnx")
        shutil.copy(os.path.join(SAMPLES, "cnn.onnx"), a_path)
        m = onnx.load(a_path)
        for init in m.graph.initializer:
            arr = numpy_helper.to_array(init)
            if arr.dtype == np.float32:
                init.CopyFrom(numpy_helper.from_array((arr * 1.5 + 0.01).astype(np.float32), init.name))
        onnx.save(m, b_path)
        versions = {}
        for name in ("a", "b"):
            kiln([k, "export", name + ".onnx", "-o", name + ".kiln", "--sidecar-threshold", "0"], work)
            versions[name] = outputs(k, name + ".kiln", work, "ref_" + name)
        check("versions_differ", versions["a"] != versions["b"], "the two models give the same outputs")

        # Time one complete export to spread the kills over it.
        start = time.monotonic()
        kiln([k, "export", "a.onnx", "-o", "m.kiln", "--sidecar-threshold", "0"], work)
        duration = time.monotonic() - start
        current = "a"
        seen = {"old": 0, "new": 0}
        for i in range(args.kills):
            target = "b" if current == "a" else "a"
            delay = rng.uniform(0, duration * 1.2) if i % 4 else rng.uniform(0, 0.003)
            kill_at_random([k, "export", target + ".onnx", "-o", "m.kiln", "--sidecar-threshold", "0"], work, delay)
            got = outputs(k, "m.kiln", work, "check")
            if got == versions[current]:
                seen["old"] += 1
            elif got == versions[target]:
                seen["new"] += 1
                current = target
            else:
                check(f"export_kill_{i}", False, f"after a kill at {delay * 1000:.1f} ms the model gives neither output")
                continue
            check(f"export_kill_{i}", True)
        print(f"kill_writes: export killed {args.kills} times (a full export takes {duration * 1000:.0f} ms): "
              f"{seen['old']} left the old model, {seen['new']} the new one")
        # The next complete write cleans up whatever the killed writers left.
        kiln([k, "export", "a.onnx", "-o", "m.kiln", "--sidecar-threshold", "0"], work)
        names = sorted(f for f in os.listdir(work) if f.startswith("m.kiln") or f.startswith(".m.kiln"))
        check("export_cleans_up", len(names) == 2 and names[0] == "m.kiln" and SIDECAR.match(names[1]),
              f"files left: {names}")
        check("export_after_kills_loads", outputs(k, "m.kiln", work, "check") == versions["a"], "wrong outputs")

        # kiln run --output-dir: each .npy is replaced atomically.
        current = "a"
        outputs(k, "a.kiln", work, "out")
        start = time.monotonic()
        kiln([k, "run", "b.kiln", "--inputs", os.path.join(SAMPLES, "cnn.inputs.npz"), "--output-dir", "out"], work)
        duration = time.monotonic() - start
        kiln([k, "run", "a.kiln", "--inputs", os.path.join(SAMPLES, "cnn.inputs.npz"), "--output-dir", "out"], work)
        mixed = 0
        for i in range(args.kills):
            target = "b" if current == "a" else "a"
            delay = rng.uniform(0, duration * 1.2)
            kill_at_random([k, "run", target + ".kiln", "--inputs", os.path.join(SAMPLES, "cnn.inputs.npz"),
                            "--output-dir", "out"], work, delay)
            d = os.path.join(work, "out")
            ok = True
            for f in sorted(os.listdir(d)):
                if f.startswith("."):
                    continue
                data = open(os.path.join(d, f), "rb").read()
                ok = ok and f in versions["a"] and data in (versions["a"][f], versions["b"][f])
                np.load(os.path.join(d, f))  # must parse
            check(f"run_kill_{i}", ok, f"an output file after a kill at {delay * 1000:.1f} ms is neither version")
            if ok and all(open(os.path.join(d, f), "rb").read() == versions[target][f] for f in versions[target]):
                current = target
            mixed += 1
        kiln([k, "run", "a.kiln", "--inputs", os.path.join(SAMPLES, "cnn.inputs.npz"), "--output-dir", "out"], work)
        leftovers = [f for f in os.listdir(os.path.join(work, "out")) if f.startswith(".")]
        check("run_cleans_up", not leftovers, f"temporaries left: {leftovers}")
        print(f"kill_writes: run killed {mixed} times (a full run takes {duration * 1000:.0f} ms)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return checks.report()


if __name__ == "__main__":
    sys.exit(main())
