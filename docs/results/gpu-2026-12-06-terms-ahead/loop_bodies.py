"""Every loop body with tensor-core instructions in the decode kernel's SASS (tools/kernel_static.py's
compile, no GPU), with its instructions, barriers, shuffles and local loads/stores per warp: the
TERMS_AHEAD kernel holds two page loops (its own, and the shipped one for the splits that fall back),
where kernel_static's table reports one. static-ta.txt was written by it:

    PYTHONPATH=.:tools python3 docs/results/gpu-2026-12-06-terms-ahead/loop_bodies.py '{"TERMS_AHEAD": true}' 90 qwen2.5-7b bf16
"""
import json
import sys

import kernel_static as ks
from triton.runtime import driver

opts = json.loads(sys.argv[1])
cc = int(sys.argv[2]) if len(sys.argv) > 2 else 90
shape = sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-7b"
dtype = sys.argv[4] if len(sys.argv) > 4 else "bf16"


def count(counter, *prefixes) -> int:
    return sum(n for op, n in counter.items() if op.startswith(prefixes))


driver.set_active(ks.CompileOnlyDriver(cc))
ks.triton_compiler.max_shared_mem.cache_clear()
kern, _ = ks.compiled_decode(cc, shape, dtype, opts)
print("regs/spill", *ks.resource_usage(kern.kernel))
for lo, hi, c in ks.loop_bodies(ks._sass(kern)):
    if ks._mma(c):
        print(f"{lo:#x}-{hi:#x} instr {sum(c.values())} mma {ks._mma(c)} bar {count(c, 'BAR')} "
              f"shfl {count(c, 'SHFL')} local {count(c, 'LDL', 'STL')} i2f {ks._int_to_float(c)}")
