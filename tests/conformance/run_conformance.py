#!/usr/bin/env python3
"""ONNX node conformance for kiln.

Each case under onnx/backend/test/data/node (shipped in the onnx==1.22.0 wheel) is exported with
`kiln export` and run with `kiln run --check-against` on each of its test_data_set_N folders, in
its own processes, with a time limit per case. Results are compared with the checked-in expected
results file (tests/conformance/expected.tsv: case, status, reason), which is exact: an
unexpected failure fails the suite, and so does an unexpected pass (update the file with
--update). Statuses: pass, fail, unsupported, crash, timeout.
"""
import argparse
import concurrent.futures as futures
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_EXPECTED = os.path.join(HERE, "expected.tsv")
# Export refusals that mean "kiln does not support this" rather than "kiln got it wrong":
# unsupported ops, and types outside kiln's tensor dtypes (strings, float8, sequences, …).
UNSUPPORTED = re.compile(r"unsupported ops|is not supported|kiln supports tensors only|which kiln does not support")
STATUSES = ("pass", "fail", "unsupported", "crash", "timeout")


def default_data_dir():
    try:
        import onnx  # noqa: F401  (only to find the wheel's data)
    except ImportError:
        return None
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")


def first_line(text):
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return ""


def run_step(cmd, deadline, env):
    """Runs one command; returns (status or None if ok, reason, returncode)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return "timeout", "time limit reached", None
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
    except subprocess.TimeoutExpired:
        return "timeout", "time limit reached", None
    out = p.stderr + p.stdout
    if p.returncode < 0:
        return "crash", f"killed by signal {signal.Signals(-p.returncode).name}: {first_line(p.stderr)}", p.returncode
    if "AddressSanitizer" in out or "runtime error:" in out or "LeakSanitizer" in out:
        return "crash", "sanitizer: " + next((l for l in out.splitlines() if "Sanitizer" in l or "runtime error" in l), ""), p.returncode
    if p.returncode not in (0, 1, 2, 3):
        return "crash", f"exit code {p.returncode}: {first_line(p.stderr)}", p.returncode
    return None, out, p.returncode


def strip_prefix(line):
    # "kiln export: error: /path/model.onnx: node 'x': what" -> "node 'x': what"
    line = re.sub(r"^kiln \w+: error: ", "", line)
    line = re.sub(r"^\S*(model\.onnx|\.kiln|\.pb|\.npy): ", "", line)
    return line


def run_case(kiln, case_dir, work_dir, timeout, env):
    name = os.path.basename(case_dir)
    deadline = time.monotonic() + timeout
    out_model = os.path.join(work_dir, name + ".kiln")
    status, out, rc = run_step([kiln, "export", os.path.join(case_dir, "model.onnx"), "-o", out_model], deadline, env)
    if status:
        return name, status, out
    if rc != 0:
        line = strip_prefix(first_line(out))
        if rc == 2 and UNSUPPORTED.search(line):
            return name, "unsupported", line
        return name, "fail", "export: " + line
    sets = sorted(d for d in os.listdir(case_dir) if d.startswith("test_data_set_"))
    if not sets:
        return name, "fail", "no test_data_set folder"
    for s in sets:
        data = os.path.join(case_dir, s)
        status, out, rc = run_step([kiln, "run", out_model, "--inputs", data, "--check-against", data], deadline, env)
        if status:
            return name, status, out
        if rc == 3:
            bad = next((l for l in out.splitlines() if "FAILED" in l), first_line(out))
            return name, "fail", f"{s}: mismatch: {bad.strip()}"
        if rc != 0:
            return name, "fail", f"{s}: run: {strip_prefix(first_line(out))}"
    try:
        os.remove(out_model)
    except OSError:
        pass
    return name, "pass", ""


def read_expected(path):
    expected = {}
    if not os.path.exists(path):
        return expected
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            expected[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return expected


def write_expected(path, results):
    with open(path, "w") as f:
        f.write("# ONNX node conformance expectations for kiln (onnx==1.22.0 node cases).\n")
        f.write("# case<TAB>status<TAB>reason; regenerate with tests/conformance/run_conformance.py --update\n")
        for name in sorted(results):
            status, reason = results[name]
            reason = reason.replace("\t", " ").replace("\n", " ")[:300]
            f.write(f"{name}\t{status}\t{reason}\n" if status != "pass" else f"{name}\tpass\t\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True, help="path to the kiln binary")
    ap.add_argument("--data", default=None, help="folder of node cases (default: the onnx wheel's)")
    ap.add_argument("--expected", default=DEFAULT_EXPECTED)
    ap.add_argument("--filter", default=None, help="regex on case names")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--report", action="store_true", help="print every case's result")
    ap.add_argument("--update", action="store_true", help="rewrite the expected-results file")
    args = ap.parse_args()

    data = args.data or default_data_dir()
    if not data or not os.path.isdir(data):
        print(f"conformance: error: no ONNX node test data at {data!r}; install onnx==1.22.0 (scripts/requirements.txt)")
        return 1
    if not os.access(args.kiln, os.X_OK):
        print(f"conformance: error: {args.kiln} is not an executable")
        return 1
    cases = sorted(d for d in os.listdir(data) if os.path.isfile(os.path.join(data, d, "model.onnx")))
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c)]
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "abort_on_error=1:detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:abort_on_error=1:print_stacktrace=1")

    results = {}
    with tempfile.TemporaryDirectory(prefix="kiln-conformance-") as work:
        with futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            jobs = [pool.submit(run_case, args.kiln, os.path.join(data, c), work, args.timeout, env) for c in cases]
            for job in futures.as_completed(jobs):
                name, status, reason = job.result()
                results[name] = (status, strip_prefix(first_line(reason)) if status != "pass" else "")
                if args.report:
                    print(f"{name}: {status}{': ' + results[name][1] if results[name][1] else ''}", flush=True)

    counts = {s: sum(1 for st, _ in results.values() if st == s) for s in STATUSES}
    summary = (f"{counts['pass']} passed, {counts['fail']} failed, {counts['unsupported']} unsupported, "
               f"{counts['crash']} crashed, {counts['timeout']} timed out")

    if args.update:
        merged = read_expected(args.expected) if args.filter else {}
        merged.update(results)
        write_expected(args.expected, merged)
        print(f"conformance: wrote {args.expected}")
        print(summary)
        return 0

    expected = read_expected(args.expected)
    problems = []
    for name, (status, reason) in sorted(results.items()):
        want = expected.get(name)
        if want is None:
            problems.append(f"{name}: {status} but the case is not in {os.path.basename(args.expected)}")
        elif want[0] != status:
            hint = " (update the expected file with --update)" if status == "pass" else ""
            problems.append(f"{name}: expected {want[0]} but got {status}{': ' + reason if reason else ''}{hint}")
    if not args.filter:
        for name in sorted(set(expected) - set(results)):
            problems.append(f"{name}: listed in the expected file but its data is missing")
    for p in problems:
        print("conformance: " + p)
    print(summary)
    if problems:
        print(f"conformance: {len(problems)} case(s) differ from the expected results")
        return 1
    if counts["crash"] or counts["timeout"]:
        print("conformance: crashes or time-outs are never expected")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
