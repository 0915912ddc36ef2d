"""Host cost of a Triton launch through JITFunction.run against the compiled kernel's own launcher
(the warm path's last call), on a machine without a GPU: toy_launch_cost.py's toy kernels and
compile-only driver (sm90, launcher a no-op).

    PYTHONPATH=. python docs/results/cpu-2026-12-05-launch-host-time/direct_launch_cost.py
"""
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import triton  # noqa: E402
from toy_launch_cost import make, toy_args  # noqa: E402 - sets the compile-only driver
from triton.runtime import driver  # noqa: E402

print(f"Triton {triton.__version__}; µs per launch (best of 5 x 2,000)")
print("pointers ints constexprs  JITFunction.run  compiled.run  stream query + compiled.run")
for n_ptr, n_int, n_const in [(12, 8, 0), (12, 8, 8), (12, 8, 20)]:
    k = make(n_ptr, n_int, n_const)
    args, kw = toy_args(n_ptr, n_int, n_const)
    ck = k[(1,)](*args, **kw)  # compiles; returns the CompiledKernel
    jit = min(timeit.repeat(lambda: k[(4, 8)](*args, **kw), number=2000, repeat=5)) / 2000
    stream = driver.active.get_current_stream(driver.active.get_current_device())

    def direct():
        ck.run(4, 8, 1, stream, ck.function, ck.packed_metadata, None, None, None, *args)

    def direct_stream():
        s = driver.active.get_current_stream(driver.active.get_current_device())
        ck.run(4, 8, 1, s, ck.function, ck.packed_metadata, None, None, None, *args)
    d = min(timeit.repeat(direct, number=2000, repeat=5)) / 2000
    ds = min(timeit.repeat(direct_stream, number=2000, repeat=5)) / 2000
    print(f"{n_ptr:8d} {n_int:4d} {n_const:10d}  {jit * 1e6:15.2f}  {d * 1e6:12.2f}  {ds * 1e6:12.2f}")
