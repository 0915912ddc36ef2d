"""Triton 3.6 dispatch split: the binder (argument binding and specialization) against the cache key
(compute_cache_key), on toy_launch_cost.py's toy kernels; run from the repository root:
    PYTHONPATH=. python docs/results/cpu-2026-12-05-launch-host-time/dispatch_parts.py
"""
import sys
import timeit

sys.path.insert(0, 'docs/results/cpu-2026-12-05-launch-host-time')
import torch  # noqa: E402
from toy_launch_cost import make  # noqa: E402 - sets the compile-only driver
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import compute_cache_key
t = torch.zeros(64)
for n_ptr, n_int, n_const in [(12, 8, 0), (12, 8, 20)]:
    k = make(n_ptr, n_int, n_const)
    args = [t] * n_ptr + [17 + 16 * i for i in range(n_int)]
    kw = {f"C{i}": 128 for i in range(n_const)}
    k[(1,)](*args, **kw)
    dev = driver.active.get_current_device()
    kernel_cache, kernel_key_cache, target, backend, binder = k.device_caches[dev]
    kw2 = dict(kw, debug=False, instrumentation_mode="")
    b = min(timeit.repeat(lambda: binder(*args, **kw2), number=2000, repeat=5)) / 2000
    ba, spec, opts = binder(*args, **kw2)
    c = min(timeit.repeat(lambda: compute_cache_key(kernel_key_cache, spec, opts), number=2000, repeat=5)) / 2000
    h = min(timeit.repeat(lambda: hash(tuple(spec)), number=2000, repeat=5)) / 2000
    print(n_ptr, n_int, n_const, f"binder {b*1e6:.2f} key {c*1e6:.2f} tuple-hash {h*1e6:.2f}", spec[:3], spec[-2:])
