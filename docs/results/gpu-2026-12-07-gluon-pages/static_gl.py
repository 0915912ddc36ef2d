"""Compile the Gluon page-loop probe for sm80/sm90 without a GPU; count its page loop's SASS."""
import os, subprocess, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
HERE = os.path.dirname(os.path.abspath(__file__)); ROOT = os.path.abspath(os.path.join(HERE, "../../..")); sys.path[:0] = [ROOT, os.path.join(ROOT, "tools"), HERE]

import kernel_static as ks

subprocess.run(["bash", os.path.join(HERE, "make-modules.sh")], check=True)  # the later versions from their diffs

def compile_probe(cc, d=128, group=7, hkv=4, dtype="bf16", mod=None, maxnreg=None):
    """The probe module's kernel compiled for sm`cc` (Qwen2.5-7B shape by default), with the
    constexprs it launches with; a bf16 or fp16 model, operands of the model's dtype."""
    model = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    cx = mod.launch_constexprs(d, model, model, group, hkv)
    fn = mod._page_kernel
    names = fn.arg_names
    ptrs = {"qr_ptr": "*fp32", "cache_ptr": "*u8", "seq_lens_ptr": "*i32", "block_table_ptr": "*i32",
            "part_o_ptr": "*fp32", "part_ml_ptr": "*fp32"}
    sig = {n: ("constexpr" if n in cx else ptrs.get(n, "i32")) for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in ptrs or n in ("stride_cb", "stride_ch", "stride_bt")}
    opts = {"num_warps": int(mod.W)}
    if maxnreg: opts["maxnreg"] = maxnreg
    ck = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", cc, 32), options=opts)
    return ck

if __name__ == "__main__":
    import importlib
    modname = sys.argv[1]
    mod = importlib.import_module(modname)
    for cc in (80, 90):
        for dt in ("bf16", "fp16"):
            ck = compile_probe(cc, dtype=dt, mod=mod)
            cubin = ck.asm["cubin"]
            regs, spill = ks.resource_usage(cubin)
            sass = ks._cuobjdump(cubin, "-sass")
            body = ks.page_loop(sass)
            n = sum(body[2].values()) if body else None
            bars = body[2].get("BAR.SYNC.DEFER_BLOCKING", 0) + body[2].get("BAR.SYNC", 0) if body else None
            print(f"sm{cc} {dt}: regs {regs} spill {spill} smem {ck.metadata.shared} loop/warp {n} bars {bars}")
            if cc == 90 and dt == "bf16":
                open(f"/tmp/{modname}.sass", "w").write(sass)
                if body: print("   ", body[2].most_common(30))
