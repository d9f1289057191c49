#!/usr/bin/env python3
"""Times kiln's reference runtime against ONNX Runtime on the real-sized test models.

    python bench/ref_runtime.py --kiln PATH [--models NAME ...] [--repeat N] [--work-dir DIR]

For each model (made by tests/models/make_models.py, reused from --work-dir when current) it
exports NAME.kiln once, then measures on the same NAME.inputs.npz:
  - kiln: the wall time of a whole `kiln run NAME.kiln --inputs NAME.inputs.npz` process, so it
    includes process start, reading the model and the inputs; the same measurement on the tiny
    samples/mlp model shows how much of that is fixed overhead;
  - ONNX Runtime (CPU): session.run only, in a session with the default graph optimizations,
    once with intra_op_num_threads=1 and once with the default thread count; the session's
    creation time is shown apart.
Each figure is the median of --repeat timed runs after --warmup untimed ones, with the min-max
spread; the ratio columns are kiln's median over ORT's. Prints a table; stores nothing.
See bench/README.md for how to read it. Needs onnxruntime and numpy (scripts/requirements.txt).
"""

import argparse
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

TINY = "mlp"  # samples/mlp: a few KB, so its kiln time is the fixed cost of a `kiln run`
TINY_DIR = os.path.join(ROOT, "samples")


class Failed(Exception):
    """A measurement that could not be made; the row shows the reason."""


class Timing:
    """The seconds of repeated runs of one measurement."""

    def __init__(self, seconds):
        self.seconds = sorted(seconds)

    @property
    def median(self):
        return statistics.median(self.seconds)

    def cell(self):
        lo, hi = self.seconds[0], self.seconds[-1]
        return f"{fmt_time(self.median)} ({fmt_time(lo)}-{fmt_time(hi)})"


def fmt_time(seconds):
    """Three significant digits in the unit that suits: 412 us, 12.3 ms, 1.52 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale or unit == "us":
            value = seconds / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{seconds:.3g} s"


def fmt_ratio(ratio):
    return f"{ratio:.3g}x" if ratio < 1000 else f"{ratio:.0f}x"


def run_checked(cmd, timeout):
    """Runs cmd and returns its wall time in seconds; raises Failed when it does not exit 0."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"{os.path.basename(cmd[0])} {cmd[1]}: timed out after {timeout:g} s")
    except OSError as e:
        raise Failed(f"cannot start {cmd[0]}: {e.strerror}")
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise Failed(f"{os.path.basename(cmd[0])} {cmd[1]}: exit code {proc.returncode}: "
                     + last_line(proc.stderr))
    return seconds


def time_kiln(kiln, onnx_path, inputs_path, scratch, args):
    """Exports the model once, then times whole `kiln run` processes."""
    kiln_path = os.path.join(scratch, os.path.basename(onnx_path)[:-len(".onnx")] + ".kiln")
    run_checked([kiln, "export", onnx_path, "-o", kiln_path], args.timeout)
    try:
        cmd = [kiln, "run", kiln_path, "--inputs", inputs_path]
        for _ in range(args.warmup):
            run_checked(cmd, args.timeout)
        return Timing([run_checked(cmd, args.timeout) for _ in range(args.repeat)])
    finally:
        os.remove(kiln_path)


def time_ort(onnx_path, inputs, threads, args):
    """(session creation seconds, Timing of session.run) with ORT's default optimizations;
    threads=0 is ORT's default thread count."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        raise Failed(f"onnxruntime: {str(e).splitlines()[0]}")
    created = time.perf_counter() - start
    names = [o.name for o in session.get_outputs()]
    for _ in range(args.warmup):
        session.run(names, inputs)
    seconds = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        session.run(names, inputs)
        seconds.append(time.perf_counter() - start)
    return created, Timing(seconds)


def measure(name, onnx_path, inputs_path, kiln, scratch, args):
    """One table row: a dict of cells, or Failed's reason under 'error'."""
    row = {"model": name}
    try:
        row["kiln"] = time_kiln(kiln, onnx_path, inputs_path, scratch, args)
        inputs = load_npz(inputs_path)
        row["load"], row["ort1"] = time_ort(onnx_path, inputs, 1, args)
        _, row["ortN"] = time_ort(onnx_path, inputs, 0, args)
    except Failed as e:
        row["error"] = str(e)
    return row


def print_table(rows, repeat):
    headers = ["model", "kiln run (whole process)", "ORT 1 thread", "ORT default threads",
               "ORT session", "kiln/ORT-1", "kiln/ORT-N"]
    table = [headers]
    for row in rows:
        if "error" in row:
            table.append([row["model"], "FAILED: " + row["error"]])
            continue
        kiln = row["kiln"].median
        table.append([row["model"], row["kiln"].cell(), row["ort1"].cell(), row["ortN"].cell(),
                      fmt_time(row["load"]), fmt_ratio(kiln / row["ort1"].median),
                      fmt_ratio(kiln / row["ortN"].median)])
    widths = [max(len(r[i]) for r in table if len(r) == len(headers)) for i in range(len(headers))]
    widths[0] = max(len(r[0]) for r in table)
    for r in table:
        if len(r) != len(headers):
            print(f"{r[0]:{widths[0]}s}  {r[1]}")
            continue
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        print("  ".join(cells))
        if r is headers:
            print("  ".join("-" * w for w in widths))
    print(f"\nmedian (min-max) of {repeat} timed runs. ORT default threads: one per "
          f"physical core. The '{TINY} (overhead)' row is the fixed cost of a kiln run process.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kiln", required=True, help="the kiln binary")
    parser.add_argument("--models", nargs="+", metavar="NAME", choices=list(MODELS),
                        default=list(MODELS), help="models to time (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per figure (default 3)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs before the timed ones (default 1)")
    parser.add_argument("--work-dir", default=DEFAULT_OUT_DIR,
                        help="folder of the generated models, shared with the model tests "
                             "(default: tests/models/generated)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds allowed for one kiln command (default 1800)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be at least 1 and --warmup at least 0")
    kiln = os.path.abspath(args.kiln)
    if not (os.path.isfile(kiln) and os.access(kiln, os.X_OK)):
        print(f"error: {kiln}: no executable kiln binary", file=sys.stderr)
        return 1

    import onnxruntime as ort

    version = subprocess.run([kiln, "--version"], capture_output=True, text=True).stdout.strip()
    threads = os.cpu_count()
    print(f"{version or 'kiln'}; onnxruntime {ort.__version__}; numpy {np.__version__}; "
          f"{platform.machine()}, {threads} logical CPUs; repeat {args.repeat}, "
          f"warmup {args.warmup}", flush=True)

    generated = Generated(os.path.abspath(args.work_dir))
    os.makedirs(generated.work_dir, exist_ok=True)
    rows = []
    # The exported .kiln files are as big as the models: next to them, not in a small /tmp.
    with tempfile.TemporaryDirectory(prefix="kiln-bench-", dir=generated.work_dir) as scratch:
        rows.append(measure(f"{TINY} (overhead)", os.path.join(TINY_DIR, f"{TINY}.onnx"),
                            os.path.join(TINY_DIR, f"{TINY}.inputs.npz"), kiln, scratch, args))
        for name in args.models:
            gen_s, error = generated.ensure(name)
            if gen_s is not None and not error:
                print(f"generated {name} in {gen_s:.1f} s", flush=True)
            if error:
                rows.append({"model": name, "error": error})
                continue
            onnx_path = os.path.join(generated.work_dir, f"{name}.onnx")
            inputs_path = os.path.join(generated.work_dir, f"{name}.inputs.npz")
            rows.append(measure(name, onnx_path, inputs_path, kiln, scratch, args))
            print(f"timed {name}", flush=True)
    print()
    print_table(rows, args.repeat)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
