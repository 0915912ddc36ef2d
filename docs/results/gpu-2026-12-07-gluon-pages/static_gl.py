"""Compile the Gluon page-loop probe for sm80/sm90 without a GPU; count its page loop's SASS."""
import collections, os, re, subprocess, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
HERE = os.path.dirname(os.path.abspath(__file__)); ROOT = os.path.abspath(os.path.join(HERE, "../../..")); sys.path[:0] = [ROOT, os.path.join(ROOT, "tools"), HERE]

from s4kv import format as fmt
from s4kv.kernels.code_ptx import UNPACK_PTX, CODE_BIAS
from s4kv.kernels.decode import _FP16_QUERY_BOUND
import kernel_static as ks

subprocess.run(["bash", os.path.join(HERE, "make-modules.sh")], check=True)  # the later versions from their diffs

def compile_probe(cc, d=128, group=7, hkv=4, dtype="bf16", mod=None, maxnreg=None):
    L = {k: int(v) for k, v in (i.split("=") for i in fmt.kernel_layout(d).split(";"))}
    gdt = {"bf16": "bf16", "fp16": "fp16"}[dtype]
    import triton.experimental.gluon.language as gl
    DT = gl.bfloat16 if dtype == "bf16" else gl.float16
    cx = dict(GROUP=group, HKV=hkv, BS=L["block_size"], UNIT=L["unit"], HALF=d // 2, V_CODES=L["v_codes"],
              V_SCALE=L["v_scale"], K_SCALE=L["k_scale"], K_MIN=L["k_min"], FIRST_KEY=L["first_key"],
              FIRST_KEY_DTYPE=DT, DOT=DT, CODE_BIAS=CODE_BIAS[gdt], ASM_LO=UNPACK_PTX[(gdt, "lo")],
              ASM_HI=UNPACK_PTX[(gdt, "hi")], QBOUND=float(_FP16_QUERY_BOUND.value))
    if hasattr(mod, "UNPACK_LO"):  # fp16 operands for every model dtype, the module's own unpack
        cx.update(DOT=gl.float16, CODE_BIAS=mod.CODE_BIAS, ASM_LO=mod.UNPACK_LO, ASM_HI=mod.UNPACK_HI)
    cx.update(getattr(mod, "EXTRA_CONSTEXPRS", {}))
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
    modname = sys.argv[1] if len(sys.argv) > 1 else "gpages"
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
