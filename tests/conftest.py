import os
import sys

# Test helpers (paged_harness, ...) import as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_terminal_summary(terminalreporter):
    """The numbers the end-to-end tests measured (tests/e2e_harness.py), pass or fail."""
    e2e = sys.modules.get("e2e_harness")
    if e2e is not None and e2e.REPORT:
        terminalreporter.write_sep("=", "int4_kivi end to end: measured")
        for line in e2e.REPORT:
            terminalreporter.write_line(line)
