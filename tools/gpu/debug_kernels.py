#!/usr/bin/env python3
"""Stage-by-stage check of the Triton kernels on a GPU (debugging aid).

    python3 tools/gpu/debug_kernels.py [head_dim ...]

For each head_dim: store_blocks vs s4kv.format (NaN count, max error in code steps), then one
chunk step and one decode step through triton_ops vs the reference, synchronizing after each
launch so an illegal memory access points at its kernel.
"""

import sys

import torch

sys.path.insert(0, "tests")

from paged_harness import Engine  # noqa: E402

from s4kv import format as fmt  # noqa: E402
from s4kv.backend import triton_ops  # noqa: E402
from s4kv.kernels.batch import S4KVMetadata, plan_launch  # noqa: E402
from s4kv.kernels.store import quantize_rows, store_blocks  # noqa: E402


def check_store(d, dtype):
    g = torch.Generator().manual_seed(0)
    hkv, n, bs = 3, 2 * 128 + 5, 128
    k = torch.randn(n, hkv, d, generator=g).to(dtype)
    v = torch.randn(n, hkv, d, generator=g).to(dtype)
    regions = torch.zeros(8, hkv, fmt.PageLayout(d).region_bytes, dtype=torch.uint8, device="cuda")

    def i32(x, dev="cuda"):
        return torch.tensor(x, dtype=torch.int32, device=dev)

    md = S4KVMetadata(1, n, n, n, i32([0, n]), i32([n]), i32([[5, 2, 7, 0, 0, 0]]),
                      i32([0, n], "cpu"), i32([n], "cpu"))
    plan_launch(md, hkv, num_sms=132)
    store_blocks(quantize_rows(k.cuda(), v.cuda()), regions, md, md.max_new_blocks, dtype)
    torch.cuda.synchronize()
    got = regions[[5, 2]].cpu()
    exp = fmt.encode_blocks(k[:256].reshape(2, bs, hkv, d).transpose(1, 2), v[:256].reshape(2, bs, hkv, d).transpose(1, 2))
    kq, vq = fmt.decode_blocks(got, d, dtype)
    ke, ve = fmt.decode_blocks(exp, d, dtype)
    lay = fmt.PageLayout(d)
    print(f"  store d={d} {dtype}: nan k {torch.isnan(kq).sum().item()} v {torch.isnan(vq).sum().item()}; "
          f"max |dk| {(kq - ke).abs().max().item():.4f} |dv| {(vq - ve).abs().max().item():.4f}; "
          f"differing code bytes {(got[..., :lay.v_scale] != exp[..., :lay.v_scale]).float().mean().item():.4f}; "
          f"scale bytes differ {(got[..., lay.v_scale:] != exp[..., lay.v_scale:]).float().mean().item():.4f}",
          flush=True)


def check_steps(hq, hkv, d, dtype):
    e = Engine(hq, hkv, d, dtype, ops=triton_ops, device="cuda")
    e.add("a", 700)
    e.add("b", 300)
    for sched in ([("a", 200), ("b", 77)], [("b", 1), ("a", 150)], [("b", 1), ("a", 1)]):
        res = e.step(sched)
        torch.cuda.synchronize()
        for name, (out, ctx) in res.items():
            ref = e.reference(name, (out, ctx))
            nan_rows = torch.isnan(out).any(-1).any(-1).nonzero().flatten().tolist()
            err = ((torch.nan_to_num(out) - ref).norm() / ref.norm()).item()
            print(f"  {sched}: {name} ctx {ctx}: rel err {err:.2e}, NaN rows {nan_rows[:8]}"
                  f"{'...' if len(nan_rows) > 8 else ''} of {out.shape[0]}", flush=True)


def main():
    dims = [int(a) for a in sys.argv[1:]] or [64, 128]
    for d in dims:
        for dtype in (torch.bfloat16, torch.float16):
            check_store(d, dtype)
        for hq, hkv in ((9, 3), (4, 4), (7, 1), (8, 2)):
            print(f"steps hq={hq} hkv={hkv} d={d}", flush=True)
            check_steps(hq, hkv, d, torch.bfloat16)


if __name__ == "__main__":
    main()
