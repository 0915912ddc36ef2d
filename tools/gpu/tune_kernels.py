#!/usr/bin/env python3
"""Diagnosis and tuning of the Triton kernels on a CUDA GPU (a device aid, not a test).

    python3 tools/gpu/tune_kernels.py rot d64 decode [--json OUT]

rot:    rotate_halves alone (the in-kernel rotation) against torch for every tile shape the kernels
        use, with the first-row extraction the store kernel does, under several num_warps.
d64:    the head_dim-64 store and chunk-attention checks of debug_kernels.py under several
        num_warps for the store and prefill kernels.
decode: split-KV decode time over (num_warps, num_stages, programs per SM) on the benchmark shapes
        (Qwen2.5-7B: 28/4 heads, head_dim 128), with registers/spills/shared memory per variant.
"""

import argparse
import itertools
import json
import math
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "tests")
sys.path.insert(0, "tools/gpu")

from s4kv import format as fmt  # noqa: E402
from s4kv import kernels  # noqa: E402
from s4kv.kernels import decode as dec  # noqa: E402
from s4kv.kernels.quant import rotate_halves  # noqa: E402


@triton.jit
def _rot_probe(x_ptr, r_ptr, y_ptr, row0_ptr, M: tl.constexpr, HALF: tl.constexpr, OP: tl.constexpr,
               INV: tl.constexpr, TRANSPOSE: tl.constexpr):
    m = tl.arange(0, M)
    c = tl.arange(0, HALF)
    x_lo = tl.load(x_ptr + m[:, None] * 2 * HALF + c[None, :])
    x_hi = tl.load(x_ptr + m[:, None] * 2 * HALF + HALF + c[None, :])
    y_lo, y_hi = rotate_halves(x_lo, x_hi, r_ptr, HALF, OP, INV, TRANSPOSE)
    tl.store(y_ptr + m[:, None] * 2 * HALF + c[None, :], y_lo)
    tl.store(y_ptr + m[:, None] * 2 * HALF + HALF + c[None, :], y_hi)
    first = m[:, None] == 0
    tl.store(row0_ptr + c, tl.sum(tl.where(first, y_lo, 0.0), axis=0))
    tl.store(row0_ptr + HALF + c, tl.sum(tl.where(first, y_hi, 0.0), axis=0))


def probe_rotation(results):
    tl_of = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
    # the shapes the kernels use: store (128 rows), prefill (64, and its fp32 back-rotation), decode (16)
    uses = ((128, None, False), (64, None, False), (64, torch.float32, True), (16, None, False),
            (16, torch.float32, True))
    for d, (m, op, transpose), dtype, nw in itertools.product((64, 128), uses, (torch.bfloat16, torch.float16),
                                                           (2, 4, 8)):
        if op is not None:
            if dtype == torch.float16:
                continue
            dtype = op
        g = torch.Generator(device="cuda").manual_seed(d + m)
        x = torch.randn(m, d, device="cuda", generator=g).to(dtype)
        r = fmt.rotation_pm1(d, device="cuda", dtype=dtype).contiguous()
        y = torch.empty(m, d, device="cuda", dtype=torch.float32)
        row0 = torch.empty(d, device="cuda", dtype=torch.float32)
        try:
            _rot_probe[(1,)](x, r, y, row0, M=m, HALF=d // 2, OP=tl_of[dtype], INV=1 / math.sqrt(d),
                             TRANSPOSE=transpose, num_warps=nw)
            torch.cuda.synchronize()
        except Exception as e:  # a compile failure is an answer too
            print(f"rot d={d} m={m} {dtype} T={transpose} nw={nw}: {type(e).__name__} {e}"[:300], flush=True)
            continue
        rf = r.float() / math.sqrt(d)
        ref = x.float() @ (rf.T if transpose else rf)
        err = (y - ref).abs().max().item() / ref.abs().max().item()
        err0 = (row0 - ref[0]).abs().max().item() / ref.abs().max().item()
        bad = err > 2e-2 or err0 > 2e-2
        results.append(dict(probe="rot", d=d, m=m, dtype=str(dtype), transpose=transpose, num_warps=nw,
                            err=err, err_row0=err0))
        print(f"rot d={d} m={m:3d} {str(dtype):15s} T={transpose!s:5} nw={nw}: rel err {err:.1e} row0 {err0:.1e}"
              f"{'   <-- WRONG' if bad else ''}", flush=True)


def probe_d64(results):
    import debug_kernels as dk

    for store_nw, prefill_nw in ((None, None), (2, None), (8, None), (None, 2), (None, 8), (2, 2), (8, 8)):
        kernels.LAUNCH.clear()
        if store_nw:
            kernels.LAUNCH[("store", 64)] = dict(num_warps=store_nw)
        if prefill_nw:
            kernels.LAUNCH[("prefill", 64)] = dict(num_warps=prefill_nw)
        print(f"=== d=64 store num_warps={store_nw or 'default'} prefill num_warps={prefill_nw or 'default'}",
              flush=True)
        try:
            for dtype in (torch.bfloat16, torch.float16):
                dk.check_store(64, dtype)
            for hq, hkv in ((9, 3), (7, 1)):
                print(f"steps hq={hq} hkv={hkv} d=64", flush=True)
                dk.check_steps(hq, hkv, 64, torch.bfloat16)
        except Exception as e:
            print(f"failed: {type(e).__name__}: {e}"[:400], flush=True)
    kernels.LAUNCH.clear()


def kernel_facts(fn) -> list[str]:
    out = []
    try:
        for cache in fn.device_caches.values():
            for k in cache[0].values():
                out.append(f"regs {k.n_regs} spills {k.n_spills} shared {k.metadata.shared}")
    except Exception as e:  # Triton internals differ between versions
        out.append(f"(no kernel facts: {type(e).__name__})")
    return out


def sweep_decode(results):
    from s4kv.kernels.bench import bench_case, copy_bandwidth

    copy = copy_bandwidth()
    print(f"copy bandwidth {copy / 1e12:.2f} TB/s", flush=True)
    shapes = ((1024, 64), (8192, 32), (32768, 8))
    best = {}
    for nw, ns in itertools.product((4, 8), (1, 2, 3)):
        kernels.LAUNCH[("decode", 128)] = dict(num_warps=nw, num_stages=ns)
        for pps in (2, 4, 8):
            dec.PROGRAMS_PER_SM, dec.MAX_SPLITS = pps, 64
            for ctx, b in shapes:
                try:
                    r = bench_case(ctx, b)
                except Exception as e:
                    print(f"nw={nw} ns={ns} pps={pps} {ctx}x{b}: {type(e).__name__} {e}"[:300], flush=True)
                    continue
                frac = r["bandwidth"] / copy
                r.update(probe="decode", num_warps=nw, num_stages=ns, programs_per_sm=pps, fraction_of_copy=frac)
                results.append(r)
                print(f"nw={nw} ns={ns} pps={pps:2d} {ctx:6d}x{b:<3d} splits {r['splits']:3d}: "
                      f"{r['ms'] * 1e3:7.1f} us {frac:6.1%}", flush=True)
                if (ctx, b) not in best or r["ms"] < best[(ctx, b)]["ms"]:
                    best[(ctx, b)] = r
        print("   ", "; ".join(kernel_facts(dec._decode_kernel)[-1:]), flush=True)
    for (ctx, b), r in best.items():
        print(f"best {ctx}x{b}: nw={r['num_warps']} ns={r['num_stages']} pps={r['programs_per_sm']} "
              f"{r['ms'] * 1e3:.1f} us {r['fraction_of_copy']:.1%}", flush=True)
    kernels.LAUNCH.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probes", nargs="+", choices=["rot", "d64", "decode"])
    ap.add_argument("--json")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, flush=True)
    results = []
    for p in args.probes:
        {"rot": probe_rotation, "d64": probe_d64, "decode": sweep_decode}[p](results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
