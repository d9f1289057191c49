#!/usr/bin/env python3
"""`kiln tune` end to end: show (table and --json), merge (deterministic, idempotent, the fastest
winner per problem and machine, the output may be an input, - for stdout), prune (drops the
records of other versions, rewrites atomically, leaves the file alone when nothing goes), and the
user-error paths: a corrupt or future-version line is one line on stderr naming the file and the
line number, exit 2, and no output is left behind. Then `kiln compile --mode max-autotune` on the
transformer sample: the report (stderr and --tune-report JSON), the records it adds, a warm
compile that times nothing and chooses the same kernels, a default compile reading the database
only when named, --dry-run (the problems a search would time, its time bounded, nothing written),
--require-db (the database replayed; a problem it lacks for this machine, for
each reason, a failed check naming the node), and the flags' user errors."""
import argparse
import json
import os
import re
import subprocess
import sys

from checks import Checks, run_in_temp_dir

ONE_LINE = re.compile(r"^kiln (tune|compile): error: .+$")
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "samples")

MACHINE_A = {"model_name": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel", "family": 6, "model": 143,
             "stepping": 8, "features": ["avx2", "fma", "avx512f", "avx512bw", "avx512vl"], "physical_cores": 56,
             "l1d_bytes": 49152, "l2_bytes": 2097152, "l3_bytes": 110100480}
MACHINE_B = {"model_name": "AMD EPYC 9654 96-Core Processor", "vendor": "AuthenticAMD", "family": 25, "model": 17,
             "stepping": 1, "features": ["avx2", "fma"], "physical_cores": 96, "l1d_bytes": 32768,
             "l2_bytes": 1048576, "l3_bytes": 33554432}


def record(m, machine, time_us, versions, runner_up=None):
    """One database line (a dict) for a MatMul of M rows."""
    cands = []
    if runner_up is not None:
        cands.append({"kernel": "onednn.matmul", "params": {}, "time_us": runner_up})
    return {"format_version": 1,
            "problem": {"op": "MatMul", "inputs": [{"shape": [m, 256], "dtype": "f32"}, {"shape": [256, 512], "dtype": "f32"}],
                        "layout": "b_packed", "epilogue": "bias+relu", "threads": 2},
            "machine": machine, "versions": versions,
            "winner": {"kernel": "kiln.gemm_f32_avx512", "params": {"mr": 6, "nr": 64, "kc": 256, "isa": "avx512"},
                       "time_us": time_us},
            "candidates": cands}


class Runner(Checks):
    def __init__(self, kiln, work):
        super().__init__()
        self.kiln, self.work = kiln, work
        self.env = dict(os.environ, XDG_CACHE_HOME=os.path.join(work, "cache"))

    def run(self, args):
        p = subprocess.run([self.kiln] + args, capture_output=True, cwd=self.work, env=self.env)
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def error(self, name, args, code, pattern):
        rc, out, err = self.run(args)
        lines = [l for l in err.splitlines() if l.strip()]
        good = rc == code and len(lines) == 1 and ONE_LINE.match(lines[0]) and re.search(pattern, lines[0])
        self.check(name, good, f"exit {rc} (want {code}); stderr: {err.strip()[:400]!r}; want /{pattern}/")
        return out

    def path(self, name):
        return os.path.join(self.work, name)

    def write(self, name, lines):
        with open(self.path(name), "w") as f:
            for l in lines:
                f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()

    def leftovers(self):
        """Temporary files an interrupted or failed write left in the work folder."""
        return [n for n in os.listdir(self.work) if ".tmp." in n]


def body(r, work):
    rc, out, err = r.run(["tune", "--help"])
    r.check("help", rc == 0 and all(w in out for w in ("show", "merge", "prune")) and "tuning.jsonl" in out,
            f"exit {rc}: {out[:300]!r}")
    # The current versions, from show --json of an empty database.
    r.write("empty.jsonl", [])
    rc, out, err = r.run(["tune", "show", "empty.jsonl", "--json"])
    try:
        now = json.loads(out)["versions"]
        good = rc == 0 and now["kernel_templates"] == 5 and re.fullmatch(r"\d+\.\d+\.\d+", now["onednn"])
    except (ValueError, KeyError) as e:
        now, good, err = {"kernel_templates": 5, "onednn": "0.0.0"}, False, str(e)
    r.check("show_empty_json", good, f"exit {rc}; {out[:300]!r} {err[:300]!r}")
    old = {"kernel_templates": now["kernel_templates"], "onednn": "0.1.0"}

    # Two machines' databases with one problem in common, written out of canonical order.
    a = [record(64, MACHINE_A, 30.0, now, 33.0), record(1, MACHINE_A, 5.0, now, 5.5), record(64, MACHINE_A, 40.0, old)]
    b = [record(64, MACHINE_A, 25.0, now, 26.0), record(64, MACHINE_B, 50.0, now), record(8, MACHINE_B, 7.25, now, 9.0)]
    r.write("a.jsonl", a)
    r.write("b.jsonl", b)

    # show: the table.
    rc, out, err = r.run(["tune", "show", "a.jsonl"])
    lines = out.splitlines()
    r.check("show_table", rc == 0 and len(lines) == 5 and lines[0].split() ==
            ["problem", "machine", "winner", "time", "us", "runner-up", "versions"]
            and lines[-1].startswith("3 records in a.jsonl"), f"exit {rc}: {out!r} {err!r}")
    rows = lines[1:4]
    r.check("show_table_order", rc == 0 and "MatMul(1x256 f32" in rows[0] and "MatMul(64x256" in rows[1], repr(rows))
    r.check("show_table_cells", rc == 0 and any("30.00" in l and "+10.0%" in l and "current" in l for l in rows)
            and any("5.00" in l and "+10.0%" in l for l in rows)
            and any("40.00" in l and "stale (kernels " + str(now["kernel_templates"]) + ", oneDNN 0.1.0)" in l and " - " in l for l in rows)
            and all("Intel(R) Xeon(R) Platinum 8480+ [" in l and "kiln.gemm_f32_avx512 isa=avx512 kc=256 mr=6 nr=64" in l
                    for l in rows), repr(rows))

    # A runner-up that timed faster than the winner (a default the search kept: its choice was not
    # faster end to end) shows a negative margin.
    r.write("kept.jsonl", [record(8, MACHINE_A, 10.0, now, 9.5)])
    rc, out, err = r.run(["tune", "show", "kept.jsonl"])
    r.check("show_negative_margin", rc == 0 and any("10.00" in l and " -5.0% " in l for l in out.splitlines()) and "+-" not in out,
            f"exit {rc}: {out!r} {err!r}")

    # show --json: the lines as stored, plus what show adds.
    rc, out, err = r.run(["tune", "show", "a.jsonl", "--json"])
    try:
        doc = json.loads(out)
        recs = doc["records"]
        good = (rc == 0 and doc["file"] == "a.jsonl" and len(recs) == 3
                # Canonical order: by problem, then machine, then versions (0.1.0 before this one's).
                and [x["winner"]["time_us"] for x in recs] == [5.0, 40.0, 30.0]
                and [x["current_versions"] for x in recs] == [True, False, True]
                and abs(recs[2]["runner_up_margin"] - 0.1) < 1e-9 and recs[1]["runner_up_margin"] is None
                and all(re.fullmatch(r"[0-9a-f]{12}", x["machine_id"]) and x["this_machine"] is False for x in recs)
                and recs[0]["format_version"] == 1 and recs[0]["machine"] == MACHINE_A)
    except (ValueError, KeyError, TypeError) as e:
        good, err = False, str(e)
    r.check("show_json", good, f"exit {rc}; {out[:400]!r} {err[:300]!r}")

    # merge: the same bytes in either order, idempotent, the fastest per problem and machine.
    rc1, _, err1 = r.run(["tune", "merge", "a.jsonl", "b.jsonl", "-o", "ab.jsonl"])
    rc2, _, err2 = r.run(["tune", "merge", "b.jsonl", "a.jsonl", "-o", "ba.jsonl"])
    r.check("merge_runs", rc1 == 0 and rc2 == 0 and "merged 6 records from 2 files into 5 in ab.jsonl" in err1,
            f"exits {rc1} {rc2}: {err1!r} {err2!r}")
    ab = r.read("ab.jsonl") if rc1 == 0 else b""
    r.check("merge_deterministic", rc1 == 0 and ab == r.read("ba.jsonl"), "merge(A, B) != merge(B, A)")
    merged = [json.loads(l) for l in ab.decode().splitlines()]
    times = sorted((x["problem"]["inputs"][0]["shape"][0], x["machine"]["vendor"], x["versions"]["onednn"], x["winner"]["time_us"])
                   for x in merged)
    r.check("merge_fastest_wins", times == sorted([(1, "GenuineIntel", now["onednn"], 5.0), (64, "GenuineIntel", now["onednn"], 25.0),
                                                   (64, "GenuineIntel", "0.1.0", 40.0), (64, "AuthenticAMD", now["onednn"], 50.0),
                                                   (8, "AuthenticAMD", now["onednn"], 7.25)]), repr(times))
    rc, _, err = r.run(["tune", "merge", "ab.jsonl", "b.jsonl", "-o", "abb.jsonl"])
    r.check("merge_idempotent_b", rc == 0 and r.read("abb.jsonl") == ab, f"exit {rc}: {err!r}")
    rc, _, err = r.run(["tune", "merge", "ab.jsonl", "ab.jsonl", "-o", "abab.jsonl"])
    r.check("merge_idempotent_self", rc == 0 and r.read("abab.jsonl") == ab, f"exit {rc}: {err!r}")
    rc, out, err = r.run(["tune", "merge", "b.jsonl", "a.jsonl", "-o", "-"])
    r.check("merge_stdout", rc == 0 and out.encode() == ab, f"exit {rc}: {err!r}")
    r.write("c.jsonl", b)
    rc, _, err = r.run(["tune", "merge", "c.jsonl", "a.jsonl", "-o", "c.jsonl"])
    r.check("merge_into_an_input", rc == 0 and r.read("c.jsonl") == ab, f"exit {rc}: {err!r}")
    # Lines are canonical: a hand-written line comes out with sorted params.
    r.check("merge_canonical_params", b'"params":{"isa":"avx512","kc":256,"mr":6,"nr":64}' in ab, ab[:300])

    # prune: drops the stale record, says how many, then leaves the file alone.
    r.write("p.jsonl", a)
    rc, out, err = r.run(["tune", "prune", "p.jsonl"])
    kept = [json.loads(l) for l in r.read("p.jsonl").decode().splitlines()]
    r.check("prune", rc == 0 and "dropped 1 record" in out and "kept 2 in p.jsonl" in out and len(kept) == 2
            and all(x["versions"] == now for x in kept) and not r.leftovers(), f"exit {rc}: {out!r} {err!r} {kept}")
    before = (r.read("p.jsonl"), os.stat(r.path("p.jsonl")).st_mtime_ns)
    rc, out, err = r.run(["tune", "prune", "p.jsonl"])
    r.check("prune_nothing", rc == 0 and "dropped 0 records" in out
            and (r.read("p.jsonl"), os.stat(r.path("p.jsonl")).st_mtime_ns) == before, f"exit {rc}: {out!r} {err!r}")

    # User errors: one line naming the file and line, exit 2, nothing written.
    good = json.dumps(a[0])
    r.write("corrupt.jsonl", [good, json.dumps(b[1]), '{"format_version": 1, "problem": ', good])
    r.error("show_corrupt", ["tune", "show", "corrupt.jsonl"], 2, r"^kiln tune: error: corrupt\.jsonl: line 3: is not valid JSON")
    r.write("future.jsonl", [good, dict(a[1], format_version=2)])
    r.error("show_future", ["tune", "show", "future.jsonl", "--json"], 2,
            r"^kiln tune: error: future\.jsonl: line 2: format version 2 is newer than this kiln reads \(1\)")
    r.write("array.jsonl", ["", "[1, 2]"])
    r.error("show_not_object", ["tune", "show", "array.jsonl"], 2, r"array\.jsonl: line 2: is not a JSON object$")
    bad_field = json.loads(good)
    bad_field["winner"]["time_us"] = "fast"
    r.write("field.jsonl", [good, good, good, bad_field])
    r.error("show_bad_field", ["tune", "show", "field.jsonl"], 2, r"field\.jsonl: line 4: field 'winner\.time_us' is not a number$")
    out = r.error("merge_corrupt", ["tune", "merge", "a.jsonl", "corrupt.jsonl", "-o", "out.jsonl"], 2, r"corrupt\.jsonl: line 3: ")
    r.check("merge_corrupt_no_output", not os.path.exists(r.path("out.jsonl")) and not r.leftovers() and out == "",
            f"{os.listdir(work)}")
    ab_before = r.read("ab.jsonl")
    r.error("merge_corrupt_keeps_old", ["tune", "merge", "corrupt.jsonl", "-o", "ab.jsonl"], 2, r"corrupt\.jsonl: line 3")
    r.check("merge_corrupt_old_intact", r.read("ab.jsonl") == ab_before and not r.leftovers(), "ab.jsonl changed")
    corrupt_before = r.read("corrupt.jsonl")
    r.error("prune_corrupt", ["tune", "prune", "corrupt.jsonl"], 2, r"corrupt\.jsonl: line 3: is not valid JSON")
    r.check("prune_corrupt_intact", r.read("corrupt.jsonl") == corrupt_before and not r.leftovers(), "corrupt.jsonl changed")
    r.error("show_missing", ["tune", "show", "nosuch.jsonl"], 2, r"nosuch\.jsonl: no such file$")
    r.error("prune_missing", ["tune", "prune", "nosuch.jsonl"], 2, r"nosuch\.jsonl: no such file$")
    r.error("show_folder", ["tune", "show", "."], 2, r"is a directory")
    r.error("merge_unwritable", ["tune", "merge", "a.jsonl", "-o", "a.jsonl/x/out.jsonl"], 2, r"a\.jsonl")
    r.error("merge_no_output", ["tune", "merge", "a.jsonl"], 2, r"--output")
    r.error("no_subcommand", ["tune"], 2, r"subcommand")
    autotune(r)


def kernels(r, model):
    """Each node's kernel choice, from kiln inspect --text."""
    rc, out, err = r.run(["inspect", model, "--text"])
    return [l.split(" kernel=", 1)[1] for l in out.splitlines() if l.strip().startswith("node ") and " kernel=" in l]


def autotune(r):
    rc, _, err = r.run(["export", os.path.join(SAMPLES, "transformer.onnx"), "-o", "t.kiln"])
    r.check("autotune_export", rc == 0, err)
    shapes = ["--input-shape", "input=1x16x32"]
    rc, out, err = r.run(["inspect", "t.kiln", "--json"])
    try:
        name = json.loads(out)["inputs"][0]["name"]
        shapes = ["--input-shape", f"{name}=" + "x".join(str(d if isinstance(d, int) else 1) for d in json.loads(out)["inputs"][0]["shape"])]
    except (ValueError, KeyError, IndexError) as e:
        r.check("autotune_inspect", False, f"{e}: {out[:300]!r}")
    cold = ["compile", "t.kiln", "-o", "t.tuned.kiln", "--mode", "max-autotune", "--tuning-db", "at.jsonl",
            "--tune-budget", "60s", "--tune-report", "report.json", "--threads", "1"] + shapes
    rc, out, err = r.run(cold)
    r.check("autotune_cold", rc == 0 and "search:" in err and re.search(r"database at\.jsonl: 0 of [0-9]+ problems? found, [1-9][0-9]* added", err), f"exit {rc}: {err[-800:]!r}")
    try:
        rep = json.load(open(r.path("report.json")))
        probs = rep["problems"]
        good = (rep["searched"] and rep["rounds"] > 0 and not rep["budget_exhausted"] and len(probs) > 0
                and all(p["source"] in ("tuned", "default") and p["default_us"] > 0 and p["best_us"] > 0 for p in probs)
                and any(p["op"] in ("MatMul", "FusedMatMul", "Gemm") for p in probs)
                and all(p["chosen_us"] < p["default_us"] for p in probs if p["source"] == "tuned")
                and rep["database"]["added"] == len(probs))
    except (OSError, ValueError, KeyError, TypeError) as e:
        good, probs = False, str(e)
    r.check("autotune_report_json", good, repr(probs)[:800])
    db = r.read("at.jsonl") if os.path.exists(r.path("at.jsonl")) else b""
    lines = [json.loads(l) for l in db.decode().splitlines()]
    r.check("autotune_records", len(lines) > 0 and all(x["winner"]["time_us"] > 0 for x in lines), db[:400])
    rc, out, _ = r.run(["tune", "show", "at.jsonl", "--json"])
    r.check("autotune_records_this_machine", rc == 0 and all(x["this_machine"] and x["current_versions"] for x in json.loads(out)["records"]),
            out[:400])
    tuned = kernels(r, "t.tuned.kiln")
    rc, out, err = r.run(["run", "t.tuned.kiln"] + shapes)
    r.check("autotune_runs", rc == 0, f"exit {rc}: {err[-400:]!r}")

    # Warm: every problem from the database, nothing timed, the same kernels, the file untouched.
    warm = ["compile", "t.kiln", "-o", "t.warm.kiln", "--mode", "max-autotune", "--tuning-db", "at.jsonl",
            "--tune-report", "warm.json", "--threads", "1"] + shapes
    rc, out, err = r.run(warm)
    try:
        rep = json.load(open(r.path("warm.json")))
        good = rc == 0 and not rep["searched"] and rep["graph_runs"] == 0 and rep["database"]["used"] == len(lines) \
            and all(p["source"] == "database" for p in rep["problems"])
    except (OSError, ValueError, KeyError) as e:
        good, err = False, f"{e} {err}"
    r.check("autotune_warm", good and f"database at.jsonl: {len(lines)} of {len(lines)} problem{'s' if len(lines) > 1 else ''} found\n" in err, f"exit {rc}: {err[-600:]!r}")
    r.check("autotune_warm_same_kernels", kernels(r, "t.warm.kiln") == tuned and len(tuned) > 0, "kernels differ")
    r.check("autotune_warm_db_untouched", r.read("at.jsonl") == db, "the database changed")
    # A default compile takes the database only when it is named.
    # It says what the database gave: every problem here; at two threads, none, and why.
    rc, _, err = r.run(["compile", "t.kiln", "-o", "t.db.kiln", "--tuning-db", "at.jsonl", "--threads", "1"] + shapes)
    n = len(lines)
    r.check("autotune_default_reads_named_db", rc == 0 and kernels(r, "t.db.kiln") == tuned
            and err == f"kiln compile: database at.jsonl: {n} of {n} problem{'s' if n > 1 else ''} found\n", f"exit {rc}: {err!r}")
    rc, _, err = r.run(["compile", "t.kiln", "-o", "t.db2.kiln", "--tuning-db", "at.jsonl", "--threads", "2"] + shapes)
    r.check("autotune_default_db_misses_said", rc == 0 and re.fullmatch(
        r"kiln compile: database at\.jsonl: 0 of [0-9]+ problems? found; the first missing, node '[^']+': it has records for 1 thread "
        r"on this machine, not 2 \(.+ t2\), keeps the default kernel\n", err), f"exit {rc}: {err!r}")
    # --require-db replays the database, timing nothing; a problem it lacks for this machine is a
    # failed check (exit 3, nothing written) that names the node, the problem and why.
    rc, _, err = r.run(["compile", "t.kiln", "-o", "t.req.kiln", "--tuning-db", "at.jsonl", "--require-db", "--threads", "1"] + shapes)
    r.check("require_db_replays", rc == 0 and kernels(r, "t.req.kiln") == tuned and r.read("at.jsonl") == db, f"exit {rc}: {err!r}")
    rc, _, err = r.run(["compile", "t.kiln", "-o", "t.req.kiln", "--mode", "max-autotune", "--tuning-db", "at.jsonl", "--require-db",
                        "--tune-report", "req.json", "--threads", "1"] + shapes)
    try:
        rep = json.load(open(r.path("req.json")))
        good = rc == 0 and not rep["searched"] and rep["graph_runs"] == 0 and kernels(r, "t.req.kiln") == tuned
    except (OSError, ValueError, KeyError) as e:
        good, err = False, f"{e} {err}"
    r.check("require_db_max_autotune_times_nothing", good, f"exit {rc}: {err[-400:]!r}")
    problems = len(lines)
    many = f"; {problems} of {problems} problems missing" if problems > 1 else ""
    r.write("foreign.jsonl", [dict(x, winner=dict(x["winner"], kernel="kiln.nosuch")) for x in lines])
    r.write("elsewhere.jsonl", [dict(x, machine=MACHINE_A) for x in lines])
    r.write("older.jsonl", [dict(x, versions=dict(x["versions"], kernel_templates=1)) for x in lines])
    r.write("empty.jsonl", [])
    for name, args, pattern in [
            ("require_db_other_threads", ["--tuning-db", "at.jsonl", "--threads", "2"],
             r"at\.jsonl: node '[^']+': not in the database for this machine: it has records for 1 thread on this machine, not 2 \(.+ t2\)" + re.escape(many) + "$"),
            ("require_db_foreign_kernel", ["--tuning-db", "foreign.jsonl", "--threads", "1"],
             r"foreign\.jsonl: node '[^']+': not in the database for this machine: its record's kernel kiln\.nosuch does not run here"),
            ("require_db_other_machine", ["--tuning-db", "elsewhere.jsonl", "--threads", "1"],
             r"it has records for other machines only \(Intel\(R\) Xeon\(R\) Platinum 8480\+, family 6 model 143, 56 cores; this one: "),
            ("require_db_other_versions", ["--tuning-db", "older.jsonl", "--threads", "1"],
             r"its record is of other kernel versions \(kernel templates 1, oneDNN [0-9.]+; this kiln: kernel templates [0-9]+, oneDNN "),
            ("require_db_empty", ["--mode", "max-autotune", "--tuning-db", "empty.jsonl", "--threads", "1"], r"empty\.jsonl: node '[^']+': .*: no record of it"),
            ("require_db_missing_file", ["--mode", "max-autotune", "--tuning-db", "nosuch.jsonl", "--threads", "1"], r"nosuch\.jsonl: no such file")]:
        code = 2 if name == "require_db_missing_file" else 3
        r.error(name, ["compile", "t.kiln", "-o", "t.err.kiln", "--require-db"] + args + shapes, code, pattern)
        r.check(name + "_no_output", not os.path.exists(r.path("t.err.kiln")) and not os.path.exists(r.path("nosuch.jsonl")),
                "an output was written")
    r.check("require_db_empty_untouched", r.read("empty.jsonl") == b"", "max-autotune --require-db wrote to the database")
    rc, _, err = r.run(["compile", "t.kiln", "-o", "t.plain.kiln", "--threads", "1"] + shapes)
    r.check("autotune_default_ignores_db", rc == 0 and not os.path.exists(r.path("cache/kiln/tuning.jsonl")), f"exit {rc}: {err!r}")
    # Without --tuning-db, max-autotune keeps its records in the user's cache folder.
    rc, _, err = r.run(["compile", "t.kiln", "-o", "t.cache.kiln", "--mode", "max-autotune", "--threads", "1"] + shapes)
    r.check("autotune_default_db_path", rc == 0 and os.path.exists(r.path("cache/kiln/tuning.jsonl")), f"exit {rc}: {err[-300:]!r}")

    # --dry-run lists what a search would time and bounds its time from one round of the
    # defaults; it searches nothing, writes no model and adds nothing to the database.
    rc, _, err = r.run(["compile", "t.kiln", "--mode", "max-autotune", "--dry-run", "--tuning-db", "dry.jsonl",
                        "--tune-report", "dry.json", "--threads", "1"] + shapes)
    try:
        rep = json.load(open(r.path("dry.json")))
        good = (rc == 0 and not rep["searched"] and rep["graph_runs"] > 0 and rep["dry_run"]["max_rounds"] > 0
                and rep["dry_run"]["estimate_s"] > 0 and len(rep["problems"]) == n
                and all(p["source"] == "to time" and p["candidates"] >= 2 for p in rep["problems"])
                and max(p["candidates"] for p in rep["problems"]) == rep["dry_run"]["max_rounds"] + 1)
    except (OSError, ValueError, KeyError) as e:
        good, err = False, f"{e} {err}"
    r.check("dry_run_lists_and_bounds", good and re.search(
        rf"dry run: {n} problems? to time, in at most [0-9]+ rounds? after the defaults' and the final comparison: at most about [0-9]+ s here, "
        r"within the 300 s budget\n", err), f"exit {rc}: {err[-600:]!r}")
    r.check("dry_run_writes_nothing", not os.path.exists(r.path("dry.jsonl")), "the database was written")
    rc, _, err = r.run(["compile", "t.kiln", "--mode", "max-autotune", "--dry-run", "--tuning-db", "at.jsonl", "--threads", "1"] + shapes)
    r.check("dry_run_from_database", rc == 0 and "dry run: 0 problems to time\n" in err and err.count("  database  ") == n
            and r.read("at.jsonl") == db, f"exit {rc}: {err[-600:]!r}")
    rc, _, err = r.run(["compile", "t.kiln", "-o", "t.dry.kiln", "--mode", "max-autotune", "--dry-run", "--tuning-db", "dry.jsonl",
                        "--tune-budget", "1ms", "--threads", "1"] + shapes)
    r.check("dry_run_past_budget", rc == 0 and re.search(r"past the 0 s budget \(--tune-budget [0-9]+s should leave no problem cut short\)", err)
            and not os.path.exists(r.path("t.dry.kiln")), f"exit {rc}: {err[-400:]!r}")

    # A symbolic input shape (the MLP sample's batch) leaves nothing to tune: compile says so,
    # not an empty table.
    rc, _, err = r.run(["export", os.path.join(SAMPLES, "mlp.onnx"), "-o", "mlp.kiln"])
    rc, out, err = r.run(["compile", "mlp.kiln", "-o", "mlp.tuned.kiln", "--mode", "max-autotune", "--tuning-db", "sym.jsonl", "--threads", "1"])
    r.check("autotune_symbolic_says_why", rc == 0 and "node  op" not in err
            and re.search(r"warning: max-autotune tuned nothing: input 'input' has shape batchx16: give --input-shape to tune kernels", err),
            f"exit {rc}: {err[-400:]!r}")
    r.error("require_db_symbolic", ["compile", "mlp.kiln", "-o", "mlp.req.kiln", "--tuning-db", "at.jsonl", "--require-db"], 2,
            r"input 'input' has shape batchx16: give --input-shape to look its kernels up in the database")

    # User errors: one line, exit 2, no output written.
    for name, args, pattern in [
            ("autotune_bad_mode", ["--mode", "fastest"], r"--mode 'fastest' is not one of default, max-autotune"),
            ("autotune_bad_budget", ["--mode", "max-autotune", "--tune-budget", "soon"], r"--tune-budget 'soon' is not a time"),
            ("autotune_report_alone", ["--tune-report", "x.json"], r"--tune-report needs --mode max-autotune or --tuning-db"),
            ("dry_run_alone", ["--dry-run"], r"--dry-run needs --mode max-autotune"),
            ("autotune_missing_db", ["--tuning-db", "nosuch.jsonl"], r"nosuch\.jsonl: no such file"),
            ("autotune_corrupt_db", ["--mode", "max-autotune", "--tuning-db", "corrupt.jsonl"], r"corrupt\.jsonl: line 3: is not valid JSON")]:
        r.error(name, ["compile", "t.kiln", "-o", "t.err.kiln"] + args + shapes, 2, pattern)
        r.check(name + "_no_output", not os.path.exists(r.path("t.err.kiln")), "an output was written")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kiln", required=True)
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    return run_in_temp_dir("kiln-tune-", lambda work: Runner(kiln, work), body)


if __name__ == "__main__":
    sys.exit(main())
