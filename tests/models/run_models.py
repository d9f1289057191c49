#!/usr/bin/env python3
"""Real-sized model test: kiln's reference runtime against ONNX Runtime, compiled kiln against both.

    python tests/models/run_models.py --kiln PATH --work-dir DIR [--only NAME ...] [--keep]

Generates the models of make_models.py into DIR (skipping any whose files are already there and
were made by the current generator, see Generated), then for each model NAME runs

    kiln export DIR/NAME.onnx -o DIR/NAME.kiln
    kiln run DIR/NAME.kiln --inputs DIR/NAME.inputs.npz --output-dir DIR/NAME.kiln-out --reference
    kiln compile DIR/NAME.kiln -o DIR/NAME.c.kiln --input-shape ... (the inputs' shapes)
    kiln run DIR/NAME.c.kiln --inputs DIR/NAME.inputs.npz --threads T --output-dir DIR/NAME.kiln-out-cT  (T = 1, 2)

and compares every DIR/NAME.kiln-out/<output>.npy with the onnxruntime reference
DIR/NAME.ort/<output>.npy: an output passes when its relative L2 error ||a-b||_2 / ||b||_2 is at
most 1e-4, and every element within 1e-4 + 1e-4·|ref| (the max abs error is printed too); the
compiled model's outputs are held to the same limits against the reference run. One line per model, then 'N passed, M failed';
exit status 1 on any failure. A missing kiln, a generator error or a missing output is a
failure, never a skip. The .kiln files and output folders are deleted once a model passes (they are as
big as the model); a failing model keeps them for a look, and --keep keeps them always.
Test tool only: needs numpy (and onnx, onnxruntime for the generator).
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_models import MODELS  # noqa: E402  (the model names, in the generator's order)

GENERATOR = os.path.join(HERE, "make_models.py")
# Files whose contents decide what the generator writes: a change to either remakes the models.
GENERATOR_SOURCES = [GENERATOR, os.path.join(HERE, "ort_reference.py")]
MODEL_NAMES = list(MODELS)
REL_L2_LIMIT = 1e-4
# Per element as well, so one wrong value in a large output cannot hide in the norm:
# |a - b| <= ELEMENT_ATOL + ELEMENT_RTOL * |b|.
ELEMENT_ATOL = 1e-4
ELEMENT_RTOL = 1e-4


def generator_fingerprint():
    """sha256 over the generator's sources plus the onnx and onnxruntime versions (the
    references are onnxruntime's outputs, so a new onnxruntime remakes them too)."""
    digest = hashlib.sha256()
    for path in GENERATOR_SOURCES:
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    for package in ("onnx", "onnxruntime", "numpy"):
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            version = "missing"
        digest.update(f"{package}={version}\n".encode())
    return digest.hexdigest()


def model_files(work_dir, name):
    """Relative paths and sizes of what the generator wrote for NAME."""
    files = {}
    for rel in (f"{name}.onnx", f"{name}.inputs.npz"):
        path = os.path.join(work_dir, rel)
        if os.path.isfile(path):
            files[rel] = os.path.getsize(path)
    ort_dir = os.path.join(work_dir, f"{name}.ort")
    if os.path.isdir(ort_dir):
        for entry in sorted(os.listdir(ort_dir)):
            if entry.endswith(".npy"):
                files[f"{name}.ort/{entry}"] = os.path.getsize(os.path.join(ort_dir, entry))
    return files


class Generated:
    """The generated files of each model, made once and reused: after a model is generated a
    stamp DIR/NAME.stamp records the generator fingerprint and the size of every file written.
    A model is regenerated when its stamp is missing, names another fingerprint, or a file it
    lists is gone or has another size (an interrupted run, a deleted file)."""

    def __init__(self, work_dir, python=sys.executable):
        self.work_dir, self.python = work_dir, python
        self.fingerprint = generator_fingerprint()

    def stamp_path(self, name):
        return os.path.join(self.work_dir, f"{name}.stamp")

    def is_current(self, name):
        try:
            with open(self.stamp_path(name)) as f:
                stamp = json.load(f)
        except (OSError, ValueError):
            return False
        files = stamp.get("files")
        return (stamp.get("fingerprint") == self.fingerprint and isinstance(files, dict)
                and f"{name}.onnx" in files and f"{name}.inputs.npz" in files
                and any(rel.startswith(f"{name}.ort/") for rel in files)
                and model_files(self.work_dir, name) == files)

    def ensure(self, name):
        """Makes NAME's files unless current ones are there. Returns (seconds spent or None
        when reused, error message or None)."""
        if self.is_current(name):
            return None, None
        os.makedirs(self.work_dir, exist_ok=True)
        stamp = self.stamp_path(name)
        if os.path.exists(stamp):
            os.remove(stamp)
        # Stale reference outputs of an older generator must not survive next to new ones.
        shutil.rmtree(os.path.join(self.work_dir, f"{name}.ort"), ignore_errors=True)
        start = time.perf_counter()
        # One process per model: a generator failure is that model's failure, and the memory
        # of a big model is returned before the next one.
        proc = subprocess.run([self.python, GENERATOR, "--out-dir", self.work_dir, "--only", name],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            return seconds, (f"make_models.py --only {name} exited {proc.returncode}: "
                             + last_line(proc.stderr or proc.stdout))
        files = model_files(self.work_dir, name)
        if f"{name}.onnx" not in files or not any(r.startswith(f"{name}.ort/") for r in files):
            return seconds, f"make_models.py --only {name} wrote no model or no reference outputs"
        with open(stamp, "w") as f:
            json.dump({"fingerprint": self.fingerprint, "files": files}, f, indent=1,
                      sort_keys=True)
        return seconds, None


def last_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_timed(cmd, timeout):
    """Runs cmd; returns (seconds, error message or None)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, f"timed out after {timeout} s"
    except OSError as e:
        return time.perf_counter() - start, f"cannot start {cmd[0]}: {e.strerror}"
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        how = (f"killed by {signal_name(-proc.returncode)}" if proc.returncode < 0
               else f"exit code {proc.returncode}")
        return seconds, f"{how}: {last_line(proc.stderr or proc.stdout)}"
    return seconds, None


def compare(actual, expected):
    """(relative L2 error, max abs error, problem or None) of kiln's output against the
    reference. Non-finite values must match exactly and are left out of the norms."""
    if actual.dtype != expected.dtype:
        return None, None, f"dtype {actual.dtype}, reference {expected.dtype}"
    if actual.shape != expected.shape:
        return None, None, f"shape {list(actual.shape)}, reference {list(expected.shape)}"
    a = actual.astype(np.float64).ravel()
    b = expected.astype(np.float64).ravel()
    finite = np.isfinite(b)
    if not np.array_equal(np.isfinite(a), finite) or not np.array_equal(a[~finite], b[~finite],
                                                                         equal_nan=True):
        bad = int(np.count_nonzero((np.isfinite(a) != finite) | (~finite & (a != b))))
        return None, None, (f"non-finite values (nan, inf) differ from the reference at {bad} "
                            f"of {b.size} positions")
    diff = a[finite] - b[finite]
    norm = float(np.linalg.norm(b[finite]))
    err = float(np.linalg.norm(diff))
    rel = err / norm if norm > 0 else err
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    outside = np.abs(diff) > ELEMENT_ATOL + ELEMENT_RTOL * np.abs(b[finite])
    if np.any(outside):
        i = int(np.argmax(outside))
        return rel, max_abs, (f"{int(np.count_nonzero(outside))} of {b.size} elements differ by more than "
                              f"{ELEMENT_ATOL:g} + {ELEMENT_RTOL:g}*|ref| (first: {a[finite][i]:.6g} vs "
                              f"{b[finite][i]:.6g}); relative L2 error {rel:.3g}")
    return rel, max_abs, None


def check_outputs(out_dir, ref_dir):
    """Compares every reference output with kiln's. Returns (worst relative L2, worst max abs,
    list of problems); the errors are None when no output could be compared."""
    problems = []
    refs = sorted(f for f in os.listdir(ref_dir) if f.endswith(".npy"))
    got = set(f for f in os.listdir(out_dir) if f.endswith(".npy")) if os.path.isdir(out_dir) else set()
    if not refs:
        problems.append(f"no reference outputs in {ref_dir}")
    worst_rel, worst_abs = None, None
    for file in refs:
        output = file[:-len(".npy")]
        if file not in got:
            problems.append(f"output {output}: kiln wrote no {file}")
            continue
        try:
            actual = np.load(os.path.join(out_dir, file), allow_pickle=False)
        except (OSError, ValueError) as e:
            problems.append(f"output {output}: cannot read kiln's {file}: {e}")
            continue
        expected = np.load(os.path.join(ref_dir, file), allow_pickle=False)
        rel, max_abs, problem = compare(actual, expected)
        if problem:
            problems.append(f"output {output}: {problem}")
            continue
        worst_rel = rel if worst_rel is None else max(worst_rel, rel)
        worst_abs = max_abs if worst_abs is None else max(worst_abs, max_abs)
        if not rel <= REL_L2_LIMIT:
            problems.append(f"output {output}: relative L2 error {rel:.3g} > {REL_L2_LIMIT:g} "
                            f"(max abs {max_abs:.3g})")
    for file in sorted(got - set(refs)):
        problems.append(f"kiln wrote {file}, which is not an output of the reference")
    return worst_rel, worst_abs, problems


def input_shape_flags(inputs_path):
    """--input-shape NAME=AxB... for every array of the inputs file."""
    flags = []
    with np.load(inputs_path, allow_pickle=False) as z:
        for key in z.files:
            flags += ["--input-shape", f"{key}=" + ("x".join(str(d) for d in z[key].shape) or "scalar")]
    return flags


def test_model(kiln, work_dir, name, keep, timeout):
    """Exports and runs one model on the reference kernels (checked against ONNX Runtime), then
    compiles it for its inputs' shapes and runs the compiled model at 1 and 2 threads (checked
    against the reference run). Returns (ok, result line, problems, repro commands)."""
    onnx_path = os.path.join(work_dir, f"{name}.onnx")
    kiln_path = os.path.join(work_dir, f"{name}.kiln")
    compiled_path = os.path.join(work_dir, f"{name}.c.kiln")
    inputs_path = os.path.join(work_dir, f"{name}.inputs.npz")
    out_dir = os.path.join(work_dir, f"{name}.kiln-out")
    export_cmd = [kiln, "export", onnx_path, "-o", kiln_path]
    run_cmd = [kiln, "run", kiln_path, "--inputs", inputs_path, "--output-dir", out_dir, "--reference"]
    compile_cmd = [kiln, "compile", kiln_path, "-o", compiled_path] + input_shape_flags(inputs_path)
    compiled_runs = [(t, [kiln, "run", compiled_path, "--inputs", inputs_path, "--threads", str(t), "--output-dir",
                          f"{out_dir}-c{t}"]) for t in (1, 2)]
    repro = [" ".join(export_cmd), " ".join(run_cmd), " ".join(compile_cmd)] + [" ".join(c) for _, c in compiled_runs]
    for path in (kiln_path, compiled_path):
        if os.path.exists(path):
            os.remove(path)
    for d in [out_dir] + [f"{out_dir}-c{t}" for t, _ in compiled_runs]:
        shutil.rmtree(d, ignore_errors=True)

    export_s, error = run_timed(export_cmd, timeout)
    run_s, rel, max_abs, compiled_rel = None, None, None, None
    problems = []
    if error:
        problems.append(f"kiln export: {error}")
    else:
        run_s, error = run_timed(run_cmd, timeout)
        if error:
            problems.append(f"kiln run --reference: {error}")
        else:
            rel, max_abs, problems = check_outputs(out_dir, os.path.join(work_dir, f"{name}.ort"))
    if not problems:
        _, error = run_timed(compile_cmd, timeout)
        if error:
            problems.append(f"kiln compile: {error}")
        for threads, cmd in compiled_runs:
            if error:
                break
            _, error = run_timed(cmd, timeout)
            if error:
                problems.append(f"kiln run (compiled, {threads} threads): {error}")
                break
            c_rel, _, c_problems = check_outputs(f"{out_dir}-c{threads}", out_dir)
            problems += [f"compiled, {threads} threads, against the reference run: {p}" for p in c_problems]
            compiled_rel = c_rel if compiled_rel is None else max(compiled_rel, c_rel or 0)
    ok = not problems
    if ok and not keep:
        for path in (kiln_path, compiled_path):
            os.remove(path)
        for d in [out_dir] + [f"{out_dir}-c{t}" for t, _ in compiled_runs]:
            shutil.rmtree(d, ignore_errors=True)

    def secs(s):
        return f"{s:7.2f} s" if s is not None else "      - "

    def num(x):
        return f"{x:9.2e}" if x is not None else "        -"

    line = (f"{name:16s} export {secs(export_s)}  run {secs(run_s)}  rel L2 {num(rel)}  "
            f"max abs {num(max_abs)}  compiled rel L2 {num(compiled_rel)}  {'PASS' if ok else 'FAIL'}")
    return ok, line, problems, repro


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kiln", required=True, help="the kiln binary")
    parser.add_argument("--work-dir", required=True,
                        help="folder for the generated models (reused across runs) and kiln's "
                             "artifacts")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=MODEL_NAMES,
                        help="test just these models (default: all)")
    parser.add_argument("--keep", action="store_true",
                        help="keep NAME.kiln and NAME.kiln-out of passing models too")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds allowed for each kiln command (default 900)")
    args = parser.parse_args(argv)

    kiln = os.path.abspath(args.kiln)
    work_dir = os.path.abspath(args.work_dir)
    names = args.only or MODEL_NAMES
    kiln_missing = not (os.path.isfile(kiln) and os.access(kiln, os.X_OK))
    if kiln_missing:
        print(f"error: {kiln}: no executable kiln binary", flush=True)
    generated = Generated(work_dir)
    passed, failed = 0, []
    start = time.perf_counter()
    for name in names:
        # Without a kiln there is nothing to test: fail at once rather than generate for minutes.
        gen_s, error = (None, None) if kiln_missing else generated.ensure(name)
        if gen_s is not None and not error:
            print(f"{name:16s} generated in {gen_s:.1f} s", flush=True)
        if kiln_missing:
            ok, line, problems, repro = False, f"{name:16s} FAIL", [f"no kiln binary at {kiln}"], []
        elif error:
            ok, line, problems, repro = False, f"{name:16s} FAIL", [f"generator: {error}"], []
        else:
            ok, line, problems, repro = test_model(kiln, work_dir, name, args.keep, args.timeout)
        print(line, flush=True)
        for problem in problems:
            print(f"    {problem}", flush=True)
        if not ok and repro:
            print("    reproduce with:", flush=True)
            for cmd in repro:
                print(f"      {cmd}", flush=True)
        if ok:
            passed += 1
        else:
            failed.append(name)
    print(f"total {time.perf_counter() - start:.1f} s"
          + (f"; failed: {' '.join(failed)}" if failed else ""))
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
