"""Counting named checks for the script-driven tests, and their closing line."""
import shutil
import tempfile


class Checks:
    """Named pass/fail checks: a failure keeps its name and a detail for the report."""

    def __init__(self):
        self.passed, self.failed = 0, []

    def check(self, name, cond, detail=""):
        if cond:
            self.passed += 1
        else:
            self.failed.append(f"{name}: {detail}")
        return cond

    def check_timed(self, name, attempt, tries=3):
        """A check on timings: attempt() returns (cond, detail) and is tried again, up to `tries`
        times, while it fails, since a shared machine's load can swing one measurement by 2x. Each
        attempt measures afresh, its baseline included."""
        detail = ""
        for i in range(tries):
            cond, detail = attempt()
            if cond:
                break
        return self.check(name, cond, f"{detail} (after {i + 1} tries)" if not cond else "")

    def report(self):
        """Prints each failure and the closing `N passed, M failed` line; returns the exit code."""
        for f in self.failed:
            print("FAILED " + f)
        print(f"{self.passed} passed, {len(self.failed)} failed")
        return 1 if self.failed else 0


def run_in_temp_dir(prefix, make_checks, body):
    """Runs body(checks, work) in a fresh temporary folder (removed after), where `checks` is
    make_checks(work); prints the report and returns the exit code."""
    work = tempfile.mkdtemp(prefix=prefix)
    checks = make_checks(work)
    try:
        body(checks, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return checks.report()
