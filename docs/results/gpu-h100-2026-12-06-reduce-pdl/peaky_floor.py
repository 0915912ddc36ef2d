"""CPU: how far bf16 roundings move the peaky-query test's reference (test_peaky_queries_against_reference's
inputs: 7 query heads, 1 kv head, head_dim 64, 643 tokens, the query at position 642, queries 1x/8x/16x).
  q-round: the reference with the rotated, scaled query rounded once to bf16 (the kernel rounds
           q * s, the query times each page's key scales, once per page: a lower bound of its error)
  FA-like: bf16 q and k as given (exact), fp32 scores, P rounded to bf16 for P @ V, against fp32 dense
  int4:    s4kv.reference.kivi_attention (fp32) against fp32 dense attention
Run: PYTHONPATH=.:tests python docs/results/gpu-h100-2026-12-06-reduce-pdl/peaky_floor.py"""
import torch
from paged_harness import BS, Engine

from s4kv import format as fmt
from s4kv.reference import dense_attention, kivi_attention

LOG2E = 1.4426950408889634


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


for q_scale in (1, 8, 16):
    e = Engine(7, 1, 64, torch.bfloat16, num_blocks=16)
    e.add("a", 5 * BS + 3)
    e.reqs["a"]["q"] *= q_scale
    r, ctx, sc = e.reqs["a"], 5 * BS + 2, 64 ** -0.5
    q, k, v = r["q"][ctx:ctx + 1], r["k"][:ctx + 1], r["v"][:ctx + 1]
    ref = kivi_attention(q, k, v, sc, q_start=ctx)
    c = sc * LOG2E
    q16 = fmt.unrotate((fmt.rotate(q) * c).to(torch.bfloat16).float() / c)
    dense = dense_attention(q, k, v, sc, q_start=ctx)
    kf, vf = k.float().repeat_interleave(7, 1), v.float().repeat_interleave(7, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) * sc
    p = torch.exp(s - s.amax(-1, keepdim=True))
    fa = torch.einsum("hqk,khd->qhd", p.bfloat16().float(), vf) / p.sum(-1).permute(1, 0)[..., None]
    print(f"{q_scale:>2}x  q-round {rel(kivi_attention(q16, k, v, sc, q_start=ctx), ref):.2e}  "
          f"FA-like {rel(fa, dense):.2e}  int4 {rel(ref, dense):.2e}")
