import os
import sys

import torch

# Test helpers (paged_harness, ...) import as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))

# Without a GPU the Triton kernels run under Triton's interpreter. Triton reads this variable once,
# when it is first imported, and any module that imports s4kv.kernels imports it: set it before
# any test module is collected (a module collected before the kernel tests, without it, made every
# interpreted kernel fail with "Cannot call @triton.jit'd outside of the scope of a kernel").
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_terminal_summary(terminalreporter):
    """The numbers the end-to-end tests measured (tests/e2e_harness.py), pass or fail."""
    e2e = sys.modules.get("e2e_harness")
    if e2e is not None and e2e.REPORT:
        terminalreporter.write_sep("=", "int4_kivi end to end: measured")
        for line in e2e.REPORT:
            terminalreporter.write_line(line)
