"""The probe's page loop by source line (sm90): python lines_gl.py MODULE [bf16|fp16] [N]"""
import sys, importlib
from static_gl import compile_probe, ks
modname = sys.argv[1]; dt = sys.argv[2] if len(sys.argv) > 2 else "bf16"
mod = importlib.import_module(modname)
ck = compile_probe(90, dtype=dt, mod=mod)
cubin = ck.asm["cubin"]
sass = ks._cuobjdump(cubin, "-sass")
body = ks.page_loop(sass)
for ln in ks.loop_lines(cubin, body[0], body[1])[:int(sys.argv[3]) if len(sys.argv) > 3 else 40]:
    print(ln)
