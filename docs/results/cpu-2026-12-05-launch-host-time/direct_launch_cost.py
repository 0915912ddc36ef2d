"""Host cost of a Triton launch through JITFunction.run against the compiled kernel's own launcher
(the warm path's last call), on a machine without a GPU: the toy kernels of toy_launch_cost.py,
compiled for sm90 through tools/kernel_static.py's compile-only driver, launcher a no-op.

    PYTHONPATH=. python docs/results/cpu-2026-12-05-launch-host-time/direct_launch_cost.py
"""
import importlib.util
import sys
import tempfile
import timeit

import torch
import triton

sys.path.insert(0, "tools")
from kernel_static import CompileOnlyDriver  # noqa: E402
from triton import knobs  # noqa: E402
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


t = torch.zeros(64)
print(f"Triton {triton.__version__}; µs per launch (best of 5 x 2,000)")
print("pointers ints constexprs  JITFunction.run  compiled.run  stream query + compiled.run")
for n_ptr, n_int, n_const in [(12, 8, 0), (12, 8, 8), (12, 8, 20)]:
    k = make(n_ptr, n_int, n_const)
    args = [t] * n_ptr + [17 + 16 * i for i in range(n_int)]
    kw = {f"C{i}": 128 for i in range(n_const)}
    ck = k[(1,)](*args, **kw)  # compiles; returns the CompiledKernel
    jit = min(timeit.repeat(lambda: k[(4, 8)](*args, **kw), number=2000, repeat=5)) / 2000
    dev = driver.active.get_current_device()
    stream = driver.active.get_current_stream(dev)

    def direct():
        ck.run(4, 8, 1, stream, ck.function, ck.packed_metadata, None, None, None, *args)

    def direct_stream():
        s = driver.active.get_current_stream(driver.active.get_current_device())
        ck.run(4, 8, 1, s, ck.function, ck.packed_metadata, None, None, None, *args)
    d = min(timeit.repeat(direct, number=2000, repeat=5)) / 2000
    ds = min(timeit.repeat(direct_stream, number=2000, repeat=5)) / 2000
    print(f"{n_ptr:8d} {n_int:4d} {n_const:10d}  {jit * 1e6:15.2f}  {d * 1e6:12.2f}  {ds * 1e6:12.2f}")
