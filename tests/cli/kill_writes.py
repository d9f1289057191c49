#!/usr/bin/env python3
"""Atomic writes, proven by killing the writer.

`kiln export` (a model and its weights sidecar, --sidecar-threshold 0) and `kiln run
--output-dir` (.npy outputs) are SIGKILLed while they overwrite earlier results: at random
points (60 kills each by default; seeded, the seed printed; see kill_plan) and, where strace
can trace, right before each of the writer's fsync, rename and unlink calls in turn. After every kill the files in place must load (`kiln inspect`) and
give exactly the old or exactly the new results, never a mix and never an error, and the model
must find its sidecar; the next complete write must leave no temporary file and no orphaned
sidecar. Each kill is classed by what it left: before (no file of its own yet), writing (its
temporaries only), between (the new sidecar renamed into place, the old model still there) or
after (the new model in place).
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
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
INPUTS = os.path.join(SAMPLES, "cnn.inputs.npz")
SIDECAR = re.compile(r"^m\.kiln\.[0-9a-f]{16}\.weights$")
SIDECAR_REF = re.compile(rb"m\.kiln\.[0-9a-f]{16}\.weights")
# The calls before which the syscall-precise kills land.
WRITE_CALLS = "fsync,rename,renameat,renameat2,unlink,unlinkat"
PHASES = ("before", "writing", "between", "after")


def make_other_cnn(src, dst, seed):
    """The sample CNN with other weights (each scaled by a seeded factor in [0.5, 1.5), so
    batch-norm variances stay positive): same graph and names, other outputs."""
    m = onnx.load(src)
    rng = np.random.default_rng(seed)
    for init in m.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.dtype == np.float32:
            arr = (arr * rng.uniform(0.5, 1.5, arr.shape)).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
    onnx.save(m, dst)


def sweep_openmp_registrations():
    """Removes the registrations (/dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>) that LLVM's OpenMP
    runtime, in the sanitizer build, leaves behind when its process is SIGKILLed. A process that
    later gets such a pid removes the file itself with one more unlink; with none left, each
    command's calls are the same from run to run and a precise kill lands where it was aimed."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        m = re.fullmatch(r"__KMP_REGISTERED_LIB_(\d+)_\d+", name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
        except OSError:
            pass  # alive, someone else's


def kill_plan(rng, i, timing):
    """When to kill the i-th run of a command: (seconds, after_first_temp). A quarter of the
    kills come within 2 ms of the start, a quarter anywhere up to 1.25 x the command's duration,
    half once its first temporary file has appeared, spread over its write phase (temporary
    to exit) and a little past it: most of a run is parsing and computing, the writes are short."""
    duration, writing = timing
    if i % 4 == 0:
        return rng.uniform(0, 0.002), False
    if i % 4 == 1:
        return rng.uniform(0, 1.25 * duration), False
    return rng.uniform(0, 1.2 * writing), True


def describe(plan):
    return f"{plan[0] * 1000:.2f} ms after " + ("its first temporary" if plan[1] else "the start")


def describe_timing(timing):
    return f"a complete one takes {timing[0] * 1000:.0f} ms, {timing[1] * 1000:.1f} ms of it from the first temporary on"


def snapshot(folder):
    """{file name: inode} of a folder."""
    return {e.name: e.inode() for e in os.scandir(folder)}


def appeared(before, after, hidden):
    """Names new in `after` (or replaced: another inode), hidden ones (temporaries) or not."""
    return [n for n, ino in after.items() if n.startswith(".") == hidden and before.get(n) != ino]


class Tester:
    def __init__(self, kiln, work, checks):
        self.kiln, self.work, self.checks = kiln, work, checks
        self.strace = self._strace_works()

    def run(self, args, cwd=None):
        return subprocess.run([self.kiln] + args, cwd=cwd or self.work, capture_output=True)

    def ok(self, args, cwd=None):
        p = self.run(args, cwd)
        if p.returncode != 0:
            raise RuntimeError(f"kiln {' '.join(args)}: exit {p.returncode}: {p.stderr.decode(errors='replace')}")

    def outputs(self, model, out_dir):
        """The model's outputs on the sample inputs as {file name: bytes}, or the error."""
        shutil.rmtree(out_dir, ignore_errors=True)
        p = self.run(["run", model, "--inputs", INPUTS, "--output-dir", out_dir])
        if p.returncode != 0:
            return f"kiln run exit {p.returncode}: {p.stderr.decode(errors='replace').strip()}"
        return {f: open(os.path.join(out_dir, f), "rb").read() for f in sorted(os.listdir(out_dir))}

    def start(self, args, cwd, folder):
        """Starts `kiln args`; returns the process and its start time."""
        return subprocess.Popen([self.kiln] + args, cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL), time.monotonic()

    @staticmethod
    def wait_for_temporary(p, folder):
        """Waits until `p` has a temporary file in `folder` (`.<name>.tmp.<pid>.<n>`) or exits."""
        mark = f".tmp.{p.pid}."
        while p.poll() is None and not any(mark in n for n in os.listdir(folder)):
            time.sleep(0.0002)

    def timing(self, args, cwd, folder):
        """(run time, write time) of `kiln args` writing into `folder`: medians over three
        complete runs of the seconds from start to exit and from its first temporary to exit."""
        total, writing = [], []
        for _ in range(3):
            p, start = self.start(args, cwd, folder)
            self.wait_for_temporary(p, folder)
            first_temp = time.monotonic()
            p.wait()
            total.append(time.monotonic() - start)
            writing.append(time.monotonic() - first_temp)
        return statistics.median(total), statistics.median(writing)

    def kill(self, args, cwd, folder, plan):
        """Starts `kiln args` and SIGKILLs it `plan[0]` s after its start or, when `plan[1]`,
        after its first temporary file appears in `folder`."""
        p, _ = self.start(args, cwd, folder)
        delay, after_first_temp = plan
        if after_first_temp:
            self.wait_for_temporary(p, folder)
        time.sleep(delay)
        p.kill()
        p.wait()

    @staticmethod
    def _strace_works():
        try:
            return subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"], capture_output=True).returncode == 0
        except OSError:
            return False

    def _strace(self, args, cwd, options):
        sweep_openmp_registrations()
        env = dict(os.environ)
        # LeakSanitizer cannot stop the world under ptrace; a run that completes would fail.
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
        return subprocess.run(["strace", "-f", "-qq", "-e", "trace=" + WRITE_CALLS] + options + [self.kiln] + args,
                              cwd=cwd, env=env, capture_output=True)

    def write_calls(self, args, cwd):
        """Runs `kiln args` to completion under strace; returns its fsync, rename and unlink
        calls on the files under test in order as (name, how many of that name so far). The
        count takes in the process's other calls of that name (the sanitizer build's OpenMP
        runtime unlinks its registration in /dev/shm), as strace's `inject=...:when=` does."""
        log = os.path.join(self.work, "strace.log")
        self._strace(args, cwd, ["-y", "-o", log])
        work = os.path.realpath(self.work)
        calls, counts = [], {}
        for line in open(log):
            m = re.match(r"\d+\s+(\w+)\((.*)", line)
            if m:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
                # Its paths (relative ones from the command's cwd) and, with -y, the files
                # behind its descriptors.
                paths = [os.path.join(os.path.realpath(cwd), p) for p in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))]
                paths += re.findall(r"\d<([^>]*)>", m.group(2))
                if any(p == work or p.startswith(work + "/") for p in paths):
                    calls.append((m.group(1), counts[m.group(1)]))
        return calls

    def kill_at_call(self, args, cwd, call):
        """Runs `kiln args` under strace, SIGKILLed as it enters `call` (name, n: the n-th call
        of that name), which never runs; True when the run was killed."""
        name, n = call
        return self._strace(args, cwd, ["-o", os.devnull, "-e", f"inject={name}:signal=SIGKILL:when={n}"]).returncode != 0

    # ---- kiln export -------------------------------------------------------------------------

    def export_kills(self, rng, kills, versions, sidecars):
        """Kills exports of the other version onto m/m.kiln; returns {phase: count}."""
        folder = os.path.join(self.work, "m")
        check = self.checks.check
        self.ok(["export", "a.onnx", "-o", "m/m.kiln", "--sidecar-threshold", "0"])
        scratch = os.path.join(self.work, "timing")
        os.makedirs(scratch)
        timing = self.timing(["export", os.path.join(self.work, "b.onnx"), "-o", "t.kiln", "--sidecar-threshold", "0"],
                             scratch, scratch)
        phases = {p: 0 for p in PHASES}
        outcome = {"old": 0, "new": 0}
        current = "a"
        for i in range(kills):
            target = "b" if current == "a" else "a"
            plan = kill_plan(rng, i, timing)
            before = snapshot(folder)
            self.kill(["export", target + ".onnx", "-o", "m/m.kiln", "--sidecar-threshold", "0"], self.work, folder, plan)
            result = self.check_model(f"export_kill_{i} ({describe(plan)})", current, target, before, versions,
                                      sidecars)
            if result:
                phases[result[0]] += 1
                outcome["old" if result[1] == current else "new"] += 1
                current = result[1]
        print(f"kill_writes: export killed {kills} times at random ({describe_timing(timing)}): "
              f"{outcome['old']} left the old model, {outcome['new']} the new one; by phase: "
              + ", ".join(f"{phases[p]} {p}" for p in PHASES))
        # The next complete write removes what the killed writers left behind.
        left = sorted(n for n in os.listdir(folder) if n != "m.kiln" and n != sidecars[current])
        self.ok(["export", "a.onnx", "-o", "m/m.kiln", "--sidecar-threshold", "0"])
        check("export_cleans_up", sorted(os.listdir(folder)) == ["m.kiln", sidecars["a"]],
              f"files left: {sorted(os.listdir(folder))}")
        check("export_after_kills", self.outputs("m/m.kiln", os.path.join(self.work, "check")) == versions["a"],
              "wrong outputs")
        print(f"kill_writes: the killed exports left {len(left)} files (temporaries, orphaned sidecars), "
              "all removed by the next export")
        return phases

    def export_precise_kills(self, versions, sidecars):
        """Kills an export of b over a right before each of its fsync, rename and unlink calls."""
        folder = os.path.join(self.work, "m")
        check = self.checks.check
        export_b = ["export", "b.onnx", "-o", "m/m.kiln", "--sidecar-threshold", "0"]
        self.ok(["export", "a.onnx", "-o", "m/m.kiln", "--sidecar-threshold", "0"])
        calls = self.write_calls(export_b, self.work)
        phases = {p: 0 for p in PHASES}
        for i, call in enumerate(calls):
            self.ok(["export", "a.onnx", "-o", "m/m.kiln", "--sidecar-threshold", "0"])
            check(f"export_call_{i}_clean_start", sorted(os.listdir(folder)) == ["m.kiln", sidecars["a"]],
                  f"files left by the previous kill after an export: {sorted(os.listdir(folder))}")
            before = snapshot(folder)
            name = f"export_call_{i}_{call[0]}_{call[1]}"
            if not check(name + "_killed", self.kill_at_call(export_b, self.work, call), "the export was not killed"):
                continue
            result = self.check_model(name, "a", "b", before, versions, sidecars)
            if result:
                phases[result[0]] += 1
        print(f"kill_writes: export killed right before each of its {len(calls)} fsync, rename and unlink calls ("
              + " ".join(c[0] for c in calls) + "): " + ", ".join(f"{phases[p]} {p}" for p in PHASES))
        check("export_precise_kills_reach_between", phases["writing"] and phases["between"],
              f"phases seen: {phases}")

    def check_model(self, name, current, target, before, versions, sidecars):
        """Checks m/m.kiln after a kill: it loads, its provenance says which version the model
        file is, and it names that version's sidecar, which exists and gives that version's
        outputs (the same graph with the other version's weights would give the other's).
        Returns (phase, version) or None after a failure."""
        folder = os.path.join(self.work, "m")
        check = self.checks.check
        p = self.run(["inspect", "m/m.kiln", "--json"])
        if not check(name + "_inspect", p.returncode == 0, p.stderr.decode(errors="replace").strip()):
            return None
        source = json.loads(p.stdout)["provenance"][-1]["input_file"]
        version = {current + ".onnx": current, target + ".onnx": target}.get(source)
        if not check(name + "_model", version is not None, f"the model was exported from {source}"):
            return None
        refs = [r.decode() for r in SIDECAR_REF.findall(open(os.path.join(folder, "m.kiln"), "rb").read())]
        if not check(name + "_sidecar", refs == [sidecars[version]] and os.path.isfile(os.path.join(folder, refs[0])),
                     f"the {version} model names {refs}; the folder holds {sorted(os.listdir(folder))}"):
            return None
        got = self.outputs("m/m.kiln", os.path.join(self.work, "check"))
        if not check(name + "_outputs", got == versions[version],
                     got if isinstance(got, str) else f"the {version} model does not give its own outputs"):
            return None
        after = snapshot(folder)
        if version == target:
            phase = "after"
        elif sidecars[target] in appeared(before, after, hidden=False):
            phase = "between"
        elif appeared(before, after, hidden=True):
            phase = "writing"
        else:
            phase = "before"
        return phase, version

    # ---- kiln run --output-dir -----------------------------------------------------------------

    def run_args(self, version):
        return ["run", version + ".kiln", "--inputs", INPUTS, "--output-dir", "out"]

    def check_outputs(self, name, before, versions):
        """Checks out/ after a kill: every output loads and is the old or the new one. Returns
        (phase, "a" | "b" | "mixed") or None after a failure."""
        d = os.path.join(self.work, "out")
        files = sorted(f for f in os.listdir(d) if not f.startswith("."))
        if not self.checks.check(name + "_files", files == sorted(versions["a"]), f"outputs present: {files}"):
            return None
        seen = set()
        for f in files:
            data = open(os.path.join(d, f), "rb").read()
            try:
                np.load(os.path.join(d, f))
                loads = True
            except Exception as e:  # noqa: BLE001 - any failure to parse is the finding
                loads = str(e)
            if not self.checks.check(f"{name}_{f}", loads is True and data in (versions["a"][f], versions["b"][f]),
                                     f"{f} does not load ({loads})" if loads is not True else f"{f} is neither version"):
                return None
            seen.add("a" if data == versions["a"][f] else "b")
        after = snapshot(d)
        replaced = appeared(before, after, hidden=False)
        phase = "after" if replaced else "writing" if appeared(before, after, hidden=True) else "before"
        return phase, seen.pop() if len(seen) == 1 else "mixed"

    def run_kills(self, rng, kills, versions):
        """Kills `kiln run` of the other version writing over out/; returns {phase: count}."""
        d = os.path.join(self.work, "out")
        check = self.checks.check
        shutil.rmtree(d, ignore_errors=True)
        self.ok(self.run_args("a"))
        timing = self.timing(self.run_args("a"), self.work, d)
        phases = {p: 0 for p in PHASES}
        outcome = {"old": 0, "new": 0, "mixed": 0}
        current = "a"
        for i in range(kills):
            target = "b" if current == "a" else "a"
            plan = kill_plan(rng, i, timing)
            before = snapshot(d)
            self.kill(self.run_args(target), self.work, d, plan)
            result = self.check_outputs(f"run_kill_{i} ({describe(plan)})", before, versions)
            if result:
                phases[result[0]] += 1
                outcome["old" if result[1] == current else "new" if result[1] == target else "mixed"] += 1
                if result[1] == target:
                    current = target
        print(f"kill_writes: run killed {kills} times at random ({describe_timing(timing)}): "
              f"{outcome['old']} left the old outputs, {outcome['new']} the new ones, {outcome['mixed']} some of each; "
              "by phase: " + ", ".join(f"{phases[p]} {p}" for p in ("before", "writing", "after")))
        left = [f for f in os.listdir(d) if f.startswith(".")]
        self.ok(self.run_args("a"))
        leftovers = [f for f in os.listdir(d) if f.startswith(".")]
        check("run_cleans_up", not leftovers, f"temporaries left: {leftovers}")
        print(f"kill_writes: the killed runs left {len(left)} temporaries, all removed by the next run")
        return phases

    def run_precise_kills(self, versions):
        """Kills a run of b over a's outputs right before each of its fsync, rename and unlink calls."""
        d = os.path.join(self.work, "out")
        check = self.checks.check
        self.ok(self.run_args("a"))
        calls = self.write_calls(self.run_args("b"), self.work)
        phases = {p: 0 for p in PHASES}
        for i, call in enumerate(calls):
            self.ok(self.run_args("a"))
            check(f"run_call_{i}_clean_start", not [f for f in os.listdir(d) if f.startswith(".")],
                  f"temporaries left by the previous kill after a run: {os.listdir(d)}")
            before = snapshot(d)
            name = f"run_call_{i}_{call[0]}_{call[1]}"
            if not check(name + "_killed", self.kill_at_call(self.run_args("b"), self.work, call), "the run was not killed"):
                continue
            result = self.check_outputs(name, before, versions)
            if result:
                phases[result[0]] += 1
        print(f"kill_writes: run killed right before each of its {len(calls)} fsync, rename and unlink calls ("
              + " ".join(c[0] for c in calls) + "): " + ", ".join(f"{phases[p]} {p}" for p in ("before", "writing", "after")))
        check("run_precise_kills_cover_writing", phases["writing"], f"phases seen: {phases}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--kills", type=int, default=60, help="random kills of each command (default 60)")
    ap.add_argument("--seed", type=int, default=int(time.time() * 1000) % 1000000)
    args = ap.parse_args()
    k = os.path.abspath(args.kiln)
    rng = random.Random(args.seed)
    print(f"kill_writes: seed {args.seed} (repeat with --seed {args.seed})")
    work = tempfile.mkdtemp(prefix="kiln-kill-")
    checks = Checks()
    started = time.monotonic()
    try:
        t = Tester(k, work, checks)
        # Two versions of the sample CNN: same graph and names, other weights, other outputs.
        shutil.copy(os.path.join(SAMPLES, "cnn.onnx"), os.path.join(work, "a.onnx"))
        make_other_cnn(os.path.join(SAMPLES, "cnn.onnx"), os.path.join(work, "b.onnx"), seed=20261124)
        os.makedirs(os.path.join(work, "m"))
        versions, sidecars = {}, {}
        for v in ("a", "b"):
            # Each version's sidecar name for m.kiln, from an export to a folder of its own.
            os.makedirs(os.path.join(work, "ref_" + v))
            t.ok(["export", v + ".onnx", "-o", f"ref_{v}/m.kiln", "--sidecar-threshold", "0"])
            names = [n for n in os.listdir(os.path.join(work, "ref_" + v)) if SIDECAR.match(n)]
            checks.check(f"sidecar_{v}", len(names) == 1, f"sidecars: {names}")
            sidecars[v] = names[0] if names else ""
            t.ok(["export", v + ".onnx", "-o", v + ".kiln"])
            versions[v] = t.outputs(v + ".kiln", os.path.join(work, "ref_" + v, "out"))
        checks.check("versions_differ", versions["a"] != versions["b"] and sidecars["a"] != sidecars["b"],
                     "the two models give the same outputs or sidecar names")

        t.export_kills(rng, args.kills, versions, sidecars)
        t.run_kills(rng, args.kills, versions)
        if t.strace:
            t.export_precise_kills(versions, sidecars)
            t.run_precise_kills(versions)
        else:
            print("kill_writes: strace cannot trace here: the kills before each write call are skipped")
    except Exception as e:  # noqa: BLE001 - a crash of the harness is a failure, with its reason
        checks.check("harness", False, f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        sweep_openmp_registrations()
    print(f"kill_writes: {time.monotonic() - started:.1f} s")
    return checks.report()


if __name__ == "__main__":
    sys.exit(main())
