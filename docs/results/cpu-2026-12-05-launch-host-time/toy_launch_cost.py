"""Host cost of one Triton launch by argument kind, on a machine without a GPU: a trivial kernel
with N pointer, M int and C constexpr arguments, compiled for sm90 through tools/kernel_static.py's
compile-only driver (given a module handle, so launches take Triton's warm path), launcher a no-op.

    PYTHONPATH=. python docs/results/cpu-2026-12-05-launch-host-time/toy_launch_cost.py
"""
import importlib.util
import sys
import tempfile
import timeit

import torch
import triton

sys.path.insert(0, "tools")
from kernel_static import CompileOnlyDriver  # noqa: E402
from triton.runtime import driver  # noqa: E402

drv = CompileOnlyDriver(90)
drv.utils.load_binary = lambda name, cubin, shared, device: (1, 1, 64, 0, 1024)
drv.utils.unload_module = lambda module: None
driver.set_active(drv)


def make(n_ptr, n_int, n_const):
    params = [f"p{i}" for i in range(n_ptr)] + [f"i{i}" for i in range(n_int)] + [f"C{i}: tl.constexpr" for i in range(n_const)]
    src = ("import triton\nimport triton.language as tl\n\n@triton.jit\n"
           f"def k({', '.join(params)}):\n    x = tl.load(p0 + tl.arange(0, 16))\n"
           f"    tl.store(p0 + tl.arange(0, 16), x + {'i0' if n_int else '1'})\n")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"toy_{n_ptr}_{n_int}_{n_const}", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.k


def toy_args(n_ptr, n_int, n_const):
    """(positional arguments, constexpr keywords) of a toy kernel's launch."""
    t = torch.zeros(64)
    return [t] * n_ptr + [17 + 16 * i for i in range(n_int)], {f"C{i}": 128 for i in range(n_const)}


if __name__ == "__main__":
    print(f"Triton {triton.__version__}")
    for n_ptr, n_int, n_const in [(1, 0, 0), (1, 0, 20), (12, 0, 0), (12, 8, 0), (12, 8, 20), (12, 8, 30)]:
        k = make(n_ptr, n_int, n_const)
        args, kw = toy_args(n_ptr, n_int, n_const)
        k[(1,)](*args, **kw)  # compiles
        dt = min(timeit.repeat(lambda: k[(4, 8)](*args, **kw), number=2000, repeat=5)) / 2000
        print(f"pointers {n_ptr:2d}  ints {n_int:2d}  constexprs {n_const:2d}: {dt * 1e6:6.2f} µs per launch")
