"""Counting named checks for the script-driven tests, and their closing line."""


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

    def report(self):
        """Prints each failure and the closing `N passed, M failed` line; returns the exit code."""
        for f in self.failed:
            print("FAILED " + f)
        print(f"{self.passed} passed, {len(self.failed)} failed")
        return 1 if self.failed else 0
