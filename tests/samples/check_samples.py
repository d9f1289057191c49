#!/usr/bin/env python3
"""Checks that the committed samples are what samples/make_samples.py makes.

    python tests/samples/check_samples.py [--samples-dir DIR] [--keep-temp]

Reruns make_samples.py with --out-dir into a temporary folder, then checks one file at a time:
each model and input file under samples/ (NAME.onnx, NAME.inputs.npz) must be reproduced with
the same bytes, and each expected output (NAME.expected/*.npy) with the same dtype and shape and
values within 1e-5 + 1e-5·|value|: they are computed with numpy, whose vectorised sums and BLAS
may round differently from run to run (the data's alignment, the CPU, the thread count), and each file the script writes must be in samples/ (a sample
added to the script but not committed fails too). Other files in samples/ (the script itself,
docs, calibration data) are not the script's output and are left alone. Prints one line per
failing file, then 'N passed, M failed'; exit status 1 on any failure, including the script
itself failing (it exits 1 when onnxruntime disagrees with its reference outputs).
Test tool only: needs the Python that runs make_samples.py (onnx, onnxruntime, numpy).
"""

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SAMPLES = os.path.join(ROOT, "samples")


def sample_files(folder):
    """Relative paths of the generator's kind of files in `folder`: top-level *.onnx and
    *.inputs.npz, and everything inside top-level *.expected/ folders."""
    found = set()
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isfile(path) and (entry.endswith(".onnx") or entry.endswith(".inputs.npz")):
            found.add(entry)
        elif os.path.isdir(path) and entry.endswith(".expected"):
            for inner in sorted(os.listdir(path)):
                found.add(f"{entry}/{inner}")
    return found


def first_difference(a, b):
    """A short description of where two byte strings part."""
    limit = min(len(a), len(b))
    index = next((i for i in range(limit) if a[i] != b[i]), limit)
    return f"{len(a)} bytes committed, {len(b)} regenerated, first difference at byte {index}"


def values_differ(want, got):
    """None when two .npy images hold the same dtype, shape and values within tolerance."""
    a = np.load(io.BytesIO(want), allow_pickle=False)
    b = np.load(io.BytesIO(got), allow_pickle=False)
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"committed {a.dtype} {list(a.shape)}, regenerated {b.dtype} {list(b.shape)}"
    if np.allclose(b, a, rtol=1e-5, atol=1e-5, equal_nan=True):
        return None
    return f"values differ (max abs difference {float(np.max(np.abs(a.astype(np.float64) - b))):.3g})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples-dir", default=DEFAULT_SAMPLES,
                        help="the committed samples and make_samples.py (default: samples/)")
    parser.add_argument("--keep-temp", action="store_true",
                        help="keep the regenerated folder and print its path")
    args = parser.parse_args(argv)
    samples = os.path.abspath(args.samples_dir)
    script = os.path.join(samples, "make_samples.py")

    passed, failures = 0, []
    temp = tempfile.mkdtemp(prefix="kiln-samples-")
    try:
        # One BLAS thread: the same summation order as when the samples were made, whatever
        # else the machine is doing.
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, script, "--out-dir", temp],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            detail = (proc.stdout + proc.stderr).strip().splitlines()
            failures.append(f"make_samples.py exited {proc.returncode}: "
                            + (detail[-1] if detail else "(no output)"))
        made = sample_files(temp)
        committed = sample_files(samples) if os.path.isdir(samples) else set()
        if not made and proc.returncode == 0:
            failures.append(f"make_samples.py wrote no samples into {temp}")
        for rel in sorted(committed | made):
            if rel not in made:
                failures.append(f"{rel}: in samples/ but make_samples.py no longer writes it")
                continue
            if rel not in committed:
                failures.append(f"{rel}: made by make_samples.py but missing from samples/ "
                                "(run samples/make_samples.py and commit it)")
                continue
            with open(os.path.join(samples, rel), "rb") as f:
                want = f.read()
            with open(os.path.join(temp, rel), "rb") as f:
                got = f.read()
            problem = None
            if want != got:
                problem = first_difference(want, got)
                if ".expected" + os.sep in rel and rel.endswith(".npy"):
                    problem = values_differ(want, got)
            if problem:
                failures.append(f"{rel}: not reproduced: {problem}")
            else:
                passed += 1
    finally:
        if args.keep_temp:
            print(f"regenerated samples kept in {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)

    for failure in failures:
        print(f"FAIL {failure}")
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
