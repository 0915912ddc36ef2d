"""Register caps for a probe (sm90, bf16 model): cap, registers, spill bytes, loop instructions per warp and page, local-memory ops in the loop. python caps_gl.py MODULE"""
import sys, importlib
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from static_gl import compile_probe, ks
mod = importlib.import_module(sys.argv[1])
for mr in (128, 144, 160):
    ck = compile_probe(90, dtype="bf16", mod=mod, maxnreg=mr)
    regs, spill = ks.resource_usage(ck.asm["cubin"])
    body = ks.page_loop(ks._cuobjdump(ck.asm["cubin"], "-sass"))
    print(mr, regs, spill, sum(body[2].values()) if body else None, body[2].get("STL", 0) + body[2].get("LDL", 0) if body else None)
